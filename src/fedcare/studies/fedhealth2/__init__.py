"""The FedHealth 2 / FedAP study: personalized FL with BatchNorm on activity and X-ray data."""

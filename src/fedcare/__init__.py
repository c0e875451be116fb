"""fedcare: personalized, privacy-preserving federated learning on healthcare data."""

__version__ = "0.1.0"

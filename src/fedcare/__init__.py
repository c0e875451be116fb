"""fedcare: personalized, privacy-preserving federated learning on healthcare data."""

__version__ = "0.2.0"

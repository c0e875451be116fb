"""The federated pain-recognition study (Tobis thesis, PFDL paper)."""

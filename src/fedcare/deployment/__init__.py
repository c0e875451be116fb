"""Registered studies across sites on Flower: the Flower App that `flwr run` starts
(`app.py`: a ServerApp running any study's experiment, the ClientApp at each site) and the
`fedcare flower ...` commands (`cli.py`). It sits above both the studies and the Flower
runtime, which know nothing of each other."""

"""The studies: one folder each (config, protocol, data wiring, report, sites), registered by
name in `registry.py`; `base.py` says what a study provides, `run.py` runs any of them."""

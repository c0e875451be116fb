"""The tiny surgical experiment that tests in several folders run, on a synthetic Cholec80 +
HeiChole copy made with `generate_surgical(root, **SYNTH)`."""

from __future__ import annotations

from pathlib import Path

from fedcare.studies.surgical.config import SurgicalExperiment

CLIENTS = ["HEI1", "HEI2", "CHO1", "CHO2", "CHO3"]
ALL = ["lot", "fedavg", "fedprox", "feddyn", "feddg", "fedrep", "fedavg-uniform", "cent"]
SYNTH = {"seed": 5, "videos": 2, "heichole_videos": 4, "seconds": 8, "width": 96, "height": 64}


def tiny(root: Path, cache: Path, methods=ALL, top: dict | None = None, **train) -> SurgicalExperiment:
    return SurgicalExperiment.model_validate({
        "study": "surgical", "seeds": [1], "methods": list(methods),
        "data": {"root": str(root), "cache": str(cache), "frame_size": [96, 64]},
        "model": {"width": 0.125, "hidden": 16},
        "train": {"rounds": 2, "batch_size": 8, "feddg_bank": 4, **train},
        "runtime": {"threads": 1}, **(top or {}),
    })

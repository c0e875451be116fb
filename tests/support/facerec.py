"""The small face-verification experiment that tests in several folders run (on a synthetic
CelebA copy they generate: `generate_celeba(root, seed=0, identities=16, images_per_identity=12)`)."""

from __future__ import annotations

from pathlib import Path

from fedcare.studies.facerec.config import FacerecExperiment


def small_config(root: Path, cache: Path, methods=("fedavg-local", "hfmaml"), **train) -> FacerecExperiment:
    return FacerecExperiment.model_validate({
        "study": "facerec", "seeds": [0], "methods": list(methods),
        "data": {"root": str(root), "partition": "equal", "identities": 12, "clients": 4, "image_size": 16,
                 "detector_scale_factor": 1.2, "detector_min_size": 64, "cache": str(cache)},
        "protocol": {"unseen": [4], "paths": 2, "genuine_pairs": 50, "impostor_pairs": 50},
        "train": {"rounds": 2, "batch_size": 4, "local_steps": 2, "tune_steps": 2, **train},
        "runtime": {"threads": 1},
    })

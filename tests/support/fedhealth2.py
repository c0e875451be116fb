"""The small FedHealth 2 experiment that tests in several folders run (every method, three
rounds on synthetic PAMAP2 or X-rays)."""

from __future__ import annotations

from fedcare.studies.fedhealth2.config import FedHealth2Experiment

METHODS = ["local", "fedavg", "fedprox", "fedbn", "fedper", "fedap", "d-fedap", "f-fedap"]


def small_config(dataset: str = "pamap2", **protocol) -> FedHealth2Experiment:
    synthetic = {"subjects": 3, "seconds_per_activity": 6.0} if dataset == "pamap2" else {"scale": 0.01, "image_size": 64}
    return FedHealth2Experiment.model_validate({
        "study": "fedhealth2", "seeds": [1], "methods": METHODS,
        "data": {"dataset": dataset, "synthetic": synthetic},
        "protocol": {"clients": 4, "dirichlet_alpha": 1.0, **protocol},
        "train": {"rounds": 3, "pretrain_rounds": 1, "hidden": 16},
        "options": {"ffedap_warmup_rounds": 2}, "runtime": {"threads": 2},
    })


def tiny_config(**extra) -> FedHealth2Experiment:
    """FedAvg for three rounds on three synthetic PAMAP2 clients, every client evaluated each round
    (a run of a few seconds); `extra`: more top-level tables (e.g. tracking={...})."""
    return FedHealth2Experiment.model_validate({
        "study": "fedhealth2", "seeds": [1], "methods": ["fedavg"],
        "data": {"dataset": "pamap2", "synthetic": {"subjects": 3, "seconds_per_activity": 4.0}},
        "protocol": {"clients": 3, "dirichlet_alpha": 1.0}, "train": {"rounds": 3, "pretrain_rounds": 1, "hidden": 8},
        "runtime": {"threads": 1}, **extra,
    })

"""Small pain experiments that tests in several folders run: `small_config`, the golden run's
(tests/studies/pain/test_study.py), and `flower_config`, run through Flower's `run_simulation`
with the in-process backend (`on_flower`)."""

from __future__ import annotations

from pathlib import Path


from fedcare.studies.pain.config import PainExperiment

from support.flower_inprocess import run_experiment_on_flower

SUBJECTS = [42, 43, 80, 92]  # small_config's synthetic cohort; subject 42 pretrains
FLOWER_SUBJECTS = [43, 80, 92]  # flower_config's clients, one site each; subject 42 pretrains


def small_config(root: Path | None = None, **train) -> PainExperiment:
    data = {"root": str(root)} if root else {"synthetic": {"subjects": SUBJECTS, "frame_scale": 0.02, "image_size": 32}}
    return PainExperiment.model_validate({
        "title": "small", "seeds": [5], "methods": ["BC", "F(C)", "FP(C)", "FL(N)"], "data": data,
        "protocol": {"pretrain_subjects": [42], "subjects": [43, 80, 92], "image_size": 16,
                     "balance_per_class": 12, "last_session": 3},
        "train": {"lr": 0.01, "local_epochs": 1, "rounds": 2, "patience": 1, "pretrain_rounds": 2,
                  "pretrain_patience": 1, **train},
        "pfdl": {"finetune_epochs": 1}, "runtime": {"threads": 2},
    })


def flower_config(root: Path, **deployment) -> PainExperiment:
    return PainExperiment.model_validate({
        "title": "flower", "seeds": [5], "methods": ["RANDOM", "F(N)", "FP(N)", "FL(N)"], "data": {"root": str(root)},
        "protocol": {"pretrain_subjects": [42], "subjects": FLOWER_SUBJECTS, "image_size": 16, "balance_per_class": 12,
                     "last_session": 2},
        "train": {"lr": 0.01, "local_epochs": 1, "rounds": 2, "patience": 1},
        "pfdl": {"finetune_epochs": 1}, "runtime": {"threads": 2}, "deployment": deployment,
    })


def on_flower(config: PainExperiment, out: Path) -> None:
    """`config` on Flower's Simulation Engine (in-process backend), a site per subject."""
    run_experiment_on_flower(config, out, len(FLOWER_SUBJECTS), "flower.toml")

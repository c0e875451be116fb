"""The small pain experiment that the Flower deployment (tests/deployment/test_cli_deployed_pain.py)
and Flower's Simulation Engine with Ray (tests/deployment/test_cli_simulation_engine.py) run, and
its records."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fedcare.studies.pain.config import PainExperiment

SITES = {"site-43": 43, "site-80": 80, "site-92": 92}


def config(root: Path, methods: list[str], **deployment) -> PainExperiment:
    return PainExperiment.model_validate({
        "title": "deployed", "seeds": [5], "methods": methods, "data": {"root": str(root)},
        "protocol": {"pretrain_subjects": [42], "subjects": sorted(SITES.values()), "image_size": 16,
                     "balance_per_class": 12, "last_session": 2},
        "train": {"lr": 0.01, "local_epochs": 1, "rounds": 2, "patience": 2},
        "pfdl": {"finetune_epochs": 1}, "runtime": {"threads": 1},
        "deployment": {"sites": SITES, **deployment},
    })


def records(run_dir: Path, *types: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] in types]


def another_site_s_data(cohort: Path, out: Path, subject: int) -> Path:
    """A copy of `cohort` holding only `subject`'s folders: the data of another site than the one
    that reads it (whose subject is not there)."""
    prefix = f"{subject:03d}-"

    def others(folder, names):
        return [n for n in names if n[:3].isdigit() and n[3:4] == "-" and not n.startswith(prefix)]

    shutil.copytree(cohort, out, ignore=others)
    return out

"""What tests in several folders share: helpers and constants, never a test and never a fixture
(a fixture lives in the conftest.py of the folder whose tests use it). pyproject.toml puts
tests/ on sys.path, so a test writes `from support.tiny import tiny_model`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: configs/, docs/, benchmarks/, src/


def records(run_dir: Path, *types: str) -> list[dict]:
    """The records of a run's metrics.jsonl whose type is one of `types`, in order."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] in types]


def tree_hash(root: Path) -> str:
    """One hash of every file under `root`, its path and bytes: equal for a generator's two runs
    on one seed."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    return h.hexdigest()

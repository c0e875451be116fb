"""Experiment files written for the config tests: a minimal pain experiment and a minimal
FedHealth 2 one, each completed by the test with the tables it checks."""

from __future__ import annotations

from pathlib import Path

MINIMAL = """
methods = ["F(C)"]
[data]
root = "unbc"
"""

FEDHEALTH2 = """
study = "fedhealth2"
methods = ["fedprox"]
[data]
dataset = "pamap2"
[data.synthetic]
"""


def write_exp(tmp_path: Path, text: str) -> Path:
    """`text` as tmp_path/exp.toml (the name the errors are checked to give)."""
    path = tmp_path / "exp.toml"
    path.write_text(text)
    return path

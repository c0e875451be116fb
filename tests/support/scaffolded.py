"""A study from outside fedcare for tests: the package `fedcare new study` writes, registered as
a test chooses (FEDCARE_STUDIES, or an installed distribution's entry point)."""

from __future__ import annotations

import sys
from pathlib import Path


def scaffold(folder: Path, name: str = "sepsis") -> Path:
    """Write study `name`'s package into `folder/name` (`fedcare new study`); returns its
    source folder (what goes on sys.path: it holds the package `fedcare_<name>`)."""
    from fedcare.studies.scaffold import new_study

    return new_study(name, Path(folder) / name) / "src"


def forget(package: str) -> None:
    """Drop an imported package and its modules, so the next test imports it afresh."""
    for module in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[module]


def experiment(path: Path, name: str = "sepsis", methods: tuple[str, ...] = ("fedavg",), rounds: int = 2,
               extra: str = "") -> Path:
    """A small experiment file of the scaffolded study on its synthetic data (3 sites)."""
    path.write_text(f'study = "{name}"\nseeds = [0]\nmethods = {list(methods)!r}\n'.replace("'", '"')
                    + f"[train]\nrounds = {rounds}\nlr = 0.1\n[data.synthetic]\nsites = 3\npatients = 40\n"
                    + "[runtime]\nthreads = 1\n" + extra)
    return path

"""A study planted by a test: the toy study (tests/support/toy_study) with whatever the test writes into
a package `planted`, registered as "toy" (FEDCARE_STUDIES), and a toy experiment for it."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from fedcare.studies import registry

TESTS = Path(__file__).parents[1]  # tests/: `support.toy_study` imports from there


def plant(tmp_path: Path, monkeypatch, source: str) -> Path:
    """Write `source` as the package `planted` (its STUDY is the study "toy") and register it in
    this process (and, through the environment, in the processes it starts); returns its file."""
    folder = tmp_path / "planted-study"
    (folder / "planted").mkdir(parents=True)
    path = folder / "planted" / "__init__.py"
    path.write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", f"{folder}:{TESTS}")
    monkeypatch.setenv(registry.ENVIRONMENT, "toy=planted")
    for name in [m for m in sys.modules if m == "planted" or m.startswith("planted.")]:
        del sys.modules[name]  # an earlier test's
    return path


def toy_experiment(path: Path, methods: str = '["fedavg", "local"]', data: str = "") -> Path:
    """A toy experiment file of two rounds (`data`: lines of its [data] table)."""
    path.write_text(f'study = "toy"\ntitle = "toy"\nseeds = [3]\nmethods = {methods}\nrounds = 2\n[data]\n{data}')
    return path

"""Fixtures of the studies' tests: the toy study registered from outside fedcare."""

from __future__ import annotations

import shutil
import sys

import pytest

from fedcare.studies import registry

from support.toy import TOY_STUDY


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy study as a package `fedcare_toy` in a folder of its own, registered as "toy"."""
    folder = tmp_path / "elsewhere"
    shutil.copytree(TOY_STUDY, folder / "fedcare_toy",
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv(registry.ENVIRONMENT, "toy=fedcare_toy")
    yield folder
    for name in [m for m in sys.modules if m == "fedcare_toy" or m.startswith("fedcare_toy.")]:
        del sys.modules[name]

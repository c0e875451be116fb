"""The tests run on the installed package (`pip install ./examples/lung`: its entry point
registers the study) or, in fedcare's own test suite, on this folder's source: the package
goes on sys.path and each test registers the study with FEDCARE_STUDIES (for that test only)."""

import importlib.util
import sys
from pathlib import Path

import pytest

INSTALLED = importlib.util.find_spec("fedcare_lung") is not None
if not INSTALLED:
    sys.path.insert(0, str(Path(__file__).parents[1] / "src"))


@pytest.fixture(autouse=True)
def _registered(monkeypatch):
    if not INSTALLED:
        monkeypatch.setenv("FEDCARE_STUDIES", "lung=fedcare_lung")

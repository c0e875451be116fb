"""The tests run on the installed package (`pip install ./examples/lung`: its entry point
registers the study) or, in fedcare's own test suite, on this folder's source: the package is
imported from there (the folder is on sys.path only while it is imported, so nothing else in
the suite sees it) and each test registers the study with FEDCARE_STUDIES for that test only."""

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

INSTALLED = importlib.util.find_spec("fedcare_lung") is not None
if not INSTALLED:
    source = str(Path(__file__).parents[1] / "src")
    sys.path.insert(0, source)
    try:
        importlib.import_module("fedcare_lung")  # its modules are found through the package from now on
    finally:
        sys.path.remove(source)


@pytest.fixture(autouse=True)
def _registered(monkeypatch):
    if not INSTALLED:
        monkeypatch.setenv("FEDCARE_STUDIES", "lung=fedcare_lung")

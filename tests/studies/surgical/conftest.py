"""Fixtures of the surgical study's tests: a synthetic Cholec80 + HeiChole copy
(support.surgical.SYNTH) and a frame cache for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedcare.data.surgical.synthetic import generate_surgical

from support.surgical import SYNTH


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("surgical") / "copies"
    generate_surgical(root, **SYNTH)
    return root


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("frames")

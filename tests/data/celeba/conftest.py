"""Fixtures of the CelebA tests: a face cache and one cropping pass over the synthetic copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedcare.data.celeba.faces import FaceCropper
from fedcare.data.celeba.reader import load_celeba


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def cropped(celeba_copy, cache):
    """One cropping pass over the synthetic copy, shared (the detector is the slow part)."""
    ds = load_celeba(celeba_copy[0])
    cropper = FaceCropper(cache_dir=cache)
    return ds, cropper, cropper.faces(ds)

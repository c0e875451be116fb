"""Fixtures of the data tests: the synthetic CelebA copy is read by the CelebA tests
(celeba/) and by the face detector's (test_haar.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedcare.data.celeba.synthetic import generate_celeba


@pytest.fixture(scope="module")
def celeba_copy(tmp_path_factory) -> tuple[Path, dict]:
    """A synthetic CelebA copy of 8 identities, 4 images each, and what its generator returned."""
    root = tmp_path_factory.mktemp("celeba") / "synth"
    return root, generate_celeba(root, seed=0, identities=8, images_per_identity=4, workers=1)

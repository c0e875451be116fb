"""Fixtures of the face-verification study's tests: one torch thread for every test here, and a
synthetic CelebA copy for those that run the study."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedcare.data.celeba.synthetic import generate_celeba


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread (as the runs' runtime.threads): on 2 shared cores two threads spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def celeba(tmp_path_factory) -> Path:
    """16 identities of 12 images: support.facerec.small_config's 12 identities and 4 clients."""
    root = tmp_path_factory.mktemp("facerec") / "celeba"
    generate_celeba(root, seed=0, identities=16, images_per_identity=12, workers=1)
    return root

import pytest
import torch


@pytest.fixture(autouse=True)
def _two_threads():
    # The suite runs on 2-core CI machines; a fixed thread count also keeps float sums stable.
    torch.set_num_threads(2)

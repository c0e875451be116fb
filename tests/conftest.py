from pathlib import Path

import pytest

import fedcare  # noqa: F401  (first: it sets OpenMP's passive wait policy before torch loads)
import torch


TESTS = Path(__file__).parent

# pytest-xdist (`-n 2 --dist loadfile`, pyproject.toml) hands test files to its workers in
# collection order. The Flower deployment tests (pain; surgical and face; the chaos test) take
# minutes each, most of it waiting on Flower's polls and heartbeats: collected first, they start
# early and the rest of the suite follows on whichever worker is free. Paths below tests/.
FIRST_FILES = ("deployment/test_cli_deployed_pain.py", "deployment/test_cli_deployed_studies.py",
               "deployment/test_cli_deployed_chaos.py")


def pytest_collection_modifyitems(items):
    def first(item) -> bool:
        return item.path.is_relative_to(TESTS) and item.path.relative_to(TESTS).as_posix() in FIRST_FILES

    items.sort(key=lambda item: not first(item))  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def _two_threads():
    # The suite runs on 2-core CI machines; a fixed thread count also keeps float sums stable.
    torch.set_num_threads(2)


@pytest.fixture(scope="session")
def pain_cohort(tmp_path_factory) -> Path:
    """Synthetic UNBC-McMaster subjects 42 (pretraining), 43, 80 and 92. Shared by the Flower
    pain tests (tests/deployment/: deployed, Ray, in-process), which only read it."""
    from fedcare.data.unbc.synthetic import generate_pain_cohort

    root = tmp_path_factory.mktemp("data") / "unbc"
    generate_pain_cohort(root, subjects=[42, 43, 80, 92], frame_scale=0.02, image_size=32)
    return root


@pytest.fixture(scope="session")
def pain_reference(pain_cohort, tmp_path_factory) -> list[dict]:
    """The in-process simulator's round and client_eval records of `config(pain_cohort,
    ["F(N)", "FP(N)"])`, which the real deployment and Flower's Simulation Engine (Ray) must
    both equal bit for bit: simulated once for both. (`deployment.sites` only names the sites:
    the Ray run, which has none, gives the same records.)"""
    from support.pain_sites import config, records

    from fedcare.studies.run import run_study

    run = run_study(config(pain_cohort, ["F(N)", "FP(N)"]), tmp_path_factory.mktemp("pain-reference") / "run")
    expected = records(run, "client_eval", "round")
    assert {r["method"] for r in expected} == {"F(N)", "FP(N)"} and len(expected) > 10
    return expected


def pytest_configure(config):
    # The README's test command runs `.venv/bin/python -m pytest` in an environment that is not
    # activated: the tests that start `flwr` themselves find it as fedcare's own commands do.
    from fedcare.deployment.cli import put_flower_commands_on_path

    put_flower_commands_on_path()

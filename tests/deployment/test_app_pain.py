"""The pain study's config-driven Flower apps (what `flwr run` starts) give the in-process
simulator's numbers, through Flower's `run_simulation` with the in-process backend; bad
configuration fails before any training, naming the problem."""

import json
from pathlib import Path

import pytest

from fedcare.config import ConfigError, to_toml
from fedcare.deployment.app import open_site
from fedcare.runtime.sites import SiteError
from fedcare.studies.run import run_study

from support import records
from support.pain import FLOWER_SUBJECTS, flower_config, on_flower


@pytest.fixture(scope="module")
def cohort(pain_cohort) -> Path:
    return pain_cohort  # subjects 42 (pretraining) and FLOWER_SUBJECTS: conftest.py


@pytest.mark.timeout(300)
def test_pain_study_on_flower_equals_the_simulator(cohort, tmp_path):
    config = flower_config(cohort)
    on_flower(config, tmp_path / "flower")
    local = run_study(config, tmp_path / "local")
    assert (tmp_path / "flower" / "report.html").is_file(), "the Flower run did not finish its run directory"
    got, expected = (records(run, "client_eval", "round") for run in (tmp_path / "flower", local))
    assert len(expected) > 20 and {r["method"] for r in expected} == {"RANDOM", "F(N)", "FP(N)", "FL(N)"}
    assert got == expected  # every round's losses and every test metric, to the last bit
    info = json.loads((tmp_path / "flower" / "run.json").read_text())
    assert info["runtime"] == "flower" and info["missed"] == [] and sorted(info["sites"].values()) == FLOWER_SUBJECTS
    # each site said how it computes, with the experiment's threads (torch's sums depend on them)
    assert {site: facts["threads"] for site, facts in info["site_compute"].items()} == {str(s): 2 for s in FLOWER_SUBJECTS}
    assert not any("do not compute alike" in n for n in info["notes"])  # every site in this process


def test_pooled_methods_are_refused_before_any_site_is_contacted(cohort):
    config = flower_config(cohort).model_copy(update={"methods": ["F(C)", "FL(N)"]})
    from fedcare.deployment.app import check_experiment

    with pytest.raises(ConfigError, match=r"F\(C\).*pooled data"):
        check_experiment(config, "x.toml")


class _Context:
    def __init__(self, node_config, run_config=None):
        self.node_config, self.run_config = node_config, run_config or {}


def test_a_site_fails_at_its_greeting_naming_the_problem(cohort, tmp_path):
    config = flower_config(cohort, sites={"hospital-a": 43, "hospital-b": 80})
    greeting = {"experiment": to_toml(config), "name": "x.toml"}
    site, _ = open_site(greeting, _Context({"site": "hospital-a", "data-dir": str(cohort)}))
    assert site.client == 43 and site.summary()["sessions"] >= 3
    with pytest.raises(SiteError, match="'hospital-z' is not in the experiment's .deployment.sites."):
        open_site(greeting, _Context({"site": "hospital-z", "data-dir": str(cohort)}))
    with pytest.raises(SiteError, match=f"data directory {tmp_path / 'nowhere'} does not exist"):
        open_site(greeting, _Context({"site": "hospital-b", "data-dir": str(tmp_path / "nowhere")}))
    with pytest.raises(SiteError, match="methods"):
        open_site({"experiment": "methods = ['Q']\n", "name": "bad.toml"}, _Context({"site": "43"}))

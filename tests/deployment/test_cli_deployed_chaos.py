"""The chaos test, small (issue 37; the full size, with every kind of fault: benchmarks/chaos.py):
six SuperNodes on 127.0.0.1 with TLS and signed site identity run FedBN with `late_sites =
"wait"` while a seeded schedule hits the sites: one SIGKILLed mid-fit and restarted, one whose
reply is corrupted on the wire (support/chaos.py). The run's metrics.jsonl equals an undisturbed
run's byte for byte (Flower's Simulation Engine in process: the same ServerApp and ClientApp),
and the faults injected and survived are printed. The coordinator's faults are left to their
own tests, to keep the suite short: the SuperLink's database locked (HTTP 500s, a half-failed
push: tests/runtime/flower/test_grid.py) and the ServerApp and SuperLink SIGKILLed and resumed
(tests/deployment/test_cli_deployed_resume.py); benchmarks/chaos.py runs them all together."""

import pytest

from fedcare.data.pamap2.synthetic import generate_pamap2

from support import chaos
from support.flower_inprocess import run_experiment_on_flower

pytestmark = pytest.mark.deploy  # real SuperLink and SuperNodes

SEED = 37


@pytest.mark.timeout(1200)
def test_faults_of_every_kind_leave_the_records_of_an_undisturbed_run(tmp_path):
    site_ids = chaos.sites(6)
    data = tmp_path / "PAMAP2_Dataset"
    generate_pamap2(data, seed=2, subjects=sorted(site_ids.values()), seconds_per_activity=2.0)
    experiment = chaos.config(data, site_ids, rounds=3)
    run_experiment_on_flower(experiment, tmp_path / "calm", len(site_ids), "chaos.toml")  # undisturbed
    plan = chaos.schedule(SEED, list(site_ids), experiment.train.rounds, coordinator=False)
    print("chaos schedule:", plan.describe())
    outcome = chaos.run(tmp_path / "deploy", data, experiment, plan)
    print("chaos outcome:", outcome.describe())
    assert {k: n for k, n in outcome.injected.items() if n} == {"site killed mid-fit": 1, "reply corrupted": 1}
    # byte for byte, but for the sites' names: the Simulation Engine's sites are named by their client id
    deployed = (outcome.out / "metrics.jsonl").read_bytes().replace(b'"site-1', b'"1')
    assert deployed == (tmp_path / "calm" / "metrics.jsonl").read_bytes()
    info = outcome.run_info
    assert info["status"] == "finished" and info["complete"] is True and info["missed"] == []
    assert outcome.site_restarts >= 1
    assert info["rejoined"] and all(r["reason"].startswith("gone") for r in info["rejoined"])  # the killed site
    assert len(info["asked_again"]) == 1  # the corrupted reply

"""Kill the coordinator of a real Flower deployment (SuperLink, its ServerApp and the
researcher's `fedcare flower run`: SIGKILL) in the middle of a run, restart the SuperLink, and
continue with `fedcare flower run --resume`: the run ends with the metrics.jsonl of an
uninterrupted run across sites, byte for byte. Three SuperNodes with TLS and authentication,
FedBN on a tiny synthetic PAMAP2 (its BatchNorm layers stay at the sites)."""

import json
from pathlib import Path

import pytest

from fedcare.config import to_toml
from fedcare.data.pamap2.synthetic import generate_pamap2
from fedcare.studies.fedhealth2.config import FedHealth2Experiment

from support.deployment import Deployment, wait_for
from support.flower_inprocess import run_experiment_on_flower

pytestmark = pytest.mark.deploy  # real SuperLink and SuperNodes


SITES = {"site-101": 101, "site-102": 102, "site-103": 103}


def small_config(root: Path) -> FedHealth2Experiment:
    return FedHealth2Experiment.model_validate({
        "study": "fedhealth2", "seeds": [1], "methods": ["fedbn"], "data": {"dataset": "pamap2", "root": str(root)},
        "protocol": {"split": "natural", "pretrain": "federated", "subjects": sorted(SITES.values())},
        "train": {"rounds": 3, "pretrain_rounds": 1, "hidden": 8}, "runtime": {"threads": 1},
        "deployment": {"sites": SITES, "round_timeout": 120},
    })


def _rounds_done(partial: Path) -> int:
    path = partial / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return sum(1 for line in lines if '"type": "round"' in line and '"phase": "train"' in line)


@pytest.mark.timeout(1200)
def test_a_killed_coordinator_resumes_to_the_uninterrupted_records(tmp_path):
    data = tmp_path / "PAMAP2_Dataset"
    generate_pamap2(data, seed=2, subjects=3, seconds_per_activity=4.0)
    config = small_config(data)
    run_experiment_on_flower(config, tmp_path / "whole", len(SITES), "fh2.toml")  # the uninterrupted run across sites
    d = Deployment(tmp_path / "deploy", list(SITES))
    try:
        d.start_superlink()
        d.register(*SITES)
        for site in SITES:
            d.start_site(site, data)
        path = d.root / "fh2.toml"
        path.write_text(to_toml(config))
        out = d.root / "runs" / "fh2"
        partial = out.with_name("fh2.partial")
        d.start("researcher", ["flower", "run", str(path), "--federation", "test", "--out", str(out),
                               "--site-keys", str(d.certs / "keys")])
        wait_for(lambda: _rounds_done(partial) >= 2 or d.processes["researcher"].poll() is not None, 600,
                  "round 2 never finished")
        d.kill_coordinator()
        assert not out.exists() and (partial / "checkpoint.pt").is_file()
        d.start_superlink()  # same database: the sites' keys stay registered; the SuperNodes reconnect
        for site in SITES:
            if d.processes[site].poll() is not None:
                d.start_site(site, data)
        resumed = d.fedcare(["flower", "run", "--resume", str(partial), "--federation", "test",
                             "--site-keys", str(d.certs / "keys")], timeout=900)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr + d.log("superlink")
    finally:
        d.close()
    # byte for byte, but for the sites' names: the Simulation Engine's sites are named by their client id
    deployed = (out / "metrics.jsonl").read_bytes().replace(b'"site-1', b'"1')
    assert deployed == (tmp_path / "whole" / "metrics.jsonl").read_bytes()
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "finished" and info["complete"] is True
    log = (out / "run.log").read_text()
    assert "resumed" in log and "stopped" not in log  # killed: the ServerApp had no chance to say it stopped

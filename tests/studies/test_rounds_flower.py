"""The generic rounds protocol across sites: the scaffolded study on Flower's Simulation Engine
(in process) gives the simulator's records bit for bit, the single-site models included (one
site trains, every site scores)."""

import json
import shutil

import pytest
from support.flower_inprocess import run_experiment_on_flower
from support.scaffolded import experiment, forget, scaffold

from fedcare.studies import registry
from fedcare.studies.load import load_config
from fedcare.studies.run import run_study


@pytest.mark.timeout(300)
def test_the_rounds_protocol_on_flowers_simulation_engine_equals_the_simulator(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(scaffold(tmp_path / "pkg")))
    monkeypatch.setenv(registry.ENVIRONMENT, "sepsis=fedcare_sepsis")
    try:
        config = load_config(experiment(tmp_path / "s.toml", methods=("fedavg", "local", "single-site"), rounds=2))
        local = run_study(config, tmp_path / "local")
        shutil.copytree(local / "synthetic-data", tmp_path / "data")  # each site reads its own <site>.csv there
        sites = config.model_copy(update={"data": config.data.model_copy(update={"root": tmp_path / "data",
                                                                                 "synthetic": None})})
        run_experiment_on_flower(sites, tmp_path / "flower", 3, "s.toml")
    finally:
        forget("fedcare_sepsis")

    def records(run):
        return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                if r["type"] in ("client_eval", "round")]

    got, expected = records(tmp_path / "flower"), records(local)
    assert len(expected) == 2 * (2 + 3 * 3) + 3 * (2 + 3) and got == expected
    assert json.loads((tmp_path / "flower" / "run.json").read_text())["sites"] == {s: s for s in
                                                                                   ("site1", "site2", "site3")}

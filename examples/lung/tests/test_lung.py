"""The lung study: its patients and clients as the docs say, each site's preprocessing from
its own training split only, and a short run through fedcare's commands (run, report, demo)
with every client evaluated and the single-site models beside the methods."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fedcare.api import DataError, data_ref, load_config, run_study

from fedcare_lung import STUDY
from fedcare_lung.data import OTHER, LungSite, lifelines_copy, read_patients, sites

SMALL = ["seeds=[0]", "train.rounds=3", "protocol.evaluate_every=1"]


def test_one_year_status_and_clients_of_the_lifelines_copy():
    patients = read_patients(lifelines_copy(), 365)
    # 228 patients: 42 censored before day 365 and 1 without an institution are left out
    assert len(patients.y) == 185 and patients.left_out == {"censored before day 365": 42, "no institution": 1}
    assert int(patients.y.sum()) == 120  # died within a year
    found, _ = sites(lifelines_copy(), 365, 10, "merge", 0.5)
    sizes = {c: len(s.y) for c, s in found.items()}
    assert sizes == {"inst1": 30, "inst11": 12, "inst12": 20, "inst13": 15, "inst16": 15, "inst21": 11,
                     "inst22": 15, "inst3": 17, "inst6": 12, OTHER: 38}
    dropped, _ = sites(lifelines_copy(), 365, 10, "drop", 0.5)
    assert OTHER not in dropped and set(dropped) == set(sizes) - {OTHER}


def test_a_sites_split_is_stratified_disjoint_and_preprocessed_from_its_training_rows_only():
    site = sites(lifelines_copy(), 365, 10, "merge", 0.5)[0]["inst1"]
    train, test = site.data(data_ref("train", 0)), site.data(data_ref("test", 0))
    assert len(train) + len(test) == 30 and 0 < test.y.sum() < len(test)  # both labels in the test half
    assert torch.allclose(train.x.mean(0), torch.zeros(7), atol=1e-5)  # standardised on the training rows
    assert not torch.isnan(train.x).any() and not torch.isnan(test.x).any()  # missing values filled
    # a test patient's values never reach the training data
    changed = LungSite("inst1", site.x.copy(), site.y, 0.5)
    test_rows = np.setdiff1d(np.arange(30), np.flatnonzero(np.isin(np.arange(30), _train_rows(site, 0))))
    changed.x[test_rows] = 1e6
    assert torch.equal(changed.data(data_ref("train", 0)).x, train.x)
    assert not torch.equal(site.data(data_ref("train", 1)).x, train.x)  # another seed, another split


def _train_rows(site: LungSite, seed: int) -> np.ndarray:
    from fedcare.api import numpy_rng

    from fedcare_lung.data import split

    return split(site.y, site.test_fraction, numpy_rng(seed, "split", site.client))[0]


def test_a_short_run_evaluates_every_client_and_reports_the_best_single_site_model(tmp_path):
    from fedcare.cli import app

    demo = STUDY.demo_config()
    assert demo is not None and demo.name == "demo.toml"  # shipped in the package: no override
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["demo", "lung", "--out", str(out), *[a for s in SMALL for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["type"] == "client_eval"]
    clients = {"inst1", "inst11", "inst12", "inst13", "inst16", "inst21", "inst22", "inst3", "inst6", OTHER}
    for method in ("local", "fedavg", "fedprox", "centralized"):
        assert {r["client"] for r in evals if r["method"] == method and r["round"] == 3} == clients, method
    assert {(r["model"], r["client"]) for r in evals if r["method"] == "single-site"} == {
        (m, c) for m in clients for c in clients}
    summary = (out / "tables" / "summary.md").read_text()
    assert "worst client" in summary and "| single-site (" in summary  # the best single-site model's row
    info = json.loads((out / "run.json").read_text())
    assert info["metric"] == "roc_auc" and info["synthetic"] is False and info["study_source"]["module"] == "fedcare_lung"
    assert "| fedavg |" in result.output and "| single-site (" in result.output
    (out / "report.html").unlink()
    assert CliRunner().invoke(app, ["report", str(out)]).exit_code == 0 and (out / "report.html").is_file()


def test_an_interrupted_run_resumes_to_the_records_of_an_uninterrupted_one(tmp_path, monkeypatch):
    from fedcare.api import Federation, resume_study

    config = load_config(STUDY.demo_config(), [*SMALL, 'methods=["fedavg", "single-site"]'])
    whole = run_study(config, tmp_path / "whole")
    real, calls = Federation.run_round, []

    def stop_at_the_eighth_round(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 8:  # fedavg's 3 rounds and the first site's model done, the second site's midway
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Federation, "run_round", stop_at_the_eighth_round)
    with pytest.raises(KeyboardInterrupt):
        run_study(config, tmp_path / "cut")
    monkeypatch.setattr(Federation, "run_round", real)
    resumed = resume_study(tmp_path / "cut.partial")
    assert (resumed / "metrics.jsonl").read_bytes() == (whole / "metrics.jsonl").read_bytes()


def test_same_config_same_numbers(tmp_path):
    config = load_config(STUDY.demo_config(), [*SMALL, 'methods=["fedavg"]'])
    first, second = run_study(config, tmp_path / "a"), run_study(config, tmp_path / "b")
    assert (first / "metrics.jsonl").read_bytes() == (second / "metrics.jsonl").read_bytes()


def test_a_data_file_that_is_not_the_layout_is_one_line_naming_it(tmp_path):
    (tmp_path / "lung.csv").write_text("inst,time,status,age\n1,100,1,60\n")
    with pytest.raises(DataError, match=r"lung.csv: no patients, or no column sex"):
        read_patients(tmp_path / "lung.csv", 365)
    (tmp_path / "lung.csv").write_text(Path(lifelines_copy()).read_text().replace("74,1,", "old,1,", 1))
    with pytest.raises(DataError, match=r"lung.csv: line 2: age = 'old' is not a number"):
        read_patients(tmp_path / "lung.csv", 365)

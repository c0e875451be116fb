"""The FedHealth 2 study end to end on small synthetic data."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.studies.run import run_study

from support.lineage import check_lineage
from support.fedhealth2 import METHODS, small_config


def evals(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["type"] == "client_eval"]


@pytest.fixture(scope="module")
def pamap2_run(tmp_path_factory) -> Path:
    return run_study(small_config(), tmp_path_factory.mktemp("fh2") / "run")


def test_every_client_is_evaluated_every_round_for_every_method(pamap2_run):
    records = evals(pamap2_run)
    clients = sorted({r["client"] for r in records})
    assert len(clients) == 4
    for method in METHODS:
        rounds = sorted({(r["round"], r["client"]) for r in records if r["method"] == method})
        assert rounds == [(rnd, c) for rnd in range(4) for c in clients]
    assert all(0 <= r["accuracy"] <= 1 for r in records)
    run = json.loads((pamap2_run / "run.json").read_text())
    assert run["study"] == "fedhealth2" and run["synthetic"] is True
    assert "SYNTHETIC" in (pamap2_run / "report.html").read_text()
    assert (pamap2_run / "tables" / "per_client_accuracy.csv").is_file()


def test_the_runs_lineage_holds_every_round_of_every_method(pamap2_run):
    verified = check_lineage(pamap2_run)
    aggregates = [r for r in verified.records if r["type"] == "aggregate"]
    trained = {r["algorithm"] for r in aggregates}
    assert set(METHODS) <= trained and "pretrain" in trained  # the pooled pretraining is a federation too
    fedap = [r for r in aggregates if r["algorithm"] == "fedap"]
    assert [r["round"] for r in fedap] == [1, 2, 3] and fedap[1]["parent"] == fedap[0]["digest"]
    assert all(len(r["clients"]) == 4 for r in aggregates if r["algorithm"] in METHODS)


def _by(records, method):
    return {(r["round"], r["client"]): r["accuracy"] for r in records if r["method"] == method}


def test_fedap_variants_start_from_the_pretrained_model_and_f_fedap_is_fedbn_until_its_setup(pamap2_run):
    records = evals(pamap2_run)
    fedap, d_fedap, fedbn, f_fedap, fedavg = (_by(records, m) for m in ("fedap", "d-fedap", "fedbn", "f-fedap", "fedavg"))
    round0 = lambda acc: {c: a for (rnd, c), a in acc.items() if rnd == 0}  # noqa: E731
    assert round0(fedap) == round0(d_fedap)  # the same pretrained model before any round
    assert round0(fedap) != round0(fedavg)  # ... which is not the random init the others start from
    warm = {k: v for k, v in fedbn.items() if k[0] <= 2}
    assert warm == {k: v for k, v in f_fedap.items() if k[0] <= 2}  # 2 warm-up rounds of FedBN
    assert any(fedbn[k] != f_fedap[k] for k in fedbn if k[0] == 3)  # then its own weights


def test_same_config_same_numbers(pamap2_run, tmp_path):
    again = run_study(small_config(), tmp_path / "again")
    assert evals(again) == evals(pamap2_run)


def test_xray_study_runs_on_synthetic_xrays(tmp_path):
    config = small_config("xray").model_copy(update={"methods": ["fedbn", "fedap"]})
    run = run_study(config, tmp_path / "x")
    records = evals(run)
    assert {r["method"] for r in records} == {"fedbn", "fedap"} and len(records) == 2 * 4 * 4
    assert json.loads((run / "run.json").read_text())["dataset"] == "xray"


def test_demo_fedhealth2_from_the_cli(tmp_path):
    out = tmp_path / "demo"
    shrink = ["train.rounds=1", "train.pretrain_rounds=1", "data.synthetic.subjects=2",
              "data.synthetic.seconds_per_activity=5.0", "protocol.clients=3", "methods=['fedbn','fedap']"]
    result = CliRunner().invoke(app, ["demo", "fedhealth2", "--out", str(out), *[a for s in shrink for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    assert "| fedap |" in result.output and f"Report: {out.resolve() / 'report.html'}" in result.output


def test_unknown_demo_is_refused():
    result = CliRunner().invoke(app, ["demo", "nope"])
    assert result.exit_code == 2 and "unknown demo" in result.output


@pytest.mark.parametrize("dataset", ["pamap2", "xray"])
def test_missing_data_fails_naming_the_path_and_leaves_no_run(tmp_path, dataset):
    config = tmp_path / "exp.toml"
    config.write_text(f'study = "fedhealth2"\nmethods = ["fedbn"]\n[data]\ndataset = "{dataset}"\nroot = "nowhere"\n')
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(config), "--out", str(out)])
    assert result.exit_code == 2 and "nowhere" in result.output and "Traceback" not in result.output
    assert not out.exists() and not (tmp_path / "run.partial").exists()

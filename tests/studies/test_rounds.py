"""The generic rounds protocol (studies/rounds.py) on the study `fedcare new study` writes: round
0 and every `evaluate_every`-th round evaluated at every client, each site's model trained
alone and scored everywhere, a pooled method on one participant, resumable units; and the
deployment check that refuses pooling."""

import json

import pytest
from support.scaffolded import experiment, forget, scaffold

from fedcare.config import ConfigError
from fedcare.runtime.refs import SeededSplit, Split
from fedcare.studies import registry
from fedcare.studies.checks import check_methods
from fedcare.studies.load import load_config
from fedcare.studies.rounds import data_ref, parse_data_ref
from fedcare.studies.run import run_study

SITES = ["site1", "site2", "site3"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Every method of the scaffolded study, 3 rounds, evaluated after rounds 2 and 3."""
    folder = tmp_path_factory.mktemp("rounds")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(scaffold(folder / "pkg")))
        mp.setenv(registry.ENVIRONMENT, "sepsis=fedcare_sepsis")
        config = load_config(experiment(folder / "s.toml", methods=("local", "fedavg", "single-site", "centralized"),
                                        rounds=3, extra="[protocol]\nevaluate_every = 2\n"))
        out = run_study(config, folder / "run")
        study = registry.study_for(config)
        yield out, study
    forget("fedcare_sepsis")


def records(out, kind):
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["type"] == kind]


def test_each_method_is_evaluated_at_every_client_at_round_0_every_kth_round_and_the_last(run):
    out, _ = run
    evals = records(out, "client_eval")
    for method in ("local", "fedavg", "centralized"):
        points = sorted({(r["round"], r["client"]) for r in evals if r["method"] == method})
        assert points == [(rnd, c) for rnd in (0, 2, 3) for c in SITES], method
    assert all("roc_auc" in r and r["n"] == 12 for r in evals)  # 30% of 40 patients, at the client


def test_single_site_models_train_at_one_site_and_are_scored_at_every_client(run):
    out, _ = run
    rounds = [r for r in records(out, "round") if r["method"] == "single-site"]
    assert [(r["model"], r["round"], r["clients"], r["n_train"]) for r in rounds] == [
        (s, rnd, 1, 28) for s in SITES for rnd in (1, 2, 3)]
    evals = [r for r in records(out, "client_eval") if r["method"] == "single-site"]
    assert sorted((r["model"], r["client"], r["round"]) for r in evals) == [(m, c, 3) for m in SITES for c in SITES]


def test_a_pooled_method_trains_one_participant_on_every_clients_training_data(run):
    out, study = run
    pooled = [r for r in records(out, "round") if r["method"] == "centralized"]
    assert [(r["clients"], r["n_train"]) for r in pooled] == [(1, 3 * 28)] * 3
    fedavg = [r for r in records(out, "round") if r["method"] == "fedavg"]
    assert [(r["clients"], r["n_train"]) for r in fedavg] == [(3, 3 * 28)] * 3
    with pytest.raises(ConfigError, match=r"x.toml: methods \['centralized'\] pool every client's data"):
        study.check_deployable("x.toml")


def test_run_json_counts_the_units_and_names_the_metric(run):
    out, _ = run
    info = json.loads((out / "run.json").read_text())
    assert info["progress"] == {"units_done": 3 * 3 + 3, "units_total": 3 * 3 + 3}  # 3 methods x 3 rounds, 3 sites
    assert info["metric"] == "roc_auc" and info["rounds"] == 3 and info["clients"] == 3


def test_the_report_leads_with_the_metric_and_shows_the_best_single_site_model(run):
    out, _ = run
    summary = (out / "tables" / "summary.md").read_text()
    assert "| Method | ROC AUC (mean ± SD across clients) |" in summary
    rows = [line.split("|")[1].strip() for line in summary.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[1:4] == ["local", "fedavg", "centralized"] and rows[4].startswith("single-site (site")
    single = (out / "tables" / "single_site.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in single[1:]] == [f"single-site ({s})" for s in SITES]
    page = (out / "report.html").read_text()
    assert "Against a site alone." in page and "best of 3 site models" in page
    assert {"summary", "single_site", "per_client", "metrics"} <= {p.stem for p in (out / "tables").glob("*.csv")}


def test_a_data_reference_is_a_split_and_a_seed():
    assert data_ref("test", 7) == SeededSplit("test", 7) and parse_data_ref(data_ref("train", -1)) == ("train", -1)
    for bad in (SeededSplit("valid", 3), Split("test"), "test/3"):
        with pytest.raises(ValueError, match="unknown data reference"):
            parse_data_ref(bad)


def test_a_method_the_catalogue_lacks_stops_the_run_before_anything_trains(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from fedcare.cli import app
    from fedcare.runtime.federation import Federation

    src = scaffold(tmp_path / "pkg", "lacking")
    config = src / "fedcare_lacking" / "config.py"
    config.write_text(config.read_text().replace('"centralized")', '"centralized", "fedfoo")'))
    monkeypatch.syspath_prepend(str(src))
    monkeypatch.setenv(registry.ENVIRONMENT, "lacking=fedcare_lacking")
    trained = []
    monkeypatch.setattr(Federation, "run_round", lambda *a, **k: trained.append(1))
    path = experiment(tmp_path / "x.toml", "lacking", methods=("fedavg", "fedfoo"))
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "run")])
    forget("fedcare_lacking")
    # the study's own code allows a method it cannot build: a bug (its traceback), before anything trains
    assert result.exit_code == 1 and "unknown algorithm 'fedfoo'" in result.output, result.output
    assert trained == [] and not (tmp_path / "run").exists() and not (tmp_path / "run.partial").exists()


def test_single_site_models_with_secure_aggregation_are_refused_before_any_data(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(scaffold(tmp_path / "pkg")))
    monkeypatch.setenv(registry.ENVIRONMENT, "sepsis=fedcare_sepsis")
    try:
        path = experiment(tmp_path / "x.toml", methods=("fedavg", "single-site"),
                          extra="[privacy.secure_aggregation]\nthreshold = 0.75\n")
        with pytest.raises(ConfigError, match="'single-site' trains at one site a round, and "
                                              "privacy.secure_aggregation needs at least 2"):
            check_methods(registry.study_for(load_config(path)))
        check_methods(registry.study_for(load_config(path, ['methods=["fedavg"]'])))  # FedAvg under it is fine
    finally:
        forget("fedcare_sepsis")

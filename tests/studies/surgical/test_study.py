"""The surgical tool-presence study (Markert 2022) end to end on a tiny generated Cholec80 +
HeiChole copy: the loss's positive weights, ALTV and EGOV on a run's records, a whole run and its
report, resume, Flower's Simulation Engine, the demo and bad input."""

from __future__ import annotations

import csv
import html
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import f1_score, precision_recall_fscore_support
from torch.nn import functional as F
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.config import ConfigError, to_toml
from fedcare.studies.load import load_config
from fedcare.data.surgical.clients import TOOLS, FrameCache, thesis_clients
from fedcare.deployment.app import check_experiment
from fedcare.runtime.federation import Federation
from fedcare.studies import run as run_module
from fedcare.studies.registry import study_for
from fedcare.studies.run import resume_study, run_study
from fedcare.studies.surgical.aggregate import ALTV, EGOV, index_run, pooled_score, views_at
from fedcare.studies.surgical.data import TEST, TRAIN
from fedcare.studies.surgical.config import (SurgicalData, SurgicalExperiment, SurgicalModel, SurgicalSynthetic,
                                             SurgicalTrain)
from fedcare.studies.surgical.models import build_model

from support import ROOT, records, tree_hash
from support.flower_inprocess import run_experiment_on_flower
from support.interrupt import interrupted_at_round
from support.lineage import check_lineage
from support.surgical import ALL, CLIENTS, tiny


@pytest.fixture(scope="module")
def reference(synth, cache, tmp_path_factory) -> Path:
    return run_study(tiny(synth, cache), tmp_path_factory.mktemp("runs") / "reference")


# -- the loss ------------------------------------------------------------------------------------
def neg_over_pos(labels: np.ndarray) -> np.ndarray:
    pos = labels.sum(0).astype(np.float64)
    return np.where(pos > 0, (len(labels) - pos) / np.maximum(pos, 1), 1.0)


def test_pos_weight_is_per_client_by_default_and_pooled_with_global(synth, cache, tmp_path):
    by_hand = thesis_clients(synth / "cholec80", synth / "heichole", cache=FrameCache(cache, size=(96, 64)), seed=0)
    study = study_for(tiny(synth, cache))
    runtime = study.local_runtime(tmp_path, None)
    task = study.algorithm("fedavg").client.settings.task
    for c in CLIENTS:
        data = runtime.sites[c].data(TRAIN)
        expected = torch.tensor(neg_over_pos(by_hand.labels(c, "train")), dtype=torch.float32)
        assert torch.allclose(task._weight(data), expected, rtol=1e-6)
        y = data.y[:5]
        x = torch.randn(len(y), 6)
        loss = task.batch_loss(data)(lambda inputs: inputs, x, y)  # the model's outputs are x
        assert torch.allclose(loss, F.binary_cross_entropy_with_logits(x, y, pos_weight=expected))
    assert not torch.allclose(task._weight(runtime.sites["HEI1"].data(TRAIN)),
                              task._weight(runtime.sites["CHO2"].data(TRAIN)))  # per client indeed

    pooled = np.concatenate([by_hand.labels(c, "train") for c in CLIENTS])
    study = study_for(tiny(synth, cache, pos_weight="global"))
    runtime = study.local_runtime(tmp_path, None)
    expected = torch.tensor(neg_over_pos(pooled), dtype=torch.float32)
    assert torch.allclose(study.global_pos_weight, expected, rtol=1e-6)
    task = study.algorithm("feddyn").client.settings.task
    assert all(torch.equal(task._weight(runtime.sites[c].data(TRAIN)), study.global_pos_weight) for c in CLIENTS)


# -- ALTV and EGOV --------------------------------------------------------------------------
def test_summed_counts_are_the_f1_on_the_union_of_the_test_sets(synth, cache, tmp_path):
    study = study_for(tiny(synth, cache))
    runtime = study.local_runtime(tmp_path, None)
    torch.manual_seed(4)
    model = study.new_model()
    with torch.no_grad():
        model.classifier[6].bias.copy_(torch.tensor([0.5, -0.5, 0.2, -0.2, 0.0, 0.1]))  # some tools on, some off
    federation = Federation(model, study.algorithm("lot"), 1)
    per_client = federation.evaluate({c: runtime.sites[c].data(TEST) for c in CLIENTS}, "multilabel")
    pooled = pooled_score(per_client.values(), TOOLS)
    x = torch.cat([runtime.sites[c].data(TEST).x[:] for c in CLIENTS]).float() / 255
    y = torch.cat([runtime.sites[c].data(TEST).y for c in CLIENTS]).numpy()
    with torch.no_grad():
        pred = (torch.sigmoid(model.eval()(x)) >= 0.5).numpy()
    expected = f1_score(y, pred, average=None, zero_division=0)
    assert [pooled.tools[t] for t in TOOLS] == pytest.approx(list(expected))
    assert pooled.macro == pytest.approx(float(np.mean(expected)))
    # each client's own record: scikit-learn's per-tool precision, recall and F1 on its test frames
    start = 0
    for c in CLIENTS:
        n = len(runtime.sites[c].data(TEST).y)
        p, r, f, _ = precision_recall_fscore_support(y[start:start + n], pred[start:start + n], average=None,
                                                     labels=list(range(len(TOOLS))), zero_division=0)
        start += n
        for what, values in (("precision", p), ("recall", r), ("f1", f)):
            assert [per_client[c][f"{what}/{t}"] for t in TOOLS] == pytest.approx(list(values)), (c, what)
        assert per_client[c]["macro_f1"] == pytest.approx(float(np.mean(f)))


def test_lot_altv_is_the_pooled_score_and_egov_the_own_test_score(reference):
    run = index_run(records(reference, "clients", "client_eval", "round", "client_update"))
    views = views_at(run, "lot", 1, 2)
    for k in CLIENTS:
        mine = [r for r in records(reference, "client_eval") if r["method"] == "lot" and r["round"] == 2 and r["model"] == k]
        assert sorted(r["client"] for r in mine) == sorted(CLIENTS)  # k's model scored at every client
        counts = {what: {t: sum(r[f"{what}/{t}"] for r in mine) for t in TOOLS} for what in ("tp", "fp", "fn")}
        f1 = [2 * counts["tp"][t] / max(1, 2 * counts["tp"][t] + counts["fp"][t] + counts["fn"][t]) for t in TOOLS]
        assert views[ALTV].local[k].macro == pytest.approx(float(np.mean(f1)))
        own = next(r for r in mine if r["client"] == k)
        assert views[EGOV].local[k].macro == pytest.approx(own["macro_f1"])
    table = (reference / "tables" / "table_a1.csv").read_text().splitlines()
    altv = next(line for line in table if line.startswith("ALTV,")).split(",")
    assert [float(v) for v in altv[1:6]] == pytest.approx([views[ALTV].local[k].macro for k in CLIENTS])


# -- a whole run --------------------------------------------------------------------------------
def test_every_method_and_client_is_scored_every_round_and_the_report_has_the_thesis_tables(reference):
    evals = records(reference, "client_eval")
    for method in ALL:
        for rnd in (1, 2):
            got = [r for r in evals if r["method"] == method and r["round"] == rnd]
            if method == "lot":
                assert sorted((r["model"], r["client"]) for r in got) == sorted(itertools.product(CLIENTS, CLIENTS))
            else:
                assert sorted(r["client"] for r in got) == sorted(CLIENTS)
            assert all(0 <= r["macro_f1"] <= 1 and set(TOOLS) <= {k[3:] for k in r if k.startswith("f1/")} for r in got)
    updates = records(reference, "client_update")
    assert {r["method"] for r in updates} == {"fedavg", "fedprox", "feddyn", "feddg", "fedrep", "fedavg-uniform"}
    assert all(len([u for u in updates if u["method"] == "fedrep" and u["round"] == rnd]) == 5 for rnd in (1, 2))
    for name in ("table_a1", "table_a2", "table_6_1", "orderings"):
        assert (reference / "tables" / f"{name}.csv").is_file() and (reference / "tables" / f"{name}.md").is_file()
    header = (reference / "tables" / "table_a1.md").read_text().splitlines()[2]
    assert header == "|  | HEI1 | HEI2 | CHO1 | CHO2 | CHO3 | Mean | Var |"
    rows = [line.split(",")[0] for line in (reference / "tables" / "table_a1.csv").read_text().splitlines()[1:]]
    assert rows[:3] == ["ALTV", "EGOV", "fedavg"] and "cent" in rows
    assert {line.split(",")[0] for line in (reference / "tables" / "table_6_1.csv").read_text().splitlines()[1:]} == \
        {"fedavg", "fedprox", "feddyn", "feddg", "fedrep", "fedavg-uniform"}
    for plot in ("f1_per_round", "f1_per_client", "train_loss", "graddiff", "cossim", "cossim_per_client"):
        assert (reference / "plots" / f"{plot}.png").stat().st_size > 1000
    page = (reference / "report.html").read_text()
    assert "How to read this" in page and "Table A.1" in page and "Table 6.1" in page
    assert "random initialisation" in page and "demo-only sizes" in page  # the deviations are told
    info = json.loads((reference / "run.json").read_text())
    assert info["clients"]["CHO2"]["train"] > info["clients"]["CHO1"]["train"]  # quantity skew, as the thesis


def test_the_reference_runs_lineage_holds_every_round_and_each_models_own(reference):
    verified = check_lineage(reference)
    aggregates = [r for r in verified.records if r["type"] == "aggregate"]
    lot = {r["label"].get("model") for r in aggregates if r["algorithm"] == "lot"}
    assert lot == set(CLIENTS)  # LOT: each client's model trained alone, a federation of one
    assert {c for r in aggregates if r["algorithm"] == "fedavg" for c in r["clients"]} == set(CLIENTS)
    assert {r["rule"] for r in aggregates} == {None}  # no [robustness]: the algorithms' own aggregation


def test_uniform_aggregation_differs_from_weighted(reference):
    final = {r["method"]: r for r in records(reference, "round") if r["round"] == 2 and r["method"].startswith("fedavg")}
    assert final["fedavg"]["train_loss"] != final["fedavg-uniform"]["train_loss"]


def test_an_interrupted_run_resumes_to_byte_identical_records(synth, cache, reference, tmp_path, monkeypatch):
    config = tiny(synth, cache, methods=["lot", "feddg", "fedrep"])
    whole = run_study(config, tmp_path / "whole")
    # Ctrl-C in FedDG's second round: LOT's 5 models x 2 rounds, then FedDG's round 1 finished
    stopped = interrupted_at_round(monkeypatch, 12, lambda: run_study(config, tmp_path / "run"))
    assert run_module.stop_note(stopped).startswith(f"kept {tmp_path / 'run.partial'} (11 of 14 units finished)")
    resume_study(tmp_path / "run.partial")
    assert (tmp_path / "run" / "metrics.jsonl").read_bytes() == (whole / "metrics.jsonl").read_bytes()
    # the lineage continues where the checkpoint left it: no record lost or repeated, the same models saved
    assert (tmp_path / "run" / "lineage.jsonl").read_bytes() == (whole / "lineage.jsonl").read_bytes()
    assert tree_hash(tmp_path / "run" / "models") == tree_hash(whole / "models")
    check_lineage(tmp_path / "run")
    # the same methods in a longer list give the same records: every draw comes from the seed
    same = [r for r in records(reference, "client_eval") if r["method"] in ("lot", "feddg", "fedrep")]
    assert records(whole, "client_eval") == same


def test_server_anneal_stops_the_servers_steps_and_resumes_byte_identical(synth, cache, tmp_path, monkeypatch):
    """train.server_anneal (not the thesis): the server's AdamW rate is held, then annealed to 0
    at the last round, whose step is then 0; the schedule survives a checkpoint."""
    config = tiny(synth, cache, methods=["fedavg"], rounds=3, server_anneal=True, pct_start=0.34)
    whole = run_study(config, tmp_path / "whole")
    steps = {r["round"]: (r["server_step"], r["server_lr"]) for r in records(whole, "round")}
    assert steps[1][0] > 0 and steps[2][0] > 0 and steps[3] == (0.0, 0.0) and steps[1][1] == 0.001
    constant = run_study(tiny(synth, cache, methods=["fedavg"], rounds=3), tmp_path / "constant")
    assert {r["round"]: r["server_step"] for r in records(constant, "round")}[3] > 0
    assert "the FL server's AdamW rate is held at 0.001 for 1 rounds" in html.unescape((whole / "report.html").read_text())
    stopped = interrupted_at_round(monkeypatch, 2, lambda: run_study(config, tmp_path / "run"))
    assert run_module.stop_note(stopped).startswith(f"kept {tmp_path / 'run.partial'} (1 of 3 units finished)")
    resume_study(tmp_path / "run.partial")
    assert (tmp_path / "run" / "metrics.jsonl").read_bytes() == (whole / "metrics.jsonl").read_bytes()


# -- Flower ---------------------------------------------------------------------------------------
def test_flowers_simulation_engine_equals_the_simulator(synth, cache, reference, tmp_path):
    config = tiny(synth, cache, methods=["lot", "fedavg", "feddyn", "feddg", "fedrep"])
    run_experiment_on_flower(config, tmp_path / "flower", len(CLIENTS), "surgical.toml")
    kinds = ("client_eval", "round", "client_update")
    expected = [r for r in records(reference, *kinds) if r["method"] in config.methods]
    assert len(expected) > 100 and records(tmp_path / "flower", *kinds) == expected  # bit for bit
    info = json.loads((tmp_path / "flower" / "run.json").read_text())
    assert info["runtime"] == "flower" and info["sites"] == {c: c for c in CLIENTS}


@pytest.mark.parametrize("change, message", [
    ({"methods": ["fedavg", "cent"]}, "method 'cent' trains one model on every client's training frames pooled"),
    ({"train": {"pos_weight": "global"}}, r"train.pos_weight = 'global' computes the BCE positive weights over every"),
])
def test_what_pools_data_is_refused_across_sites(tmp_path, change, message):
    raw = {"study": "surgical", "methods": ["fedavg"], "data": {"root": str(tmp_path)}, **change}
    with pytest.raises(ConfigError, match=message):
        check_experiment(SurgicalExperiment.model_validate(raw), "surgical.toml")
    check_experiment(SurgicalExperiment.model_validate({**raw, "methods": ["fedavg", "lot"], "train": {}}),
                     "surgical.toml")  # LOT and the FL methods run across sites


def test_the_shipped_sites_config_runs_across_sites_with_a_site_per_client():
    config = load_config(ROOT / "configs" / "surgical" / "sites.toml")
    check_experiment(config, "sites.toml")
    assert sorted(config.deployment.sites.values()) == sorted(CLIENTS) and "cent" not in config.methods


def test_a_site_reads_its_own_copy_and_says_what_is_missing(synth, cache, tmp_path):
    study = study_for(tiny(synth, cache, top={"deployment": {"sites": {"salem": "HEI2"}}}))
    site = study.open_site("salem", synth)
    assert site.client == "HEI2" and site.summary()["train"] > 0 and site.synthetic
    (tmp_path / "cholec80").mkdir()
    with pytest.raises(Exception, match=r"site 'salem' \(HEI2\): .*heichole does not exist"):
        study.open_site("salem", tmp_path)


# -- the CLI ----------------------------------------------------------------------------------
def _fails_cleanly(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    flat = result.output.replace("\n", " ")
    for needle in needles:
        assert needle in flat, result.output


def test_demo_surgical_is_listed_runs_and_prints_table_a1(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the demo's decoded frames stay in its run directory
    monkeypatch.delenv("FEDCARE_CACHE", raising=False)
    runner = CliRunner()
    listed = runner.invoke(app, ["demo", "--help"])
    assert listed.exit_code == 0 and "surgical" in listed.output
    shrink = ["data.synthetic.videos=2", "data.synthetic.heichole_videos=4", "data.synthetic.seconds=8",
              "data.synthetic.width=96", "data.synthetic.height=64", "data.frame_size=[96, 64]", "model.width=0.125",
              "model.hidden=16", "train.rounds=1", "train.batch_size=8", "methods=['lot', 'fedavg', 'cent']"]
    result = runner.invoke(app, ["demo", "surgical", "--out", str(tmp_path / "demo"),
                                 *[a for s in shrink for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    assert "Table A.1: final macro F1 per client test set" in result.output
    assert "| ALTV |" in result.output and "| FedAvg |" in result.output and "| CENT |" in result.output
    assert "Table 6.1" in result.output
    assert "The thesis's orderings on this run" in result.output and "| FedAvg > ALTV |" in result.output
    assert "Has each method's training loss converged?" in result.output  # 1 round: none has
    converged = [row["converged"] for row in csv.DictReader((tmp_path / "demo" / "tables" / "convergence.csv").open())]
    assert converged == ["False"] * 3
    assert json.loads((tmp_path / "demo" / "run.json").read_text())["synthetic"] is True
    assert (tmp_path / "demo" / "synthetic-data" / "cholec80").is_dir()
    assert any((tmp_path / "demo" / "frame-cache").rglob("*")) and not (tmp_path / "home" / ".cache" / "fedcare").exists()
    assert "<th>Run directory</th><td>demo</td>" in (tmp_path / "demo" / "report.html").read_text()


def test_bad_input_is_one_line_naming_the_file(synth, cache, tmp_path):
    runner = CliRunner()
    missing = tmp_path / "missing.toml"
    missing.write_text('study = "surgical"\nmethods = ["fedavg"]\n[data]\nroot = "no-such-folder"\n')
    _fails_cleanly(runner.invoke(app, ["run", str(missing), "--out", str(tmp_path / "r1")]),
                   str(tmp_path / "no-such-folder"), "no such folder")
    vgg = tmp_path / "vgg13.pth"
    torch.save(build_model("vgg13", 0.125, 16).state_dict(), vgg)
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(to_toml(tiny(synth, cache, methods=["fedavg"])) + "")
    result = runner.invoke(app, ["run", str(wrong), "--out", str(tmp_path / "r2"), "--set", f"model.weights='{vgg}'"])
    _fails_cleanly(result, str(vgg), "'features.0.weight' has shape (8, 3, 3, 3) in the file")
    both = tmp_path / "both.toml"
    both.write_text('study = "surgical"\nmethods = ["fedavg"]\n[data]\nroot = "x"\n[data.synthetic]\nseed = 1\n')
    _fails_cleanly(runner.invoke(app, ["run", str(both)]), "give exactly one of data.root")
    bad = tmp_path / "bad.toml"
    bad.write_text('study = "surgical"\nmethods = ["fedsgd"]\n[data]\nroot = "x"\n')
    _fails_cleanly(runner.invoke(app, ["run", str(bad)]), "methods.0")


def test_the_study_page_documents_every_config_key():
    page = (ROOT / "docs" / "studies" / "surgical.md").read_text()
    section = page[page.index("\n## Config options\n"):]
    end = section.find("\n## ", 1)
    section = section if end < 0 else section[:end]
    for table, model in (("data", SurgicalData), ("model", SurgicalModel), ("train", SurgicalTrain)):
        for key in model.model_fields:
            if key != "synthetic":
                assert f"`{table}.{key}`" in section, f"{table}.{key}"
    synthetic = next(line for line in section.splitlines() if line.startswith("| `[data.synthetic]`"))
    assert all(f"`{key}`" in synthetic for key in SurgicalSynthetic.model_fields)
    top = [key for key in SurgicalExperiment.model_fields if key not in ("data", "model", "train", "runtime", "deployment")]
    assert all(f"`{key}`" in section for key in top)


def test_a_site_caches_where_the_site_says_never_where_the_experiment_says(synth, tmp_path, monkeypatch):
    """`data.cache` is the researcher's file choosing a path on a hospital's disk: a site decodes
    into its own --state-dir's cache (deployment/app.py), else the user's cache."""
    from fedcare.deployment.app import _site_cache

    experiments_choice = tmp_path / "chosen-by-the-experiment"
    study = study_for(tiny(synth, experiments_choice, top={"deployment": {"sites": {"salem": "HEI2"}}}))
    site_cache = _site_cache(_Context({"site": "salem", "state-dir": str(tmp_path / "state")}))
    assert site_cache == tmp_path / "state" / "cache"
    study.open_site("salem", synth, site_cache)
    assert any(site_cache.rglob("*.npy")) and not experiments_choice.exists()
    monkeypatch.setenv("FEDCARE_CACHE", str(tmp_path / "users-cache"))
    study.open_site("salem", synth)  # no state dir: the user's own cache
    assert any((tmp_path / "users-cache").rglob("*.npy")) and not experiments_choice.exists()


class _Context:
    def __init__(self, node_config, run_config=None):
        self.node_config, self.run_config = node_config, run_config or {}

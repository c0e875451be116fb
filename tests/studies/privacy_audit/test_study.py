"""The privacy audit study (`fedcare demo privacy_audit`, alias `fedcare demo --privacy`), shrunk
to one round of two methods at two privacy levels and two steps of each inversion case: a run
directory like every study's (records, tables, plots, report, resume), results on stdout,
strict JSON, every path it cites present, and a failure or a native crash never reported as an
interruption."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.runtime.lineage_verify import verify_lineage

from support import ROOT


SHRINK = ["train.rounds=1", 'methods=["local", "FedBN"]', "protocol.noise_multipliers=[1.5]", "inversion.steps=2",
          "data.clients=3", "data.train=16", "data.test=16", "protocol.shadow_models=2"]
SETS = [a for s in SHRINK for a in ("--set", s)]
# local and FedBN plain, local under DP-SGD and within the demo's budget; the one-run audits with canaries of local
# and FedBN plain and local under DP-SGD (no FedAvg: no client-level case); the five inversion cases
UNITS = 4 + 3 + 5
AUDIT_HEADER = ("| privacy | method | epsilon | accuracy | peer_auc | peer_tpr_1pct | peer_tpr_01pct | own_auc | "
                "own_tpr_1pct | own_tpr_01pct |")
LIRA_HEADER = ("| privacy | method | epsilon | peer_lira_auc | peer_lira_tpr_1pct | peer_lira_tpr_01pct | own_lira_auc | "
               "own_lira_tpr_1pct | own_lira_tpr_01pct |")


def strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """`fedcare demo --privacy --out <dir> --set ...` once: (the CLI result, the run directory)."""
    out = tmp_path_factory.mktemp("privacy") / "demo"
    result = CliRunner().invoke(app, ["demo", "--privacy", "--out", str(out), *SETS])
    assert result.exit_code == 0, result.output
    return result, out


def test_the_privacy_demo_is_a_study_run_with_its_results_on_stdout(demo):
    result, out = demo
    assert "fedcare demo --privacy is the same as `fedcare demo privacy_audit`" in result.stderr
    # the tables go to stdout, whole (not wrapped at 80 columns), like every demo's summary
    assert AUDIT_HEADER in result.stdout.splitlines() and LIRA_HEADER in result.stdout.splitlines()
    assert "| none | local | inf |" in result.stdout and "| DP sigma=1.5 | local |" in result.stdout
    assert "| baseline: flat image (nothing recovered) | 0 |" in result.stdout
    assert f"Report: {out.resolve() / 'report.html'}" in result.stdout and "[8/8]" not in result.stdout
    info = json.loads((out / "run.json").read_text())
    assert info["study"] == "privacy_audit" and info["status"] == "finished" and info["synthetic"] is True
    assert info["progress"] == {"units_done": UNITS, "units_total": UNITS}
    assert "rounds = 1" in (out / "config.toml").read_text()  # --set is honoured
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["type"] for r in records].count("audit") == 4 and [r["type"] for r in records].count("inversion") == 6
    # the budgeted level (the demo's protocol.target_epsilon = 10): every client spends exactly its budget
    budget = [r for r in records if r["type"] == "privacy_budget" and r["method"] == "local (DP epsilon<=10)"]
    assert len(budget) == 3 and all(r["target_epsilon"] == 10 and 9.9 < r["epsilon"] <= 10 for r in budget)
    assert "| local (DP epsilon<=10) | DP-SGD | all 3 |" in result.stdout
    assert (out / "synthetic-data" / "inversion-subject-seed0").is_dir()  # the inversion's frames stay in the run
    lineage = verify_lineage(out)  # every target, shadow and audit federation's aggregates and models
    assert lineage.sealed and len(lineage.models) >= 7 + 2 * 4  # 7 trained cases, 2 shadows for each of 4 audits
    assert {r["round"] for r in lineage.records if r["type"] == "aggregate"} == {1}


def test_every_path_the_demo_cites_exists(demo):
    result, out = demo
    page = (out / "report.html").read_text()
    cited = set(re.findall(r"\b(?:tables|plots)/(?:[\w-]+\.\w+)?|\bmetrics\.jsonl|\brun\.json", page + result.stdout))
    assert {"tables/", "plots/", "plots/inversion.png", "plots/membership_auc.png", "metrics.jsonl"} <= cited
    assert [c for c in cited if not (out / c).exists()] == []
    assert (out / "tables" / "privacy_audit.csv").is_file() and (out / "tables" / "privacy_inversion.md").is_file()
    assert (out / "tables" / "privacy_lira.csv").is_file()
    # `fedcare report` rebuilds the same tables from metrics.jsonl alone
    before = (out / "tables" / "privacy_audit.csv").read_bytes()
    (out / "tables" / "privacy_audit.csv").unlink()
    again = CliRunner().invoke(app, ["report", str(out)])
    assert again.exit_code == 0 and (out / "tables" / "privacy_audit.csv").read_bytes() == before


def test_the_one_run_audit_puts_epsilon_hat_beside_epsilon_and_rmia_beside_lira(demo):
    result, out = demo
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in records if r["type"] == "epsilon_audit"]
    # local and FedBN plain, local under DP-SGD sigma 1.5: pooled and each of the 3 clients
    assert {(r["method"], r["client"]) for r in rows} == {
        (m, c) for m in ("local (none)", "FedBN (none)", "local (DP sigma=1.5)") for c in ("pooled", "0", "1", "2")}
    for r in rows:
        assert r["m"] == (3000 if r["client"] == "pooled" else 1000) and 0 <= r["v"] <= r["r"] <= r["m"]
        if r["privacy"] == "none":
            assert r["epsilon"] is None and r["p_value"] is None
        else:  # the accountant's epsilon of the audited run, and a bound within it
            assert 0 < r["epsilon_hat"] <= r["epsilon"] and r["p_value"] > 0.05
    assert json.loads((out / "run.json").read_text())["privacy_audit"] == {
        "sound": True, "claims_tested": 4, "confidence": 0.95, "unsound": []}
    table = (out / "tables" / "epsilon_audit.md").read_text()
    assert "| local (DP sigma=1.5) | example (gradient canaries) | pooled |" in table
    assert "PRIVACY AUDIT FAILED" not in (out / "report.html").read_text()
    assert ("Privacy audit (one run, 95% confidence): 4 of 4 rows with an accountant's epsilon have epsilon-hat <= "
            "epsilon") in result.stdout and "Sound: every accountant's claim stands (4 claims" in result.stdout
    assert "| privacy | method | epsilon | peer_rmia_auc |" in result.stdout  # RMIA, the first shadow as reference
    assert all(0 <= r["own_rmia_auc"] <= 1 for r in records if r["type"] == "audit")


def test_the_run_directory_is_strict_json(demo):
    _, out = demo
    for path in out.glob("*.json"):
        strict_json(path.read_text())
    records = [strict_json(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    audit = [r for r in records if r["type"] == "audit"]
    plain = [r for r in audit if r["privacy"] == "none"]
    assert plain and all(r["epsilon"] is None and "no DP-SGD" in r["epsilon_note"] for r in plain)
    assert all(0 < r["epsilon"] < 1e6 and "epsilon_note" not in r for r in audit if r["privacy"] != "none")


def test_what_the_privacy_demo_would_ignore_is_refused(tmp_path):
    result = CliRunner().invoke(app, ["demo", "surgical", "--privacy", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "--privacy runs the privacy_audit study and cannot be combined with the study 'surgical'" in result.output
    bad = CliRunner().invoke(app, ["demo", "--privacy", "--out", str(tmp_path / "y"), "--set", "protocol.round=3"])
    assert bad.exit_code == 2 and "protocol.round" in bad.output and "Traceback" not in bad.output
    private = CliRunner().invoke(app, ["demo", "privacy_audit", "--out", str(tmp_path / "z"), "--set",
                                       "privacy.dp_sgd.noise_multiplier=1.0"])
    assert private.exit_code == 2 and "a [privacy] table does not apply" in private.output
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("error, code, status, said", [
    (RuntimeError("can't start new thread"), 1, "failed", "RuntimeError: can't start new thread"),
    (KeyboardInterrupt(), 130, "interrupted", "interrupted (Ctrl-C)"),
])
def test_a_stopped_demo_keeps_its_run_directory_and_resumes(demo, tmp_path, monkeypatch, error, code, status, said):
    """Stopped in the second inversion case: only Ctrl-C is an interruption (130); a failure
    exits 1. Either way the finished units are kept in <out>.partial, and `fedcare resume`
    ends with the records of the uninterrupted run."""
    from fedcare.studies.privacy_audit import inversion

    attack, calls = inversion.attack_case, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise error
        return attack(*args, **kwargs)

    monkeypatch.setattr(inversion, "attack_case", failing)
    out = tmp_path / "run"
    stopped = CliRunner().invoke(app, ["demo", "privacy_audit", "--out", str(out), *SETS])
    assert stopped.exit_code == code, stopped.output
    partial = tmp_path / "run.partial"
    assert said in stopped.output and f"continue with: fedcare resume {partial}" in stopped.output
    info = json.loads((partial / "run.json").read_text())
    assert info["status"] == status and info["progress"] == {"units_done": 8, "units_total": UNITS}
    monkeypatch.undo()
    resumed = CliRunner().invoke(app, ["resume", str(partial)])
    assert resumed.exit_code == 0, resumed.output
    assert (out / "metrics.jsonl").read_bytes() == (demo[1] / "metrics.jsonl").read_bytes()
    assert AUDIT_HEADER in resumed.stdout.splitlines()


CRASH = """
import os, signal, sys
from fedcare.studies.privacy_audit import inversion
inversion.attack_case = lambda *a, **k: os.kill(os.getpid(), signal.SIGSEGV)  # a native crash in a unit
sys.argv = ["fedcare", *sys.argv[1:]]
from fedcare.cli import main
main()
"""


@pytest.mark.timeout(300)
def test_a_native_crash_is_reported_not_taken_for_an_interruption(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", CRASH, "demo", "privacy_audit", "--out", str(out), *SETS],
                          capture_output=True, text=True, timeout=280, env=env)
    assert proc.returncode == -signal.SIGSEGV, proc.stderr  # by its own signal: not 130, not 1
    assert "Fatal Python error: Segmentation fault" in proc.stderr
    assert "in invert" in proc.stderr  # where Python was: the protocol's inversion unit
    info = json.loads((tmp_path / "run.partial" / "run.json").read_text())
    assert info["progress"]["units_done"] == 7  # the audit's units are kept for `fedcare resume`
    assert (tmp_path / "run.partial" / "checkpoint.pt").is_file()


def test_a_budget_level_is_named_built_and_read_back():
    """`protocol.target_epsilon` adds a level after the noise levels: DP-SGD with the budget over
    the planned fit epochs; its algorithm name reads back to the same level."""
    from fedcare.studies.load import load_config
    from fedcare.studies.privacy_audit.methods import _level, algorithm_name, cases, dp_sgd, level_label

    config = load_config(ROOT / "configs" / "privacy_audit" / "demo.toml", [])
    levels = list(dict.fromkeys(level for level, _ in cases(config)))
    assert levels == [None, 0.6, 1.5, "epsilon<=10"] and level_label("epsilon<=10") == "DP epsilon<=10"
    dp = dp_sgd("epsilon<=10", config).dp_sgd
    assert dp.target_epsilon == 10 and dp.budget_epochs == config.train.rounds * config.train.local_epochs
    for level in levels:
        assert _level(algorithm_name("PFDL", level).partition(" under DP-SGD sigma=")[2]) == level

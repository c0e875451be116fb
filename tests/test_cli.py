"""The command line as a user types it."""

import json

import pytest
from typer.testing import CliRunner

from fedcare.cli import app

COMMANDS = [[], ["run"], ["demo"], ["report"], ["data"], ["data", "synth"], ["data", "synth", "pain"],
            ["data", "summary"], ["data", "summary", "unbc"], ["flower"], ["flower", "supernode"],
            ["flower", "clientapps"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "fedcare")
def test_every_command_has_help(command):
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0
    assert "Usage" in result.output and len(result.output.splitlines()) > 5


def test_demo_runs_end_to_end_and_prints_the_summary_and_report_path(tmp_path):
    out = tmp_path / "demo"
    shrink = ["train.max_rounds=1", "train.pretrain_max_rounds=1", "protocol.last_session=2",
              "data.synthetic.frame_scale=0.02", "protocol.image_size=16"]
    result = CliRunner().invoke(app, ["demo", "--out", str(out), *[a for s in shrink for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    for method in ["RANDOM", "BC", "C(C)", "F(C)", "FP(C)", "FL(C)"]:
        assert f"| {method} |" in result.output
    assert "Means over seeds: RANDOM over 10; BC, C(C), F(C), FP(C), FL(C) over 1." in result.output
    assert f"Report: {out.resolve() / 'report.html'}" in result.output
    run = json.loads((out / "run.json").read_text())
    assert run["synthetic"] is True and run["methods"] == ["RANDOM", "BC", "C(C)", "F(C)", "FP(C)", "FL(C)"]
    assert (out / "synthetic-data" / "fedcare-synthetic.json").is_file()

    # `fedcare report` rebuilds the report from metrics.jsonl alone
    (out / "report.html").unlink()
    result = CliRunner().invoke(app, ["report", str(out)])
    assert result.exit_code == 0 and (out / "report.html").is_file() and "| FL(C) |" in result.output


def test_report_on_a_folder_that_is_not_a_run(tmp_path):
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "not a run directory" in result.output


def test_synth_then_summary(tmp_path):
    out = tmp_path / "cohort"
    result = CliRunner().invoke(app, ["data", "synth", "pain", str(out), "--subjects", "43,80", "--frame-scale", "0.02"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["data", "summary", "unbc", str(out), "--json"])
    summary = json.loads(result.stdout)
    assert summary["synthetic"] is True and summary["subjects"] == 2 and summary["problems"] == []

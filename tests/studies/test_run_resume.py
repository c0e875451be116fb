"""`fedcare resume` continues only the run it began (issue 35, items 5, 11, 15): not without the
finished units' records (metrics.jsonl gone: it said "finished 3 of 3" with them lost), not on
other data at the same data.root (two datasets mixed in one run's records), not with a config
it cannot check (a run.json without config_sha256), not from an unreadable run.json (reported
as a pain run); and a resume refused before it trained says what it keeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.data.pamap2.synthetic import generate_pamap2
from fedcare.errors import InputError
from fedcare.studies.fedhealth2.config import FedHealth2Experiment
from fedcare.studies.run import resume_study, run_study

from support.interrupt import interrupted_at_round


def config_on(root: Path) -> FedHealth2Experiment:
    """FedAvg, 3 rounds (3 units), on the PAMAP2 copy at `root`."""
    return FedHealth2Experiment.model_validate({
        "study": "fedhealth2", "seeds": [1], "methods": ["fedavg"], "data": {"dataset": "pamap2", "root": str(root)},
        "protocol": {"clients": 4, "dirichlet_alpha": 1.0}, "train": {"rounds": 3, "hidden": 16},
        "runtime": {"threads": 1}})


@pytest.fixture
def stopped(tmp_path, monkeypatch) -> Path:
    """A run on tmp_path/pamap2, stopped (Ctrl-C) as its round 3 began: 2 of 3 units kept."""
    generate_pamap2(tmp_path / "pamap2", seed=1, subjects=3, seconds_per_activity=6)
    interrupted_at_round(monkeypatch, 3, lambda: run_study(config_on(tmp_path / "pamap2"), tmp_path / "run"))
    return tmp_path / "run.partial"


def _resume(partial: Path):
    return CliRunner().invoke(app, ["resume", str(partial)])


def test_the_run_records_its_datas_fingerprint(stopped, tmp_path):
    from fedcare.studies.fingerprint import files_digest

    fingerprint = json.loads((stopped / "run.json").read_text())["data_fingerprint"]
    assert sorted(fingerprint["clients"]) == ["0", "1", "2", "3"]
    assert all(len(d) == 64 for d in fingerprint["clients"].values())
    assert fingerprint["files"] == files_digest(tmp_path / "pamap2") and fingerprint["files"]["count"] == 4
    (tmp_path / "pamap2" / ".DS_Store").write_text("a file manager's")  # hidden: not data
    assert files_digest(tmp_path / "pamap2") == fingerprint["files"]


def test_a_resume_without_metrics_jsonl_is_refused_and_says_what_it_keeps(stopped):
    (stopped / "metrics.jsonl").unlink()
    result = _resume(stopped)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "metrics.jsonl: missing, but its checkpoint has finished units" in result.output
    assert f"kept {stopped} (2 of 3 units finished)" in result.output  # it said "nothing finished"
    assert not (stopped / "metrics.jsonl").exists() and stopped.is_dir()


def test_a_resume_on_other_data_at_the_same_root_is_refused(stopped, tmp_path):
    generate_pamap2(tmp_path / "pamap2", seed=2, subjects=3, seconds_per_activity=6, overwrite=True)
    result = _resume(stopped)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "now hold other data than when the run began" in result.output
    assert "a resume continues on the data the run began with" in result.output


def test_a_resume_on_other_files_with_the_same_summaries_is_refused(stopped, tmp_path):
    """The clients' summaries tell only counts: a file renamed under data.root still differs."""
    (tmp_path / "pamap2" / "notes.txt").write_text("a file that was not there")
    with pytest.raises(InputError, match=r"pamap2: other files than when the run began \(4 files then, 5 now"):
        resume_study(stopped)
    (tmp_path / "pamap2" / "notes.txt").unlink()
    resume_study(stopped)  # the same data again: it resumes
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "finished"


def test_a_run_json_without_config_sha256_does_not_resume_an_edited_config(stopped):
    info = json.loads((stopped / "run.json").read_text())
    del info["config_sha256"]
    (stopped / "run.json").write_text(json.dumps(info))
    config = (stopped / "config.toml").read_text()
    (stopped / "config.toml").write_text(config.replace("rounds = 3", "rounds = 2"))
    result = _resume(stopped)
    assert result.exit_code == 2 and "run.json: records no config_sha256" in result.output, result.output


def test_an_unreadable_run_json_is_named_not_read_as_a_pain_run(stopped):
    (stopped / "run.json").write_text("{cut off")
    for command in ("report", "resume"):
        result = CliRunner().invoke(app, [command, str(stopped)])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert f"{stopped / 'run.json'}: could not be read" in result.output and "pain" not in result.output

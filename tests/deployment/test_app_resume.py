"""Resuming a run across sites after its coordinator died: the coordinator's run directory
keeps the simulator's checkpoint units, each site keeps its side (its private state as of the
last checkpoint) in its own state folder, and the resumed run ends with the records of an
uninterrupted one, byte for byte. In process here (Flower's Simulation Engine, the in-process
backend of support/flower_inprocess.py); test_cli_deployed_resume.py SIGKILLs a real coordinator."""

import json
from pathlib import Path

import pytest

from fedcare.data.pamap2.synthetic import generate_pamap2
from fedcare.studies.fedhealth2.config import FedHealth2Experiment
from fedcare.studies.rundir import RecordsWriter

from support.flower_inprocess import run_experiment_on_flower


SUBJECTS = [101, 102, 103]


def small_config(root: Path) -> FedHealth2Experiment:
    # FedBN keeps personal layers at the sites, FedAP a setup answer and per-client server weights
    return FedHealth2Experiment.model_validate({
        "study": "fedhealth2", "seeds": [1], "methods": ["fedbn", "fedap"], "data": {"dataset": "pamap2", "root": str(root)},
        "protocol": {"split": "natural", "pretrain": "federated", "subjects": SUBJECTS},
        "train": {"rounds": 3, "pretrain_rounds": 1, "hidden": 8}, "runtime": {"threads": 2},
    })


@pytest.fixture(scope="module")
def pamap2(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pamap2") / "PAMAP2_Dataset"
    generate_pamap2(root, seed=2, subjects=3, seconds_per_activity=4.0)
    return root


class CoordinatorDied(Exception):
    pass


@pytest.mark.timeout(300)
def test_a_run_across_sites_resumes_after_its_coordinator_died(pamap2, tmp_path, monkeypatch):
    config = small_config(pamap2)
    run_experiment_on_flower(config, tmp_path / "whole", len(SUBJECTS), "fh2.toml", state_dir=tmp_path / "state-whole")
    expected = (tmp_path / "whole" / "metrics.jsonl").read_bytes()
    out, state = tmp_path / "flower", tmp_path / "state"
    # the coordinator dies as it records fedap's round 2: after that round's fits at the sites
    # (their state moved on) and before its checkpoint (the run goes back to round 1's)
    write = RecordsWriter.write

    def dying(self, record):
        if record.get("type") == "round" and record.get("method") == "fedap" and record.get("round") == 2:
            raise CoordinatorDied("the coordinator died")
        write(self, record)

    monkeypatch.setattr(RecordsWriter, "write", dying)
    with pytest.raises(CoordinatorDied):
        run_experiment_on_flower(config, out, len(SUBJECTS), "fh2.toml", state_dir=state)
    partial = out.with_name("flower.partial")
    assert not out.exists() and (partial / "checkpoint.pt").is_file()
    info = json.loads((partial / "run.json").read_text())
    assert info["runtime"] == "flower" and info["status"] == "failed" and info["progress"] == {"units_done": 5, "units_total": 7}
    # each site kept its state as of the checkpoint, beside its current (moved on) state
    assert len(list(state.glob(f"*/run-{info['flower_run']}/client-*.kept.pt"))) == len(SUBJECTS)

    monkeypatch.setattr(RecordsWriter, "write", write)
    run_experiment_on_flower(config, out, len(SUBJECTS), "fh2.toml", state_dir=state, resume=partial)
    assert (out / "metrics.jsonl").read_bytes() == expected
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "finished" and info["complete"] is True and not (out / "checkpoint.pt").exists()


@pytest.mark.timeout(300)
def test_a_site_without_its_kept_state_cannot_continue_the_run(pamap2, tmp_path, monkeypatch):
    """A site whose state folder was lost is not silently started afresh: the resume stops naming it."""
    config = small_config(pamap2).model_copy(update={"methods": ["fedbn"]})
    out, state = tmp_path / "flower", tmp_path / "state"
    write = RecordsWriter.write

    def dying(self, record):
        if record.get("type") == "round" and record.get("round") == 2:
            raise CoordinatorDied("the coordinator died")
        write(self, record)

    monkeypatch.setattr(RecordsWriter, "write", dying)
    with pytest.raises(CoordinatorDied):
        run_experiment_on_flower(config, out, len(SUBJECTS), "fh2.toml", state_dir=state)
    monkeypatch.setattr(RecordsWriter, "write", write)
    for kept in state.rglob("client-102*"):
        kept.unlink()  # site 102 lost its disk
    partial = out.with_name("flower.partial")
    with pytest.raises(Exception, match="cannot continue this run"):
        run_experiment_on_flower(config, out, len(SUBJECTS), "fh2.toml", state_dir=state, resume=partial)
    assert not out.exists() and partial.is_dir()  # still resumable
    info = json.loads((partial / "run.json").read_text())
    assert info["status"] == "failed" and "cannot continue this run" in info["error"] and "102" in info["error"]


def test_each_kind_of_run_is_resumed_by_its_own_command(pamap2, tmp_path):
    from typer.testing import CliRunner

    from fedcare.cli import app
    from fedcare.config import to_toml

    partial = tmp_path / "run.partial"
    partial.mkdir()
    (partial / "config.toml").write_text(to_toml(small_config(pamap2)))
    (partial / "run.json").write_text(json.dumps({"runtime": "flower", "status": "failed"}))
    result = CliRunner().invoke(app, ["resume", str(partial)])
    assert result.exit_code != 0 and "fedcare flower run --resume" in " ".join(result.output.split())
    (partial / "run.json").write_text(json.dumps({"status": "failed"}))  # a run of `fedcare run`
    result = CliRunner().invoke(app, ["flower", "run", "--resume", str(partial), "--federation", "x"])
    assert result.exit_code == 2
    assert f"not a run across sites; continue it with: fedcare resume {partial}" in " ".join(result.output.split())

"""Runs a user can trust: exclusive run directories, no finished work lost, resume with
byte-identical records, signals, an incomplete run's report, and one-line errors (never a
traceback) for bad input."""

import errno
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import fedcare

from fedcare.cli import app
from fedcare.config import ConfigError, to_toml
from fedcare.studies.load import load_config
from fedcare.data.unbc.synthetic import generate_pain_cohort
from fedcare.studies import run as run_module
from fedcare.studies import run_record
from fedcare.studies.checkpoint import CHECKPOINT_FILE
from fedcare.studies.pain.config import PainExperiment
from fedcare.studies.rundir import RunDirectory, RunDirectoryExists, mark_if_crashed, update_run_info
from fedcare.studies.run import build_report, resume_study, run_study

from support import ROOT
from support.interrupt import interrupted_at_round


SUBJECTS = [42, 43, 80]


def pain_config(root: Path, **protocol) -> PainExperiment:
    return PainExperiment.model_validate({
        "title": "lifecycle", "seeds": [5, 6], "random_seeds": [5, 6, 7],  # seed 7: RANDOM alone, resumed too
        "methods": ["RANDOM", "F(C)", "FP(N)"], "data": {"root": str(root)},
        "protocol": {"pretrain_subjects": [42], "subjects": [43, 80], "image_size": 16, "balance_per_class": 12,
                     "last_session": 2, **protocol},
        "train": {"lr": 0.01, "local_epochs": 1, "rounds": 2, "patience": 1, "pretrain_rounds": 2,
                  "pretrain_patience": 1},
        "pfdl": {"finetune_epochs": 1}, "runtime": {"threads": 1},
    })


@pytest.fixture(scope="module")
def cohort(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data") / "unbc"
    generate_pain_cohort(root, subjects=SUBJECTS, frame_scale=0.02, image_size=32)
    return root


@pytest.fixture(scope="module")
def reference(cohort, tmp_path_factory) -> Path:
    """An uninterrupted run: what every interrupted and resumed run must end as."""
    return run_study(pain_config(cohort), tmp_path_factory.mktemp("ref") / "run")


def write_config(path: Path, config) -> Path:
    path.write_text(to_toml(config))
    return path


def _ctrl_c_as_on_a_terminal() -> None:
    # A shell without job control starts background jobs with SIGINT ignored, and an ignored
    # SIGINT stays ignored across exec: give the run the terminal's default, as a user has it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli(*args: str, cwd: Path | None = None, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fedcare.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_ctrl_c_as_on_a_terminal, **popen)


def wait_for_units(partial: Path, units: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            progress = json.loads((partial / "run.json").read_text()).get("progress") or {}
        except (OSError, json.JSONDecodeError):
            progress = {}
        if progress.get("units_done", 0) >= units:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise TimeoutError(f"{partial}: {units} units never finished")


# -- 1. exclusive run directories ------------------------------------------------------------
def test_two_runs_with_the_default_out_started_together_get_their_own_directories(cohort, tmp_path):
    config = write_config(tmp_path / "exp.toml", pain_config(cohort).model_copy(update={"methods": ["FP(N)"]}))
    procs = [cli("run", str(config), "--set", f"seeds=[{seed}]", cwd=tmp_path) for seed in (5, 6)]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2 and not any(r.name.endswith(".partial") for r in runs)
    seeds = sorted(json.loads((r / "run.json").read_text())["seeds"][0] for r in runs)
    assert seeds == [5, 6]  # each directory holds its own run
    for run in runs:
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert {r["seed"] for r in records} == set(json.loads((run / "run.json").read_text())["seeds"])
    assert all("Report:" in out for out, _ in outputs) and outputs[0][0] != outputs[1][0]


def test_a_taken_default_name_gets_a_suffix_and_a_chosen_one_is_refused(tmp_path):
    first = RunDirectory.create(tmp_path / "run", unique=True)
    second = RunDirectory.create(tmp_path / "run", unique=True)
    assert (first.partial.name, second.partial.name) == ("run.partial", "run-2.partial")
    with pytest.raises(RunDirectoryExists, match=rf"another run is writing here \(process {os.getpid()} on "):
        RunDirectory.create(tmp_path / "run")
    first.release()
    second.remove()


def test_a_second_run_into_a_running_runs_directory_is_refused_and_deletes_nothing(cohort, tmp_path):
    holder = RunDirectory.create(tmp_path / "run")
    (holder.partial / "metrics.jsonl").write_text('{"type": "round"}\n')
    config = write_config(tmp_path / "exp.toml", pain_config(cohort))
    result = CliRunner().invoke(app, ["run", str(config), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "another run is writing here (process" in result.output
    assert (holder.partial / "metrics.jsonl").read_text() == '{"type": "round"}\n'
    holder.release()
    # an interrupted run's directory is not taken over either: it says how to resume it
    result = CliRunner().invoke(app, ["run", str(config), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "fedcare resume" in result.output and holder.partial.is_dir()


# -- 2. a failure after training keeps the records --------------------------------------------
def test_a_full_disk_while_writing_the_report_keeps_every_record(cohort, reference, tmp_path, monkeypatch):
    def full(run_dir):
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(run_dir) / "report.html"))

    monkeypatch.setattr(run_module, "build_report", full)
    config = write_config(tmp_path / "exp.toml", pain_config(cohort))
    result = CliRunner().invoke(app, ["run", str(config), "--out", str(tmp_path / "run")])
    partial = tmp_path / "run.partial"
    assert result.exit_code == 2 and "No space left on device" in result.output
    assert f"kept {partial}" in result.output and "Traceback" not in result.output
    assert (partial / "metrics.jsonl").read_bytes() == (reference / "metrics.jsonl").read_bytes()
    monkeypatch.undo()
    assert resume_study(partial) == tmp_path / "run"  # nothing left to train: the report is written
    assert (tmp_path / "run" / "report.html").is_file()


# -- 3 and 4. resume; SIGKILL, SIGTERM, Ctrl-C ------------------------------------------------
@pytest.mark.timeout(600)
def test_a_sigkilled_run_resumes_to_byte_identical_records(cohort, reference, tmp_path):
    config = write_config(tmp_path / "exp.toml", pain_config(cohort))
    out = tmp_path / "run"
    proc = cli("run", str(config), "--out", str(out))
    wait_for_units(tmp_path / "run.partial", 5, proc)  # seed 5's pretraining and a few sessions
    proc.kill()
    proc.wait(30)
    partial = tmp_path / "run.partial"
    kept = json.loads((partial / "run.json").read_text())
    assert kept["status"] == "running" and 5 <= kept["progress"]["units_done"] < kept["progress"]["units_total"]
    # the killed process could write nothing: the next fedcare command that meets the run says it crashed
    again = CliRunner().invoke(app, ["run", str(config), "--out", str(out)])
    assert again.exit_code == 2 and f"{partial}: a crashed run is kept here" in again.output
    assert json.loads((partial / "run.json").read_text())["status"] == "crashed"
    resumed = cli("resume", str(partial))
    stdout, stderr = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, stderr
    assert (out / "metrics.jsonl").read_bytes() == (reference / "metrics.jsonl").read_bytes()
    assert json.loads((out / "run.json").read_text())["status"] == "finished"
    assert "| FP(N) |" in stdout and not partial.exists()
    assert not (out / CHECKPOINT_FILE).exists() and not (out / ".lock").exists()  # only what continuing needed
    assert "resumed pain run" in (out / "run.log").read_text()
    assert "crashed: the process ended without recording why" in (out / "run.log").read_text()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig, code, said", [(signal.SIGTERM, 143, "stopped (SIGTERM)"),
                                            (signal.SIGINT, 130, "interrupted (Ctrl-C)")])
def test_sigterm_and_ctrl_c_keep_the_finished_work_and_say_how_to_resume(cohort, tmp_path, sig, code, said):
    config = write_config(tmp_path / "exp.toml", pain_config(cohort))
    proc = cli("run", str(config), "--out", str(tmp_path / "run"))
    partial = tmp_path / "run.partial"
    wait_for_units(partial, 2, proc)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    assert said in stderr and f"continue with: fedcare resume {partial}" in stderr and "Traceback" not in stderr
    info = json.loads((partial / "run.json").read_text())
    assert info["status"] == "interrupted" and info["progress"]["units_done"] >= 2
    assert (partial / CHECKPOINT_FILE).is_file()


def fedhealth2_config():
    from fedcare.studies.fedhealth2.config import FedHealth2Experiment

    return FedHealth2Experiment.model_validate({
        "study": "fedhealth2", "seeds": [1], "methods": ["fedbn", "fedap", "f-fedap"],
        "data": {"dataset": "pamap2", "synthetic": {"subjects": 3, "seconds_per_activity": 6.0}},
        "protocol": {"clients": 4, "dirichlet_alpha": 1.0}, "train": {"rounds": 3, "pretrain_rounds": 1},
        "options": {"ffedap_warmup_rounds": 1}, "runtime": {"threads": 1},
    })


def test_a_federated_study_resumes_from_its_round_checkpoint(tmp_path, monkeypatch):
    """FedHealth 2: stopped in the middle of a method's rounds (Ctrl-C), resumed in process."""
    config = fedhealth2_config()
    reference = run_study(config, tmp_path / "reference")
    # Ctrl-C in fedap's round 2 (after fedbn's 3 rounds and fedap's first)
    stopped = interrupted_at_round(monkeypatch, 6, lambda: run_study(config, tmp_path / "run"))
    # the pretraining, fedbn's 3 rounds and fedap's first: 5 of 10 units
    assert run_module.stop_note(stopped).startswith(f"kept {tmp_path / 'run.partial'} (5 of 10 units finished)")
    resume_study(tmp_path / "run.partial")
    assert (tmp_path / "run" / "metrics.jsonl").read_bytes() == (reference / "metrics.jsonl").read_bytes()
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["compute"]["threads"] == 1  # the config's runtime.threads, as the run computed
    assert "compute_changes" not in info  # resumed on the same arithmetic: nothing to say
    assert "Resumed after" not in (tmp_path / "run" / "report.html").read_text()


def test_a_run_resumed_on_other_arithmetic_says_so(tmp_path, monkeypatch):
    """A run resumed where torch computes otherwise (another processor's kernels, say: here
    faked) finishes, and its run.log, run.json and report say after which unit its records may
    differ from an uninterrupted run's by rounding."""
    from fedcare.compute import compute_facts
    from fedcare.device import Compute

    interrupted_at_round(monkeypatch, 6, lambda: run_study(fedhealth2_config(), tmp_path / "run"))
    begun = json.loads((tmp_path / "run.partial" / "run.json").read_text())["compute"]
    other = {**compute_facts(), "cpu_kernels": "ANOTHER"}
    monkeypatch.setattr(run_record, "compute_facts", lambda: other)
    resume_study(tmp_path / "run.partial")
    run = tmp_path / "run"
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "finished" and info["compute"] == begun  # the start's facts are kept
    # the facts of this process, and the run's device, precision and determinism (fedcare.device.Compute)
    assert info["compute_changes"] == [{"after_units": 5, "compute": {**other, **Compute().facts()}}]
    assert "resumed after 5 units on other arithmetic" in (run / "run.log").read_text()
    note = next(n for n in info["notes"] if n.startswith("Resumed after 5 finished units on other arithmetic"))
    assert "CPU kernels ANOTHER" in note and f"CPU kernels {begun['cpu_kernels']}" in note
    report = (run / "report.html").read_text()
    assert "Resumed after 5 finished units" in report and "<th>Compute</th>" in report


def test_resume_refuses_a_running_or_finished_run(cohort, reference, tmp_path):
    result = CliRunner().invoke(app, ["resume", str(reference)])
    assert result.exit_code == 2 and "this run finished" in result.output
    holder = RunDirectory.create(tmp_path / "busy")
    update_run_info(holder.partial, status="running")
    result = CliRunner().invoke(app, ["resume", str(holder.partial)])
    assert result.exit_code == 2 and "another run is writing here" in result.output
    assert not mark_if_crashed(holder.partial)  # alive: its lock is held
    assert json.loads((holder.partial / "run.json").read_text())["status"] == "running"
    holder.release()  # as the kernel does when a process dies
    assert mark_if_crashed(holder.partial) and not mark_if_crashed(holder.partial)
    assert json.loads((holder.partial / "run.json").read_text())["status"] == "crashed"
    holder.remove()
    assert CliRunner().invoke(app, ["resume", str(tmp_path / "nowhere")]).exit_code == 2


# -- 5. the report of an interrupted run ---------------------------------------------------------
def test_the_report_of_an_interrupted_run_says_incomplete_and_keeps_the_synthetic_banner(tmp_path, monkeypatch):
    from fedcare.runtime.federation import Federation

    config = load_config(ROOT / "configs" / "pain" / "demo.toml", [
        "seeds=[1]", "methods=['FP(N)']", "data.synthetic.frame_scale=0.02", "data.synthetic.subjects=[42,43,80]",
        "protocol.subjects=[43,80]", "protocol.pretrain_subjects=[42]", "protocol.image_size=16",
        "protocol.last_session=3", "train.rounds=1"])
    calls = []
    real = Federation.train_phase

    def stop_in_session_2(self, phase, *args, **kwargs):
        calls.append(phase)
        if phase == "session-2":
            raise KeyboardInterrupt
        return real(self, phase, *args, **kwargs)

    monkeypatch.setattr(Federation, "train_phase", stop_in_session_2)
    with pytest.raises(KeyboardInterrupt):
        run_study(config, tmp_path / "run")
    partial = tmp_path / "run.partial"
    page = build_report(partial).read_text()
    assert "INCOMPLETE: 1 of 3 units" in page and "SYNTHETIC DATA" in page
    assert json.loads((partial / "run.json").read_text())["synthetic"] is True
    # `fedcare report X.partial`: the printed summary and every Markdown table say it too
    result = CliRunner().invoke(app, ["report", str(partial)])
    assert result.exit_code == 0 and result.output.startswith("**INCOMPLETE: 1 of 3 units (the run interrupted)")
    tables = sorted((partial / "tables").glob("*.md"))
    assert tables and all(t.read_text().startswith("**INCOMPLETE: 1 of 3 units") for t in tables)
    assert all(t.read_text().count("INCOMPLETE") == 1 for t in tables)  # rebuilt, not stacked


# -- 6 and 7. config ranges -------------------------------------------------------------------
@pytest.mark.parametrize("protocol, message", [
    ("subjects = [42, 43]\npretrain_subjects = [42]", r"protocol.subjects: \[42\] are also pretraining subjects"),
    ("last_session = 0", "protocol.last_session: Input should be greater than or equal to 1"),
    ("last_session = -1", "protocol.last_session: Input should be greater than or equal to 1"),
    ("subjects = []", "protocol.subjects: List should have at least 1 item"),
    ("subjects = [43, 43]", r"protocol.subjects: .*listed twice: \[43\]"),
])
def test_config_ranges_are_checked_before_anything_runs(tmp_path, protocol, message):
    (tmp_path / "exp.toml").write_text(f'methods = ["F(C)"]\n[data]\nroot = "unbc"\n[protocol]\n{protocol}\n')
    with pytest.raises(ConfigError, match=message):
        load_config(tmp_path / "exp.toml")


def test_overlap_can_be_allowed_and_the_report_warns(cohort, tmp_path):
    config = pain_config(cohort, subjects=[42, 43], allow_overlap=True).model_copy(
        update={"seeds": [5], "methods": ["F(C)"]})
    run = run_study(config, tmp_path / "run")
    assert "WARNING: subjects [42] are both pretraining and test subjects" in (run / "report.html").read_text()


# -- 8 to 10. one line for bad input, never a traceback -----------------------------------
def _fails_cleanly(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in result.output.replace("\n", " ")


def test_bad_input_is_one_line_naming_the_file_or_key(cohort, tmp_path, monkeypatch):
    runner = CliRunner()
    binary = tmp_path / "binary.toml"
    binary.write_bytes(bytes(range(256)))
    _fails_cleanly(runner.invoke(app, ["run", str(binary)]), str(binary), "not a text file")
    _fails_cleanly(runner.invoke(app, ["run", str(tmp_path)]), str(tmp_path), "is a directory")
    both = tmp_path / "both.toml"
    both.write_text('methods = ["F(N)"]\n[data]\nroot = "x"\n[data.synthetic]\nseed = 1\n')
    _fails_cleanly(runner.invoke(app, ["run", str(both)]), "exactly one of data.root (a copy of the dataset) or [data.synthetic]")
    fh2 = tmp_path / "fh2.toml"
    fh2.write_text('study = "fedhealth2"\nmethods = ["fedbn"]\n[data]\ndataset = "pamap2"\n[data.synthetic]\n'
                   'subjects = 2\nseconds_per_activity = 5.0\n[protocol]\nclients = 500\n')
    _fails_cleanly(runner.invoke(app, ["run", str(fh2), "--out", str(tmp_path / "fh2")]), "protocol.clients = 500")
    config = write_config(tmp_path / "exp.toml", pain_config(cohort))

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", kwargs.get("dir") or args[0])

    monkeypatch.setattr("tempfile.mkdtemp", read_only)
    _fails_cleanly(runner.invoke(app, ["run", str(config), "--out", str(tmp_path / "ro" / "run")]),
                   str(tmp_path / "ro" / "run"), "Read-only file system")
    _fails_cleanly(runner.invoke(app, ["data", "synth", "pain", str(tmp_path / "ro" / "cohort"), "--subjects", "43"]),
                   str(tmp_path / "ro" / "cohort"), "Read-only file system")


def test_a_subject_without_frames_is_named_with_its_folder(cohort, tmp_path):
    import shutil

    root = tmp_path / "unbc"
    shutil.copytree(cohort, root)
    for image in (root / "Images").glob("080-*/*/*.png"):
        image.unlink()
    config = write_config(tmp_path / "exp.toml", pain_config(root))
    result = CliRunner().invoke(app, ["run", str(config), "--out", str(tmp_path / "run")])
    folder = next((root / "Images").glob("080-*"))
    _fails_cleanly(result, f"subject 80 has no frames in {folder}")


# -- 11. strict JSON ---------------------------------------------------------------------------
def test_metrics_jsonl_is_strict_json_with_null_for_nan(reference):
    def refuse(constant):
        raise ValueError(f"bare {constant} in metrics.jsonl")

    records = [json.loads(line, parse_constant=refuse) for line in (reference / "metrics.jsonl").read_text().splitlines()]
    # PR-AUC is undefined on a session without pain frames: null, read back as NaN by the reports
    assert any(r.get("pr_auc", 0) is None for r in records if r["type"] == "client_eval")
    assert not any(isinstance(v, float) and math.isnan(v) for r in records for v in r.values())


# -- 12. progress when output is not a terminal ---------------------------------------------------
def test_progress_is_printed_as_plain_lines_when_stderr_is_not_a_terminal(cohort, tmp_path):
    from fedcare.progress import PlainProgress

    one_seed = pain_config(cohort).model_copy(update={"seeds": [5], "random_seeds": None})
    config = write_config(tmp_path / "exp.toml", one_seed)
    proc = cli("run", str(config), "--out", str(tmp_path / "run"))
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("[")]
    assert lines and lines[-1].startswith("[7/7] 100% seed 5:") and any("ETA" in line for line in lines)
    assert "finished" in (tmp_path / "run" / "run.log").read_text()
    # the ETA: 2 of 10 units in 20 s -> 80 s to go
    clock = iter([0.0, 10.0, 20.0])
    lines = []
    plain = PlainProgress(stream=type("S", (), {"write": lambda self, s: lines.append(s), "flush": lambda self: None})(),
                          clock=lambda: next(clock))
    plain("seed 1: A session 1", 1, 10, task="units")  # one task, whatever each unit's description
    plain("pretrain C", 2, 10, task="units")
    assert "ETA 0m10s" not in "".join(lines) and "[2/10]  20% pretrain C (elapsed 0m10s, ETA 1m20s)" in "".join(lines)


# -- 13. permissions -----------------------------------------------------------------------------
def test_outputs_follow_the_umask_and_private_state_is_0600(reference, tmp_path):
    from fedcare.files import umask
    from fedcare.runtime.flower.certs import make_site_key

    public = 0o666 & ~umask()
    for name in ["report.html", "tables/summary.csv", "plots/val_loss.png", "metrics.jsonl", "run.json", "config.toml"]:
        assert (reference / name).stat().st_mode & 0o777 == public, name
    private, _ = make_site_key(tmp_path, "hospital-a")
    assert private.stat().st_mode & 0o777 == 0o600


def test_a_sites_state_file_is_private_from_creation(tmp_path):
    import torch

    from fedcare.runtime.flower.site import SiteNode

    node = SiteNode.__new__(SiteNode)
    node.runner, node.namespace, node.algorithm_name = None, None, ""
    node.save(tmp_path / "state" / "client.pt")
    assert (tmp_path / "state" / "client.pt").stat().st_mode & 0o777 == 0o600
    assert torch.load(tmp_path / "state" / "client.pt", weights_only=True)["meta"] == {}


# -- 14. a killed generator's temp folder ------------------------------------------------------------
def test_a_sigkilled_generators_temp_folder_is_removed_by_the_next_one(tmp_path):
    code = ("import os, sys\nfrom fedcare.data.synthetic import output\n"
            "with output.atomic_directory(__import__('pathlib').Path(sys.argv[1])) as tmp:\n"
            "    (tmp / 'big').write_bytes(b'x' * 1000)\n    os.kill(os.getpid(), 9)\n")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "cohort")])
    left = list(tmp_path.glob(".cohort.*.tmp"))
    assert len(left) == 1 and (left[0] / "big").is_file()
    result = CliRunner().invoke(app, ["data", "synth", "pain", str(tmp_path / "cohort"), "--subjects", "43",
                                      "--frame-scale", "0.02"])
    assert result.exit_code == 0, result.output
    assert not list(tmp_path.glob(".cohort.*")) and (tmp_path / "cohort" / "Images").is_dir()


# -- also: data summary unbc --strict -----------------------------------------------------------------
def test_summary_strict_fails_where_a_run_would_refuse_the_copy(cohort, tmp_path):
    import shutil

    assert CliRunner().invoke(app, ["data", "summary", "unbc", str(cohort), "--strict", "--no-check-images"]).exit_code == 0
    root = tmp_path / "unbc"
    shutil.copytree(cohort, root)
    next(root.glob("Images/043-*/*/*.png")).unlink()
    result = CliRunner().invoke(app, ["data", "summary", "unbc", str(root), "--strict", "--no-check-images"])
    assert result.exit_code == 1 and "problem(s) that a run refuses (label_without_image)" in result.output
    assert CliRunner().invoke(app, ["data", "summary", "unbc", str(root), "--no-check-images"]).exit_code == 0


def test_resume_refuses_an_edited_config_and_notes_another_version(tmp_path, monkeypatch):
    """Editing config.toml inside a .partial and resuming mixed two experiments silently; a
    resume under another fedcare version overwrote the version silently."""
    interrupted_at_round(monkeypatch, 6, lambda: run_study(fedhealth2_config(), tmp_path / "run"))
    partial = tmp_path / "run.partial"
    info = json.loads((partial / "run.json").read_text())
    assert len(info["config_sha256"]) == 64 and info["fedcare_version"] == fedcare.__version__
    original = (partial / "config.toml").read_text()
    (partial / "config.toml").write_text(original.replace("rounds = 3", "rounds = 2"))
    with pytest.raises(ValueError, match=r"config.toml: changed since the run started"):
        resume_study(partial)
    (partial / "config.toml").write_text(original)
    monkeypatch.setattr(run_record, "__version__", "9.9.9")  # the code resuming it is another release
    resume_study(partial)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["fedcare_version"] == fedcare.__version__  # the version it began with stays
    assert info["version_changes"] == [{"after_units": 5, "fedcare_version": "9.9.9"}]
    assert "under fedcare 9.9.9 (begun under" in (tmp_path / "run" / "run.log").read_text()
    assert any(n.startswith("Resumed after 5 finished units under fedcare 9.9.9") for n in info["notes"])


def test_resume_never_runs_code_from_a_checkpoint_and_names_a_damaged_one(tmp_path, monkeypatch):
    """`fedcare resume` unpickled checkpoint.pt with weights_only=False: a crafted one (a pickle
    whose __reduce__ calls os.system) ran its command. Run directories are shared and copied."""
    import io
    import pickle

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    interrupted_at_round(monkeypatch, 6, lambda: run_study(fedhealth2_config(), tmp_path / "run"))
    partial = tmp_path / "run.partial"
    honest = (partial / CHECKPOINT_FILE).read_bytes()
    buffer = io.BytesIO()
    torch.save({"units": [], "state": {"x": Payload()}, "offset": 0}, buffer, pickle_module=pickle)
    (partial / CHECKPOINT_FILE).write_bytes(buffer.getvalue())
    result = CliRunner().invoke(app, ["resume", str(partial)])
    assert result.exit_code == 2 and "refused: it names posix.system, not tensors" in " ".join(result.output.split())
    assert not (tmp_path / "pwned").exists() and "Traceback" not in result.output
    (partial / CHECKPOINT_FILE).write_bytes(honest[: len(honest) // 2])  # truncated
    result = CliRunner().invoke(app, ["resume", str(partial)])
    assert result.exit_code == 2 and "damaged, cannot be read" in result.output and "Traceback" not in result.output
    (partial / CHECKPOINT_FILE).write_bytes(honest)
    resume_study(partial)  # fedcare's own checkpoint still resumes (weights only, its classes allowed)
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "finished"


@pytest.mark.parametrize("privacy", [{"client_dp": {"noise_multiplier": 0.5}}, {"dp_sgd": {"noise_multiplier": 0.5}},
                                     {"secure_aggregation": {}}], ids=["client_dp", "dp_sgd", "secagg"])
def test_a_protected_run_resumes_from_its_weights_only_checkpoint(tmp_path, monkeypatch, privacy):
    """Client DP's server half keeps its settings and its privacy ledger in the checkpoint; DP-SGD's
    accountants and secure aggregation's state must load weights-only too."""
    config = fedhealth2_config().model_copy(update={"methods": ["fedavg"]})
    config = type(config).model_validate({**config.model_dump(), "privacy": privacy})
    reference = run_study(config, tmp_path / "reference")
    interrupted_at_round(monkeypatch, 3, lambda: run_study(config, tmp_path / "run"))
    resume_study(tmp_path / "run.partial")
    assert (tmp_path / "run" / "metrics.jsonl").read_bytes() == (reference / "metrics.jsonl").read_bytes()


def test_training_that_diverges_stops_its_method_and_the_report_says_so(tmp_path):
    """`lr=1e30` gave every loss null and a report with "ACC 8.3%" (DP-SGD without clipping but
    with noise, the other case, is now a config error: tests/test_cli_fuzz.py). Now each
    method stops at its first non-finite loss, with the reason recorded and in the report."""
    config = write_config(tmp_path / "exp.toml", fedhealth2_config())
    result = CliRunner().invoke(app, ["run", str(config), "--out", str(tmp_path / "run"), "--set", "train.lr=1e30",
                                      "--set", "methods=['fedavg','fedbn']"])
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    diverged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
                if json.loads(line)["type"] == "diverged"]
    assert [d["method"] for d in diverged] == ["fedavg", "fedbn"]
    assert all(re.match(r"training diverged: a batch's loss is (nan|inf)", d["reason"]) for d in diverged)
    info = json.loads((run / "run.json").read_text())
    assert info["progress"]["units_done"] == info["progress"]["units_total"]  # the stopped units count as done
    assert sum("stopped: training diverged" in n for n in info["notes"]) == 2
    assert "fedbn (seed 1) stopped: training diverged" in (run / "report.html").read_text()


def test_a_diverged_method_stops_alone_and_the_others_run_as_without_it(tmp_path, monkeypatch):
    from fedcare.algorithms.training import TrainingDiverged
    from fedcare.runtime.federation import Federation

    config = fedhealth2_config().model_copy(update={"methods": ["fedbn", "fedavg"]})
    reference = run_study(config, tmp_path / "reference")
    real = Federation.run_round

    def diverge_in_fedbn_round_2(self, phase, rnd, *args, **kwargs):
        if rnd == 2 and type(self.algorithm.client).__name__ == "FedBNClient":
            raise TrainingDiverged("training diverged: a batch's loss is nan (injected)")
        return real(self, phase, rnd, *args, **kwargs)

    monkeypatch.setattr(Federation, "run_round", diverge_in_fedbn_round_2)
    run_study(config, tmp_path / "run")
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    expected = [json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()]
    # fedavg, after fedbn stopped, is exactly what it is in a run without the divergence
    assert [r for r in records if r.get("method") == "fedavg"] == [r for r in expected if r.get("method") == "fedavg"]
    assert [r["round"] for r in records if r.get("method") == "fedbn" and r["type"] == "round"] == [1]
    assert [(r["method"], r["reason"]) for r in records if r["type"] == "diverged"] == [
        ("fedbn", "training diverged: a batch's loss is nan (injected)")]


def test_dp_sgd_with_vanishing_noise_reports_no_guarantee():
    from fedcare.privacy.dp_sgd import epsilon

    assert epsilon(torch.tensor([[1e-300, 0.1, 100.0]]), 1e-5) == math.inf
    assert epsilon(torch.tensor([[0.0, 0.1, 100.0]]), 1e-5) == math.inf
    assert 0 < epsilon(torch.tensor([[1.0, 0.1, 100.0]]), 1e-5) < math.inf


def test_secure_aggregation_with_one_client_in_a_round_is_one_clear_line(tmp_path, monkeypatch):
    """It was a SecAggError traceback (exit 1, as for a bug)."""
    from fedcare.privacy.secagg import SecAggError

    def one_client(*args, **kwargs):
        raise SecAggError("secure aggregation needs at least 2 clients in a round; round 1 has 1")

    monkeypatch.setattr(run_module, "run_study", one_client)
    config = write_config(tmp_path / "exp.toml", fedhealth2_config())
    result = CliRunner().invoke(app, ["run", str(config), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "needs at least 2 clients in a round" in result.output
    assert "Traceback" not in result.output


def test_the_kept_note_counts_only_units_whose_checkpoint_was_written(tmp_path, monkeypatch):
    """A full disk while writing a unit's checkpoint: that unit was counted in "kept ... (n of m
    units finished)" although a resume would redo it."""
    from fedcare.studies import checkpoint as checkpoint_module

    real, writes = checkpoint_module.atomic_write_bytes, []

    def full_on_the_third(path, data, **kwargs):
        writes.append(path)
        if len(writes) == 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data, **kwargs)

    monkeypatch.setattr(checkpoint_module, "atomic_write_bytes", full_on_the_third)
    with pytest.raises(OSError) as stopped:
        run_study(fedhealth2_config(), tmp_path / "run")
    assert run_module.stop_note(stopped.value).startswith(f"kept {tmp_path / 'run.partial'} (2 of 10 units finished)")
    info = json.loads((tmp_path / "run.partial" / "run.json").read_text())
    assert info["progress"]["units_done"] == 2
    monkeypatch.undo()
    resume_study(tmp_path / "run.partial")
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "finished"

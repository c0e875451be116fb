"""`fedcare status` (fedcare.studies.status): a run in progress seen twice shows its progress,
then its end; a finished run, one whose process was killed (run.json still says running, no
process holds it) and a run across sites (a saved run directory of a deployed run: its sites'
participation); epsilon per client so far and the ETA; a half-written last line of
metrics.jsonl waits for the next reading. Status never writes to a run nor takes its lock."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.runtime.federation import Federation
from fedcare.studies.run import run_study
from fedcare.studies.status import StatusReader, lock_holder, render

from support import ROOT
from support.fedhealth2 import tiny_config

DEPLOYED = ROOT / "tests" / "golden" / "deployed_run"  # a FedAvg run across three sites; site 101 missed round 2


def files(folder: Path) -> dict[str, tuple[int, int]]:
    """Each file's size and modification time: what a writer would change."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def hold(partial: Path):
    """Hold a run directory's lock as a live run does (its lock file names this process)."""
    handle = open(partial / ".lock", "a+")
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    handle.write(json.dumps({"pid": os.getpid(), "host": os.uname().nodename, "since": "2026-01-01T00:00:00+00:00"}))
    handle.flush()
    return handle


def deployed_in_progress(folder: Path, lines: int, **info) -> Path:
    """The saved deployed run as its coordinator had it after `lines` records: `<folder>.partial`,
    run.json updated with `info` and saying running."""
    partial = folder.with_name(folder.name + ".partial")
    shutil.copytree(DEPLOYED, partial)
    metrics = partial / "metrics.jsonl"
    metrics.write_text("".join(metrics.read_text().splitlines(keepends=True)[:lines]))
    run = json.loads((partial / "run.json").read_text())
    for key in ("finished", "training_seconds", "participation", "missed", "sites", "complete", "incomplete_sites"):
        run.pop(key, None)
    (partial / "run.json").write_text(json.dumps({**run, "status": "running", **info}))
    return partial


def text(status: dict) -> str:
    console = Console(record=True, width=200)
    console.print(render(status))
    return console.export_text()


def test_status_follows_a_run_in_progress_to_its_end_and_never_writes(tmp_path, monkeypatch):
    reached, go = threading.Semaphore(0), threading.Semaphore(0)
    real = Federation.run_round

    def gated(self, *args, **kwargs):  # each round waits for the test
        reached.release()
        assert go.acquire(timeout=300)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Federation, "run_round", gated)
    out, ran = tmp_path / "run", []
    worker = threading.Thread(target=lambda: ran.append(run_study(tiny_config(), out)))
    worker.start()
    try:
        assert reached.acquire(timeout=300)  # round 1 is about to start
        reader = StatusReader(out)
        first = reader.read()
        assert (first["status"], first["unit"], first["units_done"], first["units_total"]) == ("running", 1, 0, 3)
        assert first["current_round"] is None and first["eta_seconds"] is None
        assert first["process"]["pid"] == os.getpid()
        go.release()
        assert reached.acquire(timeout=300)  # round 1 finished (its unit durable), round 2 about to start
        partial = tmp_path / "run.partial"
        before = files(partial)
        second = reader.read()
        assert files(partial) == before and lock_holder(partial)[0] is True  # nothing written; the run holds it
        assert (second["status"], second["unit"], second["units_done"]) == ("running", 2, 1)
        assert second["current_round"] == {"method": "fedavg", "seed": 1, "phase": "train", "round": 1}
        assert second["records"] > first["records"] and second["clients"] == ["0", "1", "2"]
        assert second["elapsed_seconds"] >= first["elapsed_seconds"] and second["eta_seconds"] is not None
        assert "unit 2 of 3 (1 of 3 done)" in text(second) and "fedavg, seed 1, train, round 1" in text(second)
    finally:
        for _ in range(10):
            go.release()
        worker.join(300)
    last = reader.read()  # it finished meanwhile: <out>.partial became <out>
    assert ran == [out] and last["run_dir"] == str(out)
    assert (last["status"], last["units_done"], last["unit"], last["process"]) == ("finished", 3, None, None)
    assert last["current_round"]["round"] == 3 and last["elapsed_seconds"] is not None


def test_a_run_whose_process_was_killed_is_crashed_and_status_leaves_it_so(tmp_path):
    partial = tmp_path / "run.partial"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from fedcare.studies.rundir import RunDirectory, update_run_info\n"
        "run = RunDirectory.create(sys.argv[1])\n"
        "update_run_info(run.partial, study='fedhealth2', status='running', started='2026-01-01T00:00:00+00:00',"
        " progress={'units_done': 2, 'units_total': 9})\n"
        "(run.partial / 'metrics.jsonl').write_text('')\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"), str(tmp_path / "run")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        alive = StatusReader(partial).read()
        assert (alive["status"], alive["unit"], alive["process"]["pid"]) == ("running", 3, holder.pid)
    finally:
        holder.kill()
        holder.wait(60)
    run_json = (partial / "run.json").read_bytes()
    crashed = StatusReader(partial).read()
    assert (crashed["status"], crashed["units_done"], crashed["unit"], crashed["process"]) == ("crashed", 2, None, None)
    assert "fedcare resume" in crashed["error"] and crashed["eta_seconds"] is None
    assert (partial / "run.json").read_bytes() == run_json  # still "running": status records nothing


def test_status_of_a_deployed_run_names_the_sites_that_answered_or_were_missing(tmp_path):
    run = tmp_path / "flower"
    shutil.copytree(DEPLOYED, run)
    done = StatusReader(run).read()
    assert (done["status"], done["runtime"], done["units_done"], done["units_total"]) == ("finished", "flower", 3, 3)
    assert done["sites"] == {"101": {"answered": 2, "late": 0, "missing": 1},
                             "102": {"answered": 3, "late": 0, "missing": 0},
                             "103": {"answered": 3, "late": 0, "missing": 0}}
    assert done["missed"] == [{"site": "101", "operation": "fit", "method": "fedavg", "seed": 1, "phase": "train",
                               "round": 2}]
    assert done["last_exchange"]["round"] == 3 and done["last_exchange"]["answered"] == ["101", "102", "103"]
    # the same run as its coordinator had it in round 3 (after round 2's records), still running
    partial = deployed_in_progress(tmp_path / "live", 13, progress={"units_done": 2, "units_total": 3})
    lock = hold(partial)
    try:
        live = StatusReader(partial).read()
    finally:
        lock.close()
    assert (live["status"], live["unit"], live["runtime"]) == ("running", 3, "flower")
    assert live["sites"]["101"] == {"answered": 1, "late": 0, "missing": 1}
    assert live["last_exchange"] == {"method": "fedavg", "seed": 1, "phase": "train", "round": 2, "operation": "fit",
                                     "answered": ["102", "103"], "late": [], "missing": ["101"]}
    shown = text(live)
    assert "site 101           answered 1, late 0, missing 1" in shown
    assert "fedavg, seed 1, train, round 2: answered 102, 103; late -; missing 101" in shown


def test_status_gives_epsilon_per_client_so_far_and_an_eta_at_this_processs_pace(tmp_path):
    partial = tmp_path / "dp.partial"
    partial.mkdir()
    since = (datetime.now(timezone.utc) - timedelta(seconds=100)).isoformat(timespec="seconds")
    (partial / "run.json").write_text(json.dumps({
        "study": "pain", "status": "running", "started": "2026-01-01T00:00:00+00:00",
        "progress": {"units_done": 4, "units_total": 10}, "pace": {"since": since, "units_done": 2}}))
    (partial / "config.toml").write_text("[privacy.dp_sgd]\ntarget_epsilon = 8.0\ndelta = 1e-05\n")
    (partial / "metrics.jsonl").write_text("".join(json.dumps(
        {"type": "round", "method": "PFDL", "seed": 1, "phase": "train", "round": r, "dp_epsilon": max(e.values()),
         "dp_epsilon_clients": e}) + "\n" for r, e in ((1, {"43": 0.5, "44": 0.75}), (2, {"43": 1.0, "44": 1.5}))))
    lock = hold(partial)
    try:
        status = StatusReader(partial).read()
    finally:
        lock.close()
    assert status["epsilon"] == [
        {"method": "PFDL (train)", "kind": "dp_sgd", "client": "43", "epsilon": 1.0, "target": 8.0, "skipped": 0},
        {"method": "PFDL (train)", "kind": "dp_sgd", "client": "44", "epsilon": 1.5, "target": 8.0, "skipped": 0}]
    assert 295 <= status["eta_seconds"] <= 310  # 2 units in about 100 s, 6 to go
    assert "PFDL (train) (dp_sgd), client 44: 1.5 of 8" in text(status)


def test_a_half_written_last_line_waits_for_the_next_reading(tmp_path):
    run = tmp_path / "flower"
    shutil.copytree(DEPLOYED, run)
    reader = StatusReader(run)
    whole = reader.read()["records"]
    with open(run / "metrics.jsonl", "a") as metrics:
        metrics.write('{"type": "round", "method": "fedavg", "seed": 1, "phase": "train", "ro')
        metrics.flush()
        half = reader.read()
        metrics.write('und": 4}\n')
    assert half["records"] == whole and half["notes"] == [] and half["current_round"]["round"] == 3
    again = reader.read()
    assert again["records"] == whole + 1 and again["current_round"]["round"] == 4
    # cut back to a checkpoint (a resume): read again from the start
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text("".join(lines[:5]))
    assert reader.read()["records"] == 5


def test_the_status_command_prints_json_and_watches_until_the_run_ends(tmp_path):
    partial = deployed_in_progress(tmp_path / "run", 13, progress={"units_done": 2, "units_total": 3})
    lock = hold(partial)

    def finish():  # as the run's last step does: run.json says finished, <out>.partial becomes <out>
        info = json.loads((partial / "run.json").read_text())
        (partial / "run.json").write_text(json.dumps({**info, "status": "finished",
                                                      "progress": {"units_done": 3, "units_total": 3}}))
        os.rename(partial, tmp_path / "run")
        lock.close()

    timer = threading.Timer(1.0, finish)
    timer.start()
    result = CliRunner().invoke(app, ["status", str(partial), "--watch", "--json", "--interval", "0.2"])
    timer.join()
    assert result.exit_code == 0, result.output
    seen = [json.loads(line) for line in result.output.splitlines()]
    assert seen[0]["status"] == "running" and seen[0]["run_dir"] == str(partial)
    assert (seen[-1]["status"], seen[-1]["run_dir"], seen[-1]["units_done"]) == ("finished", str(tmp_path / "run"), 3)
    for watch in ([], ["--watch"]):  # a run that has ended: shown once, also when watched
        shown = CliRunner().invoke(app, ["status", str(tmp_path / "run"), *watch])
        assert shown.exit_code == 0 and shown.output.count("finished") == 1 and "3 of 3 done" in shown.output
    missing = CliRunner().invoke(app, ["status", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "no such run directory" in missing.output

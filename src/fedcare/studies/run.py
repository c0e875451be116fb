"""The one run sequence every study uses, resuming an interrupted run, and rebuilding a run's
report.

`run_study(config, out)`: take `<out>.partial` (exclusively), write the resolved config, set
the thread count, open metrics.jsonl, give the study's protocol its runtime (every client in
this process, or a runtime whose clients are sites on Flower), write run.json (at the start,
with whether the data are synthetic, and as units finish), run the protocol, build the
report, and rename the directory to `<out>`. A failure or an interruption keeps the partial
directory when it holds finished work, and the exception (re-raised as it was) carries a
note saying what was kept and how to continue (`stop_note`); `resume_study(partial)`
continues it from its last finished unit.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any
from pathlib import Path

from fedcare import __version__
from fedcare.compute import compute_facts, describe, same_arithmetic
from fedcare.config import ConfigError, Experiment, to_toml
from fedcare.errors import InputError
from fedcare.files import atomic_write_text
from fedcare.studies import registry
from fedcare.studies.base import Records, Study, StudyRuntime
from fedcare.studies.checkpoint import Checkpoint
from fedcare.studies.checks import check_before_training, check_methods
from fedcare.studies.load import load_config
from fedcare.studies.rundir import (
    METRICS_FILE,
    Progress,
    RecordsWriter,
    RunDirectory,
    log,
    now,
    read_run_info,
    read_run_records,
    set_threads,
    update_run_info,
)

# (the study bound to its experiment, the records writer) -> the runtime whose clients are the sites
RuntimeFactory = Callable[[Study, Records], StudyRuntime]


class Terminated(BaseException):
    """The process was asked to stop (SIGTERM): handled like Ctrl-C (KeyboardInterrupt)."""


def stop_note(error: BaseException) -> str:
    """What a run that ended with `error` kept and how to continue it ("" if it says nothing)."""
    return "\n".join(n for n in getattr(error, "__notes__", []) if n.startswith(("kept ", "nothing was finished")))


def run_study(
    config: Experiment, out: Path, *, config_file: str = "", progress: Progress | None = None,
    keep_partial: bool = False, runtime_factory: RuntimeFactory | None = None, unique: bool = False,
) -> Path:
    """Run the experiment into the run directory `out` and build its report; returns the run
    directory (`out`, or `out-2`, ... with `unique` when `out` is taken). Default runtime:
    every client in this process (`Study.local_runtime`)."""
    run = RunDirectory.create(out, unique=unique)
    return _run(run, config, config_file=config_file, progress=progress, keep_partial=keep_partial,
                runtime_factory=runtime_factory, saved=None)


def resume_study(partial: Path, *, progress: Progress | None = None,
                 runtime_factory: RuntimeFactory | None = None) -> Path:
    """Continue an interrupted run (its `.partial` directory) from its last finished unit;
    the records end as an uninterrupted run's would. A run across sites continues across the
    sites (`runtime_factory`: `fedcare flower run --resume`), a local one in this process."""
    run = RunDirectory.reopen(partial)
    try:
        config = load_config(run.partial / "config.toml")
        saved = Checkpoint.load(run.partial)
        info = read_run_info(run.partial)[0]
    except BaseException:
        run.release()
        raise
    if (info.get("runtime") == "flower") != (runtime_factory is not None):
        run.release()
        raise InputError(f"{run.partial}: a run across sites continues across them: fedcare flower run --resume "
                         f"{run.partial} --federation NAME" if runtime_factory is None else
                         f"{run.partial}: a run in one process continues there: fedcare resume {run.partial}")
    return _run(run, config, config_file=str(info.get("config_file", "")), progress=progress, keep_partial=True,
                runtime_factory=runtime_factory, saved=saved or {})


def _run(run: RunDirectory, config: Experiment, *, config_file: str, progress: Progress | None, keep_partial: bool,
         runtime_factory: RuntimeFactory | None, saved: dict | None) -> Path:
    study = registry.study_for(config)
    partial = run.partial
    records = None
    checkpoint = None
    try:
        resumed = saved is not None
        set_threads(config)
        study.compute.apply()  # an unavailable device stops the run here (a ConfigError naming runtime.device)
        compute = {**compute_facts(), **study.compute.facts()}
        if resumed:
            info = read_run_info(partial)[0]
            started = info.get("started", now())
            _check_same_experiment(partial, info)
        else:
            atomic_write_text(partial / "config.toml", to_toml(config))
            started = now()
            update_run_info(partial, config_sha256=config_digest(partial))
        log(partial, f"{'resumed' if resumed else 'started'} {study.name} run {run.out.name} (pid {_pid()})")
        records = RecordsWriter(partial / METRICS_FILE, truncate_to=(saved or {}).get("offset", 0) if resumed else None)
        update_run_info(partial, run_dir=run.out.name, study=study.name, title=config.title, config_file=config_file,
                        seeds=config.seeds, methods=config.methods, started=started, status="running")
        # the arithmetic the run began on, and each resume on other arithmetic since (for the notes)
        begun, changes = (info.get("compute"), list(info.get("compute_changes", []))) if resumed else (compute, [])
        if not resumed:
            update_run_info(partial, compute=compute)
        elif isinstance(begun, dict) and not same_arithmetic(begun, compute):
            done = (info.get("progress") or {}).get("units_done", 0)
            log(partial, f"resumed after {done} units on other arithmetic: {describe(compute)} "
                         f"(begun on {describe(begun)})")
            changes.append({"after_units": done, "compute": compute})
            update_run_info(partial, compute_changes=changes)
        versions = list(info.get("version_changes", [])) if resumed else []
        if resumed and info.get("fedcare_version") not in (None, __version__):
            done = (info.get("progress") or {}).get("units_done", 0)
            log(partial, f"resumed after {done} units under fedcare {__version__} (begun under {info['fedcare_version']})")
            versions.append({"after_units": done, "fedcare_version": __version__})
            update_run_info(partial, version_changes=versions)
        check_methods(study)  # before any data are read: every method builds, with its stack
        runtime = study.local_runtime(partial, progress) if runtime_factory is None else runtime_factory(study, records.write)
        _check_robustness(study, runtime)
        check_before_training(study, runtime)  # the methods again, the runtime's wiring, the model's outputs
        if hasattr(runtime, "start_facts"):  # a run across sites: said from the start (a resume goes across them too)
            update_run_info(partial, **runtime.start_facts())
        checkpoint = Checkpoint(partial, records, saved)
        protocol = study.protocol(runtime, records.write, progress, checkpoint)
        if checkpoint is not None:
            checkpoint.units_total = protocol.units_total
        update_run_info(partial, synthetic=runtime.synthetic,
                        progress={"units_done": protocol.units_done, "units_total": protocol.units_total})
        t0 = time.perf_counter()
        protocol.run()
        seconds = time.perf_counter() - t0
        records.sync()
        update_run_info(partial, **protocol.facts(), finished=now(), training_seconds=round(seconds, 2),
                        notes=runtime.notes() + protocol.notes() + _diverged_notes(partial)
                        + _compute_notes(begun, changes)
                        + _version_notes(info.get("fedcare_version") if resumed else None, versions)
                        + _reproducibility_notes(study) + _robustness_notes(study),
                        status="finished",
                        progress={"units_done": protocol.units_done, "units_total": protocol.units_total},
                        **runtime.facts())
        build_report(partial)
        log(partial, "finished")
        records.close()
        return run.finish()
    except BaseException as e:
        if records is not None:
            records.close()
        e.add_note(_stopped(run, e, keep_partial, checkpoint))
        raise


def _diverged_notes(run_dir: Path) -> list[str]:
    """The report's note for each method whose training stopped on a loss that was not a number."""
    records, _ = read_run_records(run_dir)
    notes = []
    for r in records:
        if r.get("type") == "diverged":
            which = f"{r['method']} (seed {r['seed']}" + (f", {r['model']}'s model" if r.get("model") else "") + ")"
            notes.append(f"{which} stopped: {r['reason']}. Its rows cover only what it finished before; the other "
                         "methods ran on.")
    return notes


def _check_robustness(study: Study, runtime: Any) -> None:
    """`[robustness]` against the clients the runtime holds (in process: every site; across
    sites: the study's list): attackers that are no client, too few clients for the rule."""
    from fedcare.algorithms.robust import clients_problem

    clients = list(getattr(runtime, "sites", None) or study.clients())
    problem = clients_problem(study.config.robustness, clients) if clients else None
    if problem:
        raise ConfigError(problem)


def _robustness_notes(study: Study) -> list[str]:
    from fedcare.algorithms.robust import describe as describe_robustness

    note = describe_robustness(study.config.robustness)
    return [note] if note else []


def _compute_notes(begun: dict | None, changes: list[dict]) -> list[str]:
    """The report's notes on a run resumed on other arithmetic than it began with (`begun`)."""
    return [f"Resumed after {c.get('after_units', '?')} finished units on other arithmetic ({describe(c['compute'])}; "
            f"begun on {describe(begun)}): the records after that may differ from an uninterrupted run's by float "
            f"rounding." for c in changes if isinstance(begun, dict)]


def config_digest(run_dir: Path) -> str:
    """SHA-256 of a run's config.toml, as written when it started."""
    return hashlib.sha256((Path(run_dir) / "config.toml").read_bytes()).hexdigest()


def _check_same_experiment(partial: Path, info: dict) -> None:
    """A resume continues the experiment the run began: refuse a config.toml edited since
    (its records would mix two experiments under one config)."""
    began = info.get("config_sha256")
    if began is not None and config_digest(partial) != began:
        raise InputError(f"{partial / 'config.toml'}: changed since the run started; a resume continues the "
                         "experiment it began (restore the file, or start a new run with `fedcare run`)")


def _version_notes(began: str | None, versions: list[dict]) -> list[str]:
    """The report's notes on a run resumed under another fedcare version than it began with."""
    return [f"Resumed after {v.get('after_units', '?')} finished units under fedcare {v['fedcare_version']} (begun "
            f"under {began}): the records after that come from that version's code." for v in versions if began]


def _reproducibility_notes(study: Study) -> list[str]:
    """The report's note when a rerun of this run may not give the same numbers bit for bit."""
    why = study.compute.reproducible()
    return [f"Not bit-reproducible: {why}."] if why else []


def _pid() -> int:
    import os

    return os.getpid()


def _stopped(run: RunDirectory, error: BaseException, keep_partial: bool, checkpoint: Checkpoint | None) -> str:
    """Keep the partial directory if it holds finished work (or asked to), else remove it;
    returns the note saying which, and how to continue."""
    interrupted = isinstance(error, (KeyboardInterrupt, Terminated))
    why = {KeyboardInterrupt: "interrupted (Ctrl-C)", Terminated: "stopped (SIGTERM)"}.get(type(error)) or str(error)
    done = checkpoint.units_done if checkpoint is not None else 0
    total = checkpoint.units_total if checkpoint is not None else 0
    if done or keep_partial:
        try:
            log(run.partial, f"stopped: {why}")
            update_run_info(run.partial, status="interrupted" if interrupted else "failed", error=why)
        except OSError:
            pass  # e.g. the disk is full: what is on it stays
        run.release()
        what = f"{done} of {total} units finished" if total else "nothing finished"
        flower = read_run_info(run.partial)[0].get("runtime") == "flower"
        how = f"fedcare flower run --resume {run.partial} --federation NAME" if flower else f"fedcare resume {run.partial}"
        return f"kept {run.partial} ({what}); continue with: {how}"
    run.remove()
    return "nothing was finished; nothing kept"


def study_of_run(run_dir: Path) -> tuple[type[Study], dict, list[str]]:
    """(the study class, run.json, notes about reading it) of a run directory."""
    run_info, notes = read_run_info(run_dir)
    name = str(run_info.get("study") or registry.DEFAULT_STUDY).strip()
    try:
        study = registry.get(name)
    except registry.UnknownStudy as e:
        raise InputError(f"{Path(run_dir) / 'run.json'}: {e}") from None
    return study, run_info, notes


def build_report(run_dir: Path) -> Path:
    """Write the tables, plots and report.html of a run directory (run.json's study; pain
    when run.json does not say) from its metrics.jsonl; returns report.html's path. An
    unfinished run's report says so at the top."""
    from fedcare.privacy.report import privacy_notes, write_budget_table
    from fedcare.report.html import incomplete_text

    study, run_info, notes = study_of_run(run_dir)
    page = study.build_report(Path(run_dir), run_info, notes + privacy_notes(run_dir))
    write_budget_table(Path(run_dir))  # DP's per-client epsilon, whatever the study
    banner = incomplete_text(run_info)
    if banner:  # the tables say it too, as report.html does
        for table in sorted((Path(run_dir) / "tables").glob("*.md")):
            atomic_write_text(table, f"**{banner}**\n\n{table.read_text()}")
    return page


def summary_markdown(run_dir: Path) -> str:
    """The summary table of a run directory, in Markdown (under the INCOMPLETE line when the
    run did not finish)."""
    from fedcare.report.html import incomplete_text  # the report stack: not in a site's process

    study, run_info, _ = study_of_run(run_dir)
    banner = incomplete_text(run_info)
    summary = study.summary_markdown(Path(run_dir))
    return f"**{banner}**\n\n{summary}" if banner else summary

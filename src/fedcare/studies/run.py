"""The one run sequence every study uses, resuming an interrupted run, and rebuilding a run's
report.

`run_study(config, out)`: take `<out>.partial` (exclusively), write the resolved config, set
the thread count, open metrics.jsonl, give the study's protocol its runtime (every client in
this process, or a runtime whose clients are sites on Flower), write run.json (at the start,
with whether the data are synthetic, and as units finish), run the protocol, build the
report, and rename the directory to `<out>`. What run.json and run.log say along the way is
the run's bookkeeping (`fedcare.studies.run_record.RunRecord`). A failure or an interruption
keeps the partial directory when it holds finished work, and the exception (re-raised as it
was) carries a note saying what was kept and how to continue (`stop_note`);
`resume_study(partial)` continues it from its last finished unit.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedcare.config import ConfigError, Experiment
from fedcare.errors import InputError
from fedcare.files import atomic_write_text
from fedcare.runtime.digest import package_digest
from fedcare.runtime.lineage import Lineage
from fedcare.studies import registry
from fedcare.studies.base import Records, Study, StudyRuntime
from fedcare.studies.checkpoint import Checkpoint
from fedcare.studies.checks import check_before_training, check_methods
from fedcare.studies.load import load_config
from fedcare.studies.run_record import RunRecord, config_digest
from fedcare.studies.rundir import METRICS_FILE, Progress, RecordsWriter, RunDirectory, read_run_info, set_threads

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
        info = read_run_info(run.partial)[0]
        config = load_config(run.partial / "config.toml", recorded=info.get("study_source"))
        saved = Checkpoint.load(run.partial)
    except BaseException:
        run.release()
        raise
    if (info.get("runtime") == "flower") != (runtime_factory is not None):
        run.release()
        raise InputError(f"{run.partial}: a run across sites continues across them: fedcare flower run --resume "
                         f"{run.partial} --federation NAME" if runtime_factory is None else
                         f"{run.partial}: a run in one process continues there: fedcare resume {run.partial}")
    return _run(run, config, config_file=str(info.get("config_file", "")), progress=progress, keep_partial=True,
                runtime_factory=runtime_factory, saved=saved or {}, recorded=info.get("study_source"))


def _run(run: RunDirectory, config: Experiment, *, config_file: str, progress: Progress | None, keep_partial: bool,
         runtime_factory: RuntimeFactory | None, saved: dict | None, recorded: Any = None) -> Path:
    study = registry.study_for(config, recorded)
    record = RunRecord(run, study, resumed=saved is not None)
    records = checkpoint = lineage = None
    try:
        set_threads(config)
        study.compute.apply()  # an unavailable device stops the run here (a ConfigError naming runtime.device)
        if record.resumed:
            _check_same_experiment(run.partial, record.before)
        record.begin(config_file)
        record.update(study_source=_source(study, recorded))
        offset = saved.get("offset", 0) if record.resumed else None  # a resume drops what an unfinished unit wrote
        records = RecordsWriter(run.partial / METRICS_FILE, truncate_to=offset)
        lineage = _lineage(run, study, saved)
        check_methods(study)  # before any data are read: every method builds, with its stack
        runtime = (study.local_runtime(run.partial, progress) if runtime_factory is None
                   else runtime_factory(study, records.write))
        runtime.lineage = lineage  # every federation the runtime builds is recorded there
        _check_robustness(study, runtime)
        check_before_training(study, runtime)  # the methods again, the runtime's wiring, the model's outputs
        record.runtime_ready(runtime)
        checkpoint = Checkpoint(run.partial, records, saved, on_commit=record.unit_finished, lineage=lineage)
        protocol = study.protocol(runtime, records.write, progress, checkpoint)
        checkpoint.units_total = protocol.units_total
        record.planned(runtime, protocol)
        t0 = time.perf_counter()
        protocol.run()
        seconds = time.perf_counter() - t0
        records.sync()
        record.finish(runtime, protocol, seconds)
        build_report(run.partial)
        record.reported()
        records.close()
        lineage.close()
        return run.finish()
    except BaseException as e:
        if records is not None:
            records.close()
        if lineage is not None:
            lineage.close()
        e.add_note(_stopped(run, record, e, keep_partial, checkpoint))
        raise


def _lineage(run: RunDirectory, study: Study, saved: dict | None) -> Lineage:
    """The run's lineage (lineage.jsonl, models/); a resume cuts it back to the checkpoint (a
    checkpoint written before fedcare kept a lineage: it starts at the resumed unit)."""
    config = study.config
    robustness = None
    if config.robustness is not None:
        attack = config.robustness.attack
        robustness = {"rule": config.robustness.rule, "attackers": [str(c) for c in attack.clients] if attack else []}
    top = type(study).__module__.partition(".")[0]
    own = None if top == "fedcare" else getattr(sys.modules.get(top), "__file__", None)  # a study from another package
    return Lineage(run.partial, config_sha256=config_digest(run.partial), robustness=robustness,
                   study_code=package_digest(Path(own).parent) if own else None,
                   truncate_to=(saved.get("lineage_offset") or 0) if saved is not None else None)


def _source(study: Study, recorded: Any) -> dict:
    """Where the study comes from, for run.json: as registered now, else as the run recorded it."""
    try:
        return registry.source_of(study.name).record()
    except registry.UnknownStudy:
        return dict(recorded)


def _check_robustness(study: Study, runtime: StudyRuntime) -> None:
    """`[robustness]` against the clients the runtime holds (in process: every site; across
    sites: the study's list): attackers that are no client, too few clients for the rule."""
    from fedcare.algorithms.robust import clients_problem

    clients = list(runtime.sites or study.clients())
    problem = clients_problem(study.config.robustness, clients) if clients else None
    if problem:
        raise ConfigError(problem)


def _check_same_experiment(partial: Path, info: dict) -> None:
    """A resume continues the experiment the run began: refuse a config.toml edited since
    (its records would mix two experiments under one config)."""
    began = info.get("config_sha256")
    if began is not None and config_digest(partial) != began:
        raise InputError(f"{partial / 'config.toml'}: changed since the run started; a resume continues the "
                         "experiment it began (restore the file, or start a new run with `fedcare run`)")


def _stopped(run: RunDirectory, record: RunRecord, error: BaseException, keep_partial: bool,
             checkpoint: Checkpoint | None) -> str:
    """Keep the partial directory if it holds finished work (or asked to), else remove it;
    returns the note saying which, and how to continue."""
    interrupted = isinstance(error, (KeyboardInterrupt, Terminated))
    why = {KeyboardInterrupt: "interrupted (Ctrl-C)", Terminated: "stopped (SIGTERM)"}.get(type(error)) or str(error)
    done = checkpoint.units_done if checkpoint is not None else 0
    total = checkpoint.units_total if checkpoint is not None else 0
    if done or keep_partial:
        record.stopped(why, interrupted)
        run.release()
        what = f"{done} of {total} units finished" if total else "nothing finished"
        flower = read_run_info(run.partial)[0].get("runtime") == "flower"
        how = f"fedcare flower run --resume {run.partial} --federation NAME" if flower else f"fedcare resume {run.partial}"
        return f"kept {run.partial} ({what}); continue with: {how}"
    record.discarded(interrupted)
    run.remove()
    return "nothing was finished; nothing kept"


def study_of_run(run_dir: Path) -> tuple[type[Study], dict, list[str]]:
    """(the study class, run.json, notes about reading it) of a run directory."""
    run_info, notes = read_run_info(run_dir)
    name = str(run_info.get("study") or registry.DEFAULT_STUDY).strip()
    try:
        study = registry.get(name, run_info.get("study_source"))
    except registry.UnknownStudy as e:
        raise InputError(f"{Path(run_dir) / 'run.json'}: {e}") from None
    return study, run_info, notes


def build_report(run_dir: Path) -> Path:
    """Write the tables, plots and report.html of a run directory (run.json's study; pain
    when run.json does not say) from its metrics.jsonl; returns report.html's path. An
    unfinished run's report says so at the top."""
    from fedcare.privacy.report import privacy_notes, write_privacy_tables
    from fedcare.report.html import banner_texts

    study, run_info, notes = study_of_run(run_dir)
    page = study.build_report(Path(run_dir), run_info, notes + privacy_notes(run_dir))
    write_privacy_tables(Path(run_dir))  # DP's per-client epsilon and the one-run audit, whatever the study
    banners = banner_texts(run_info)
    if banners:  # the tables say it too, as report.html does
        for table in sorted((Path(run_dir) / "tables").glob("*.md")):
            atomic_write_text(table, "".join(f"**{b}**\n\n" for b in banners) + table.read_text())
    return page


def summary_markdown(run_dir: Path) -> str:
    """The summary table of a run directory, in Markdown (under the INCOMPLETE line when the
    run did not finish)."""
    from fedcare.report.html import banner_texts  # the report stack: not in a site's process

    study, run_info, _ = study_of_run(run_dir)
    summary = study.summary_markdown(Path(run_dir))
    return "".join(f"**{b}**\n\n" for b in banner_texts(run_info)) + summary

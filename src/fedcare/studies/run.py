"""The one run sequence every study uses, and rebuilding a run's report.

`run_study(config, out)`: create `<out>.partial`, write the resolved config, set the thread
count, open metrics.jsonl, give the study's protocol its runtime (every client in this
process, or a runtime whose clients are sites on Flower), run it, write run.json and the
report, and rename the directory to `<out>` (see `fedcare.studies.rundir`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from fedcare.config import Experiment, to_toml
from fedcare.studies import registry
from fedcare.studies.base import Records, Study, StudyRuntime
from fedcare.studies.rundir import Progress, partial_run_directory, read_run_info, records_writer, start_run, write_run_info

# (the study bound to its experiment, the records writer) -> the runtime whose clients are the sites
RuntimeFactory = Callable[[Study, Records], StudyRuntime]


def run_study(
    config: Experiment, out: Path, *, config_file: str = "", progress: Progress | None = None,
    keep_partial: bool = False, runtime_factory: RuntimeFactory | None = None,
) -> Path:
    """Run the experiment into the run directory `out` and build its report; returns `out`.
    Default runtime: every client in this process (`Study.local_runtime`)."""
    study = registry.study_for(config)
    with partial_run_directory(out, keep_partial) as partial:
        started = start_run(partial, config, to_toml(config))
        with records_writer(partial / "metrics.jsonl") as write:
            if runtime_factory is None:
                runtime = study.local_runtime(partial, progress)
            else:
                runtime = runtime_factory(study, write)
            protocol = study.protocol(runtime, write, progress)
            t0 = time.perf_counter()
            protocol.run()
            seconds = time.perf_counter() - t0
        write_run_info(
            partial, out, study=study.name, title=config.title, synthetic=runtime.synthetic, config_file=config_file,
            seeds=config.seeds, methods=config.methods, **protocol.facts(), started=started,
            training_seconds=round(seconds, 2), notes=runtime.notes(), **runtime.facts(),
        )
        build_report(partial)
    return Path(out)


def study_of_run(run_dir: Path) -> tuple[type[Study], dict, list[str]]:
    """(the study class, run.json, notes about reading it) of a run directory."""
    run_info, notes = read_run_info(run_dir)
    name = str(run_info.get("study") or registry.DEFAULT_STUDY).strip()
    try:
        study = registry.get(name)
    except registry.UnknownStudy as e:
        raise ValueError(f"{Path(run_dir) / 'run.json'}: {e}") from None
    return study, run_info, notes


def build_report(run_dir: Path) -> Path:
    """Write the tables, plots and report.html of a run directory (run.json's study; pain
    when run.json does not say) from its metrics.jsonl; returns report.html's path."""
    study, run_info, notes = study_of_run(run_dir)
    return study.build_report(Path(run_dir), run_info, notes)


def summary_markdown(run_dir: Path) -> str:
    """The summary table of a run directory, in Markdown."""
    return study_of_run(run_dir)[0].summary_markdown(Path(run_dir))

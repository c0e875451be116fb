"""The `fedcare` command line: demo, run, resume, report, status, export and data commands."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from fedcare.data.cli import data_app
from fedcare.deployment.cli import flower_app
from fedcare.errors import TRACEBACK_VARIABLE, UserError, tracebacks_wanted
from fedcare.progress import progress_reporter
from fedcare.studies import registry

app = typer.Typer(help="fedcare: personalized, privacy-preserving federated learning on healthcare data.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
new_app = typer.Typer(help="Start your own: `fedcare new study NAME DIR` writes a study package.", no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(flower_app, name="flower")
app.add_typer(new_app, name="new")
console = Console(stderr=True)


@app.callback()
def _options(
    show_traceback: Annotated[bool, typer.Option("--traceback", help=f"Show the traceback of a user error too (one line "
                                                                f"without it); the same as {TRACEBACK_VARIABLE}=1.")] = False,
) -> None:
    if show_traceback:  # the environment carries it to every command, and to the processes a command starts
        os.environ[TRACEBACK_VARIABLE] = "1"


def _fail(message: str, code: int = 2) -> None:
    """One line (or a few) on stderr, no traceback; every piece of user text escaped."""
    first, *rest = message.split("\n")
    console.print(f"[bold red]error:[/] {escape(first)}", highlight=False, soft_wrap=True)
    for line in rest:
        console.print(escape(line), highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _user_error(e: UserError) -> None:
    """A mistake the user can fix: one line, exit 2; with --traceback (FEDCARE_TRACEBACK=1), where it was raised too."""
    if tracebacks_wanted():
        traceback.print_exc()  # Python's own: every file and line, unwrapped, as a bug report wants them
    _fail(str(e))


def _os_error(e: OSError) -> str:
    """An operating-system error as `path: what`, e.g. a read-only or full disk."""
    where = e.filename if e.filename is not None else ""
    return f"{where}: {e.strerror or e}" if where else str(e)


@contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    """SIGTERM (a scheduler stopping the job) ends the run as Ctrl-C does: finished work is kept."""
    from fedcare.studies.run import Terminated

    def stop(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stopped(e: BaseException) -> None:
    """A run that ended early: why, what was kept and how to continue (the exception's note);
    the exit code says how it ended. What a user can fix (`fedcare.errors.UserError`) and an
    operating-system error (a full disk) are one line, exit 2; anything else is a bug, with its
    traceback, exit 1 (`--traceback`: user errors too)."""
    from fedcare.studies.run import Terminated, stop_note

    note = stop_note(e)
    if isinstance(e, KeyboardInterrupt):  # SIGINT: Ctrl-C, or one a library raised in this process (OpenBLAS
        # does when it cannot create its threads, after an "OpenBLAS blas_thread_init" line): Python cannot tell which
        _fail(f"interrupted (Ctrl-C)\n{note}", 130)
    if isinstance(e, Terminated):
        _fail(f"stopped (SIGTERM)\n{note}", 143)
    if isinstance(e, (UserError, OSError)):  # what the user can fix, and the machine's state (a full disk)
        if tracebacks_wanted():
            traceback.print_exc()  # Python's own: every file and line, unwrapped, as a bug report wants them
        _fail(f"{e if isinstance(e, UserError) else _os_error(e)}\n{note}".strip())
    traceback.print_exc()  # Python's own: every file and line, unwrapped, as a bug report wants them
    _fail(f"{type(e).__name__}: {e}\n{note}".strip(), 1)


def _run(config_path: Path, overrides: list[str], out: Optional[Path], keep_partial: bool) -> Path:
    from fedcare.config import ConfigError
    from fedcare.studies.load import load_config

    if out is not None and (out.name in ("", ".", "..") or not out.resolve().name):  # '', '.', '..', '/'
        _fail(f"--out {str(out)!r}: name a new folder for the run, e.g. --out runs/my-run")
    try:  # before the training stack is imported: a mistyped path or key is reported at once
        config = load_config(config_path, overrides)
    except ConfigError as e:
        _user_error(e)
    from fedcare.studies.run import Terminated, run_study

    unique = out is None  # a default name that is taken gets a suffix; a chosen one is an error
    if out is None:
        out = Path("runs") / f"{config_path.stem}-{datetime.now():%Y%m%d-%H%M%S}"
    with progress_reporter(console) as report, _stop_on_sigterm():
        try:
            return run_study(config, out, config_file=str(config_path), progress=report, keep_partial=keep_partial,
                             unique=unique)
        except (Exception, KeyboardInterrupt, Terminated) as e:
            _stopped(e)


def _print_summary(run_dir: Path) -> None:
    from fedcare.studies.run import summary_markdown

    print(summary_markdown(run_dir))
    print(f"\nReport: {(run_dir / 'report.html').resolve()}")


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="Experiment TOML file (see configs/).")],
    set_: Annotated[list[str], typer.Option("--set", help="Override a config key, e.g. --set train.rounds=3 (repeatable).")] = [],
    out: Annotated[Optional[Path], typer.Option(help="Run directory to create (default runs/<config>-<time>). Never overwritten.")] = None,
    keep_partial: Annotated[bool, typer.Option(help="Keep <out>.partial even if the run fails before finishing anything (it is always kept when it holds finished work).")] = False,
) -> None:
    """Run an experiment file and write its run directory with tables, plots and report.html."""
    _print_summary(_run(config, set_, out, keep_partial))


@app.command()
def resume(
    run_dir: Annotated[Path, typer.Argument(help="The interrupted run's directory (<out>.partial, or <out>).")],
) -> None:
    """Continue an interrupted run from its last finished unit; its records end as an uninterrupted run's would."""
    if not (run_dir.is_dir() or run_dir.with_name(f"{run_dir.name}.partial").is_dir()):  # before importing torch
        _fail(f"{run_dir}: no such run directory to resume")
    from fedcare.studies.run import Terminated, resume_study

    with progress_reporter(console) as report, _stop_on_sigterm():
        try:
            done = resume_study(run_dir, progress=report)
        except (Exception, KeyboardInterrupt, Terminated) as e:
            _stopped(e)
    _print_summary(done)


PRIVACY_STUDY = "privacy_audit"  # what `fedcare demo --privacy` runs


@app.command()
def demo(
    study: Annotated[Optional[str], typer.Argument(help=f"The study to run on generated synthetic data: "
                                                        f"{', '.join(registry.names())} (default pain).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Run directory to create (default runs/demo-<study>-<time>).")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="Override a key of the demo config (repeatable).")] = [],
    privacy: Annotated[bool, typer.Option("--privacy", help=f"The same as `fedcare demo {PRIVACY_STUDY}`: DP-SGD's "
                                                            "epsilon, a membership attack on FedAvg, PFDL, FedBN and "
                                                            "local, and gradient inversion of one update of the pain "
                                                            "CNN (minutes).")] = False,
) -> None:
    """A complete study on built-in synthetic data in minutes (pain by default)."""
    if privacy:
        if study not in (None, PRIVACY_STUDY):
            _fail(f"--privacy runs the {PRIVACY_STUDY} study and cannot be combined with the study {study!r}: "
                  f"run `fedcare demo {study}` or `fedcare demo {PRIVACY_STUDY}`")
        console.print(f"fedcare demo --privacy is the same as `fedcare demo {PRIVACY_STUDY}`.", highlight=False)
        study = PRIVACY_STUDY
    study = study or registry.DEFAULT_STUDY
    if study not in registry.names():
        _fail(f"unknown demo {study!r}: choose one of {', '.join(registry.names())}")
    config = registry.get(study).demo_config()
    if config is None:
        _fail(f"the {study} study has no demo")
    if out is None:
        out = Path("runs") / f"demo-{study}-{datetime.now():%Y%m%d-%H%M%S}"
    console.print(f"[bold]fedcare demo {study}[/]: running {escape(str(config))}.", highlight=False)
    _print_summary(_run(config, set_, out, keep_partial=False))


@app.command()
def report(run_dir: Annotated[Path, typer.Argument(help="A run directory made by `fedcare run` or `fedcare demo`.")]) -> None:
    """Rebuild the tables, plots and report.html of a run directory from its metrics.jsonl."""
    from fedcare.studies.rundir import mark_if_crashed
    from fedcare.studies.run import build_report

    if not (run_dir / "metrics.jsonl").is_file():
        _fail(f"{run_dir}: not a run directory (no metrics.jsonl)")
    try:
        mark_if_crashed(run_dir)  # a partial directory whose process died without a word
        build_report(run_dir)
    except UserError as e:
        _user_error(e)
    except OSError as e:
        _fail(_os_error(e))
    _print_summary(run_dir)


@app.command()
def lineage(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (finished or not) with its lineage.jsonl.")],
    verify: Annotated[bool, typer.Option(help="Check the records' hash chain and seal, each model's descent, and "
                                              "re-hash every saved model; exit 2 naming the first record or file "
                                              "that does not hold.")] = False,
) -> None:
    """Print the lineage of a run's models: every aggregate (unit, method, round, parent and digest, the clients in
    it and those dropped, epsilon), then the saved model files."""
    from rich.table import Table

    from fedcare.runfiles import read_lineage
    from fedcare.runtime.lineage_verify import verify_lineage

    if not (run_dir / "lineage.jsonl").is_file():
        _fail(f"{run_dir}: no lineage.jsonl (not a run directory, or a run made before fedcare kept a lineage)")
    try:
        checked = verify_lineage(run_dir) if verify else None
        records = checked.records if checked else read_lineage(run_dir)
    except UserError as e:
        _user_error(e)
    except ValueError as e:  # a line that is not JSON, unchecked
        _fail(f"{run_dir / 'lineage.jsonl'}: {e} (fedcare lineage --verify names the record)")
    out = Console(soft_wrap=True)
    table = Table("#", "unit", "method", "phase", "round", "parent", "digest", "clients (examples)", "dropped",
                  "epsilon", box=None, pad_edge=False, title="aggregates")
    for r in (r for r in records if r.get("type") == "aggregate"):
        method = (r.get("label") or {}).get("method") or r.get("algorithm")
        clients = ", ".join(f"{c} ({v['examples']})" if "examples" in v else c for c, v in r["clients"].items())
        if "secure_aggregation" in r:
            clients += f"; secure sum of {r['secure_aggregation']['examples']} examples"
        spent = [e for per_client in r.get("epsilon", {}).values() for e in per_client.values() if e is not None]
        table.add_row(str(r["seq"]), escape("/".join(map(str, r.get("unit") or []))), escape(str(method)),
                      escape(str(r["phase"])), str(r["round"]), r["parent"][:12], r["digest"][:12], escape(clients),
                      escape("; ".join(f"{c}: {why}" for c, why in r["dropped"].items())),
                      f"{max(spent):.3g}" if spent else "")
    out.print(table)
    saved = {r["file"]: r for r in records if r.get("type") == "model"}  # the last record naming each file
    models = Table("file", "digest", "sha256", "unit", box=None, pad_edge=False, title="saved models")
    for file, r in saved.items():
        models.add_row(escape(file), r["digest"][:12], r["sha256"][:12], escape("/".join(map(str, r.get("unit") or []))))
    out.print(models)
    for key, what in (("code_sha256", "fedcare code"), ("fedcare", "fedcare version"), ("config_sha256", "config")):
        values = sorted({str(r[key]) for r in records if key in r})
        if values:
            out.print(f"{what}: {escape(', '.join(values))}", highlight=False)
    if checked is not None:
        seal = "sealed by run.json" if checked.sealed else "not sealed yet (the run has not finished)"
        out.print(f"verified: {len(records)} records, {len(checked.models)} model files; {seal}", highlight=False)


@app.command()
def status(
    run_dir: Annotated[Path, typer.Argument(help="A run directory: <out>, or <out>.partial while it runs or after it "
                                                 "stopped.")],
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until the run ends (Ctrl-C stops the watching, "
                                                        "not the run).")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.2, help="Seconds between refreshes with "
                                                                      "--watch.")] = 2.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as one JSON object (with --watch: one a "
                                                         "line, each refresh).")] = False,
) -> None:
    """Where a run stands, in process or across sites: status, unit k of n, the current round, the clients or sites
    that took part, were late or missing, epsilon per client so far, elapsed time and ETA. Read-only: it never
    writes to the run or takes its lock, so it is safe while the run writes."""
    import json
    import time

    from fedcare.studies.status import StatusReader, render

    try:
        reader = StatusReader(run_dir)
    except FileNotFoundError as e:
        _fail(str(e))
    out = Console(soft_wrap=True)

    def show(state: dict) -> None:
        if as_json:
            print(json.dumps(state), flush=True)

    state = reader.read()  # "process": a live process still holds the run (it writes its report after "finished")
    if not watch:
        print(json.dumps(state, indent=2)) if as_json else out.print(render(state))
        return
    try:
        if as_json:
            show(state)
            while state["status"] == "running" or state["process"]:  # until its process lets go (the report)
                time.sleep(interval)
                state = reader.read()
                show(state)
            return
        from rich.live import Live

        with Live(render(state), console=out, auto_refresh=False) as live:
            while state["status"] == "running" or state["process"]:  # until its process lets go (the report)
                time.sleep(interval)
                state = reader.read()
                live.update(render(state), refresh=True)
    except KeyboardInterrupt:  # the watching stops; the run goes on
        return


@app.command()
def export(
    run_dir: Annotated[Path, typer.Argument(help="A finished run directory, or a stopped run's <out>.partial (its "
                                                 "records up to the last finished unit).")],
    mlflow: Annotated[str, typer.Option("--mlflow", help="MLflow tracking URI: sqlite:///path/mlflow.db, a folder, "
                                                         "or http(s)://host:port.")],
    experiment: Annotated[Optional[str], typer.Option(help="The MLflow experiment (default fedcare-<study>).")] = None,
) -> None:
    """Log a run to MLflow after the fact: its config as params, every record's numbers as metrics, its tags, and
    report, tables and records as artifacts. The MLflow run its run.json names for that store is continued (a
    run that tracked live, or an earlier export), else a new one is made."""
    from fedcare.config import tracking_uri_problem

    from fedcare.studies.status import find_run

    problem = tracking_uri_problem(mlflow)
    if problem:
        _fail(f"--mlflow {problem}")
    try:
        run_dir = find_run(run_dir)  # <out>, or <out>.partial when the run stopped
    except FileNotFoundError as e:
        _fail(str(e))
    if not (run_dir / "metrics.jsonl").is_file():
        _fail(f"{run_dir}: not a run directory (no metrics.jsonl)")
    from fedcare.studies.tracking import export_run

    try:
        run_id = export_run(run_dir, mlflow, experiment)
    except UserError as e:
        _user_error(e)
    except OSError as e:
        _fail(_os_error(e))
    console.print(f"exported {escape(str(run_dir))} to MLflow run {run_id} at {escape(mlflow)}", highlight=False)


@app.command()
def studies() -> None:
    """List what is registered: each study (where it comes from, what it is, whether it has a demo), then the
    datasets and algorithms, and any registration that is broken."""
    from rich.table import Table

    from fedcare.algorithms import catalogue
    from fedcare.data import registry as datasets
    from fedcare.plugins import PluginError

    found, conflicts = registry.sources()
    table = Table("study", "source", "description", "demo", box=None, pad_edge=False)
    for name, source in found.items():
        try:
            study = registry.get(name)
            description, demo = study.description, "yes" if study.demo_config() is not None else "no"
        except (registry.UnknownStudy, ImportError) as e:  # a broken package: said in its row
            description, demo = f"cannot be loaded: {e}", "-"
        where = source.describe() + ("" if source.kind == "built-in" else f" ({source.module})")
        table.add_row(name, where, description, demo)
    out = Console(soft_wrap=True)
    out.print(table)
    problems = registry.problems()
    for kind, names in (("datasets", lambda: datasets.names()), ("algorithms", lambda: catalogue.names())):
        try:
            out.print(f"\n{kind}: {escape(', '.join(names()))}", highlight=False)
        except PluginError as e:  # a malformed or clashing entry point
            problems.append(str(e))
    for line in problems:
        out.print(f"[bold red]problem:[/] {escape(line)}", highlight=False)
    if conflicts or problems:
        raise typer.Exit(1)


@new_app.command("study")
def new_study(
    name: Annotated[str, typer.Argument(help="The study's name (lower-case letters, digits, _), e.g. sepsis.")],
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="The new folder for the package (must not exist).")],
) -> None:
    """Write a new study as an installable package: pyproject.toml (registering it with fedcare), its config,
    synthetic data, study, demo config and a test. `pip install -e DIR`, then `fedcare demo NAME` runs it."""
    from fedcare.studies.scaffold import ScaffoldError, new_study as write

    try:
        out = write(name, directory)
    except ScaffoldError as e:
        _fail(str(e))
    except OSError as e:
        _fail(_os_error(e))
    console.print(f"wrote the {name} study to {escape(str(out))}. Next:\n  pip install -e {escape(str(out))}\n"
                  f"  fedcare demo {name}\n  python -m pytest {escape(str(out))}", highlight=False)


def main() -> None:  # pragma: no cover - console entry point
    # a crash in native code (a segfault in an OpenMP or BLAS library, an abort) prints where
    # Python was before the process dies by its signal: never a silent exit
    faulthandler.enable()
    app(prog_name="fedcare")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

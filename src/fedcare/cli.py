"""The `fedcare` command line: demo, run, report and data commands."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from fedcare.data.cli import data_app
from fedcare.deployment.cli import flower_app
from fedcare.studies import registry

app = typer.Typer(help="fedcare: personalized, privacy-preserving federated learning on healthcare data.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
app.add_typer(data_app, name="data")
app.add_typer(flower_app, name="flower")
console = Console(stderr=True)

def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _progress() -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False,
    )


def _run(config_path: Path, overrides: list[str], out: Optional[Path], keep_partial: bool) -> Path:
    from fedcare.config import ConfigError, load_config
    from fedcare.data.common import DataError
    from fedcare.studies.rundir import RunDirectoryExists
    from fedcare.studies.run import run_study

    try:
        config = load_config(config_path, overrides)
    except ConfigError as e:
        _fail(str(e))
    if out is None:
        out = Path("runs") / f"{config_path.stem}-{datetime.now():%Y%m%d-%H%M%S}"
    with _progress() as progress:
        tasks: dict[str, int] = {}

        def report(description: str, done: int, total: int) -> None:
            key = "study" if description.startswith("seed") else description
            if key not in tasks:
                tasks[key] = progress.add_task(description, total=total)
            progress.update(tasks[key], completed=done, total=total, description=description)

        try:
            return run_study(config, out, config_file=str(config_path), progress=report, keep_partial=keep_partial)
        except (RunDirectoryExists, DataError, FileExistsError) as e:
            progress.stop()
            _fail(str(e))


def _print_summary(run_dir: Path) -> None:
    from fedcare.studies.run import summary_markdown

    print(summary_markdown(run_dir))
    print(f"\nReport: {(run_dir / 'report.html').resolve()}")


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="Experiment TOML file (see configs/).")],
    set_: Annotated[list[str], typer.Option("--set", help="Override a config key, e.g. --set train.max_rounds=3 (repeatable).")] = [],
    out: Annotated[Optional[Path], typer.Option(help="Run directory to create (default runs/<config>-<time>). Never overwritten.")] = None,
    keep_partial: Annotated[bool, typer.Option(help="Keep <out>.partial if the run fails (default: remove it).")] = False,
) -> None:
    """Run an experiment file and write its run directory with tables, plots and report.html."""
    _print_summary(_run(config, set_, out, keep_partial))


@app.command()
def demo(
    study: Annotated[str, typer.Argument(help=f"The study to run on generated synthetic data: {', '.join(registry.names())} "
                                              "(default pain).")] = "pain",
    out: Annotated[Optional[Path], typer.Option(help="Run directory to create (default runs/demo-<study>-<time>).")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="Override a key of the demo config (repeatable).")] = [],
) -> None:
    """A complete study on built-in synthetic data in minutes (pain by default)."""
    if study not in registry.names():
        _fail(f"unknown demo {study!r}: choose one of {', '.join(registry.names())}")
    config = registry.get(study).demo_config()
    if config is None:
        _fail(f"the {study} study has no demo")
    if out is None:
        out = Path("runs") / f"demo-{study}-{datetime.now():%Y%m%d-%H%M%S}"
    console.print(f"[bold]fedcare demo {study}[/]: generating synthetic data and running the study.")
    _print_summary(_run(config, set_, out, keep_partial=False))


@app.command()
def report(run_dir: Annotated[Path, typer.Argument(help="A run directory made by `fedcare run` or `fedcare demo`.")]) -> None:
    """Rebuild the tables, plots and report.html of a run directory from its metrics.jsonl."""
    from fedcare.studies.run import build_report

    if not (run_dir / "metrics.jsonl").is_file():
        _fail(f"{run_dir}: not a run directory (no metrics.jsonl)")
    try:
        build_report(run_dir)
    except ValueError as e:
        _fail(str(e))
    _print_summary(run_dir)


def main() -> None:  # pragma: no cover - console entry point
    app(prog_name="fedcare")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The `fedcare` command line: demo, run, report and data commands."""

from __future__ import annotations

import sys
from datetime import datetime
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from fedcare.data.cli import data_app

app = typer.Typer(help="fedcare: personalized, privacy-preserving federated learning on healthcare data.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
app.add_typer(data_app, name="data")
console = Console(stderr=True)

DEMO_CONFIG = "pain/demo.toml"


def packaged_config(name: str) -> Path:
    return Path(str(files("fedcare") / "configs" / name))


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _progress() -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False,
    )


def _run(config_path: Path, overrides: list[str], out: Optional[Path], keep_partial: bool) -> Path:
    from fedcare.config import ConfigError, load_config
    from fedcare.data.unbc import UnbcImageError, UnbcLayoutError
    from fedcare.studies.pain.cohort import PainDataError
    from fedcare.studies.pain.study import RunDirectoryExists, run_pain_experiment

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
            return run_pain_experiment(config, out, config_file=str(config_path), progress=report,
                                       keep_partial=keep_partial)
        except (RunDirectoryExists, PainDataError, UnbcLayoutError, UnbcImageError, FileExistsError) as e:
            progress.stop()
            _fail(str(e))


def _print_summary(run_dir: Path) -> None:
    from fedcare.report import format_summary_markdown, summary_rows

    print(format_summary_markdown(summary_rows(run_dir)))
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
    out: Annotated[Optional[Path], typer.Option(help="Run directory to create (default runs/demo-<time>).")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="Override a key of the demo config (repeatable).")] = [],
) -> None:
    """The pain study on a built-in synthetic cohort: RANDOM, BC, C(C), F(C), FP(C), FL(C) in minutes."""
    if out is None:
        out = Path("runs") / f"demo-{datetime.now():%Y%m%d-%H%M%S}"
    console.print("[bold]fedcare demo[/]: generating a synthetic pain cohort (UNBC layout) and running the study.")
    _print_summary(_run(packaged_config(DEMO_CONFIG), set_, out, keep_partial=False))


@app.command()
def report(run_dir: Annotated[Path, typer.Argument(help="A run directory made by `fedcare run` or `fedcare demo`.")]) -> None:
    """Rebuild the tables, plots and report.html of a run directory from its metrics.jsonl."""
    from fedcare.report import build_report

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

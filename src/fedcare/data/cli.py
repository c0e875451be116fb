"""`fedcare data ...`: check a dataset copy (`summary unbc`) and generate synthetic cohorts
(`synth pain`). The lead mounts `data_app` as `fedcare data`."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

PROBLEMS_SHOWN_PER_KIND = 50

data_app = typer.Typer(help="Check dataset copies and generate synthetic cohorts.", no_args_is_help=True)
summary_app = typer.Typer(help="Check a dataset copy on disk and summarize it (counts, labels, problems).",
                          no_args_is_help=True)
synth_app = typer.Typer(help="Generate synthetic datasets in the layout of a real one (no real patients).",
                        no_args_is_help=True)
data_app.add_typer(summary_app, name="summary")
data_app.add_typer(synth_app, name="synth")


def _stdout() -> Console:
    return Console(highlight=False)


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


def _fail(message: str) -> None:
    """One-line error on stderr, exit code 2, no traceback."""
    _stderr().print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(2)


@contextmanager
def _progress_bar(description: str) -> Iterator[Callable[[int, int], None]]:
    """Progress on stderr (stdout stays clean for --json), fed by progress(done, total): a rich
    bar on a terminal, plain lines with an ETA otherwise. It appears on the first update only,
    so an early error prints nothing but the error."""
    console = _stderr()
    if not console.is_terminal:
        from fedcare.progress import PlainProgress

        plain = PlainProgress(console.file)
        yield lambda done, total: plain(description, done, total)
        return
    progress = Progress(
        TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=True,
    )
    task: list[Any] = []

    def update(done: int, total: int) -> None:
        if not task:
            progress.start()
            task.append(progress.add_task(description, total=total))
        progress.update(task[0], completed=done, total=total)

    try:
        yield update
    finally:
        if task:
            progress.stop()


def _histogram_table(histogram: dict, title: str = "PSPI histogram") -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("PSPI", justify="right")
    table.add_column("frames", justify="right")
    table.add_column("%", justify="right")
    total = sum(histogram.values()) or 1
    for level, count in sorted(histogram.items(), key=lambda kv: float(kv[0])):
        table.add_row(str(level), str(count), f"{100.0 * count / total:.1f}")
    return table


# --------------------------------------------------------------------------- summary unbc


@summary_app.command("unbc")
def summary_unbc(
    path: Annotated[Path, typer.Argument(
        help="Root of the UNBC-McMaster copy: the folder holding Images/ and Frame_Labels/ "
             "(doubled folders like Images/Images are fine).", show_default=False)],
    json_: Annotated[bool, typer.Option(
        "--json", help="Print the full summary (every problem) as JSON on stdout instead of tables.")] = False,
    strict: Annotated[bool, typer.Option(
        "--strict", help="Exit with code 1 when the copy has a problem a run refuses (a label without its image, "
                         "an image without its label, an unreadable image).")] = False,
    check_images: Annotated[bool, typer.Option(
        "--check-images/--no-check-images",
        help="Decode every image (finds unreadable and black frames) and parse every landmark file; "
             "--no-check-images only checks that the files exist (seconds instead of minutes).")] = True,
) -> None:
    """Check a UNBC-McMaster Shoulder Pain copy and summarize it.

    Prints subjects, sessions, frames, pain frames (PSPI >= 1), the PSPI histogram, and every
    problem found (missing or bad labels, unreadable or black frames, stray files, ...).
    Exit code 2 when PATH is not a UNBC-McMaster copy; with --strict, 1 when a run would refuse it."""
    from fedcare.data.unbc import STRICT_PROBLEMS, UnbcImageError, UnbcLayoutError, load_unbc, summarize

    try:
        if check_images:
            with _progress_bar("checking images") as update:
                ds = load_unbc(path, check_images=True, progress=update)
        else:
            ds = load_unbc(path, check_images=False)
    except (UnbcLayoutError, UnbcImageError) as e:
        _fail(str(e))
    summary = summarize(ds)
    if json_:
        typer.echo(json.dumps(summary, indent=2))
    else:
        _print_summary(summary)
    refused = sum(n for kind, n in summary["problem_counts"].items() if kind in STRICT_PROBLEMS)
    if strict and refused:
        _stderr().print(f"[bold red]strict:[/] {refused} problem(s) that a run refuses "
                        f"({', '.join(k for k in summary['problem_counts'] if k in STRICT_PROBLEMS)})", soft_wrap=True)
        raise typer.Exit(1)


def _print_summary(summary: dict) -> None:
    out = _stdout()
    out.print(f"[bold]UNBC-McMaster copy[/] {escape(summary['root'])}", soft_wrap=True)
    if summary["synthetic"]:
        out.print("[bold yellow]SYNTHETIC:[/] generated by fedcare (fedcare-synthetic.json found); "
                  "these are not real patients.", soft_wrap=True)
    out.print(
        f"{summary['subjects']} subjects, {summary['sequences']} sequences (sessions), {summary['frames']} frames; "
        f"{summary['pain_frames']} pain frames (PSPI >= {summary['pain_threshold']:g}) = {summary['pain_percent']:.1f}% "
        f"of {summary['labelled_frames']} labelled", soft_wrap=True)
    absent = [name for name, p in summary["parts"].items() if p is None]
    if absent:
        out.print(f"optional parts absent: {', '.join(absent)}", soft_wrap=True)
    if not summary["checked_images"]:
        out.print("images not decoded (--no-check-images): unreadable and black frames were not looked for",
                  soft_wrap=True)
    agreement = summary["pspi_vs_facs"]
    if agreement["compared"]:
        out.print(f"PSPI recomputed from FACS (AU43 counted as 1): {agreement['mismatched']} of "
                  f"{agreement['compared']} frames disagree", soft_wrap=True)

    table = Table(title="Subjects", title_justify="left")
    for col in ("subject", "sessions", "frames", "pain frames", "pain %"):
        table.add_column(col, justify="right")
    for s in summary["per_subject"]:
        table.add_row(f"{s['subject']:03d}", str(s["sessions"]), str(s["frames"]), str(s["pain_frames"]),
                      f"{s['pain_percent']:.1f}")
    out.print(table)
    out.print(_histogram_table(summary["pspi_histogram"]))

    counts = summary["problem_counts"]
    if not counts:
        out.print("[bold green]no problems found[/]")
        return
    out.print(f"[bold red]{sum(counts.values())} problems[/]: "
              + ", ".join(f"{kind} {n}" for kind, n in counts.items()), soft_wrap=True)
    for kind, n in counts.items():
        out.print(f"\n[bold]{kind}[/] ({n})")
        shown = [p for p in summary["problems"] if p["kind"] == kind][:PROBLEMS_SHOWN_PER_KIND]
        for p in shown:
            out.print(f"  {escape(p['path'])}: {escape(p['detail'])}", soft_wrap=True)
        if n > len(shown):
            out.print(f"  ... and {n - len(shown)} more (use --json for the full list)")


# --------------------------------------------------------------------------- synth pain


def _parse_subjects(text: str | None) -> list[int] | None:
    if text is None or not text.strip():
        return None
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        _fail(f"--subjects {text!r}: expected comma-separated subject numbers like 42,43,47")
        raise  # unreachable


@synth_app.command("pain")
def synth_pain(
    out: Annotated[Path, typer.Argument(
        help="Folder to create; it receives a UNBC-McMaster-layout cohort and fedcare-synthetic.json.",
        show_default=False)],
    seed: Annotated[int, typer.Option(help="Random seed; the same seed gives the same files.")] = 0,
    subjects: Annotated[Optional[str], typer.Option(
        help="Comma-separated subject numbers, e.g. 42,43,47 (default: the 24 thesis subjects (all but 101)).",
        show_default=False)] = None,
    frame_scale: Annotated[float, typer.Option(
        help="Fraction of each real sequence's frame count to generate (1.0 = as many frames as the real archive).")] = 0.05,
    image_size: Annotated[int, typer.Option(help="Side of the square frame images in pixels.")] = 64,
    min_frames_per_sequence: Annotated[int, typer.Option(
        help="Lower bound on frames per sequence after scaling.")] = 8,
    quirks: Annotated[bool, typer.Option(
        "--quirks", help="Also write the real archive's black frames: the first 7 frames of 095-tv095/tv095t2aeunaff (or of the first subject's last sequence).")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace OUT if it already exists.")] = False,
) -> None:
    """Generate a synthetic pain cohort in the UNBC-McMaster layout (not real patients).

    Writes OUT in the real archive's layout plus fedcare-synthetic.json, then prints what was
    generated. Exit code 2 when OUT exists (without --overwrite) or an option is invalid."""
    subject_list = _parse_subjects(subjects)
    try:
        from fedcare.data.synthetic.pain import generate_pain_cohort
    except ImportError as e:  # pragma: no cover - only while the generator is being written
        _fail(f"the synthetic pain generator is not available ({e})")
    try:
        with _progress_bar("generating synthetic cohort") as update:
            result = generate_pain_cohort(
                out, seed=seed, subjects=subject_list, frame_scale=frame_scale, image_size=image_size,
                min_frames_per_sequence=min_frames_per_sequence, quirks=quirks, overwrite=overwrite,
                progress=update,
            )
    except (FileExistsError, ValueError) as e:
        _fail(str(e))
    except OSError as e:  # e.g. a read-only or full disk
        _fail(f"{e.filename}: {e.strerror}" if e.filename else str(e))
    console = _stdout()
    console.print(f"[bold]synthetic pain cohort[/] written to {escape(str(result.get('root', out)))}", soft_wrap=True)
    subjects_out = result.get("subjects")
    n_subjects = len(subjects_out) if isinstance(subjects_out, (list, tuple, set)) else subjects_out
    frames = result.get("frames", 0)
    pain = result.get("pain_frames", 0)
    pct = 100.0 * pain / frames if frames else 0.0
    console.print(f"{n_subjects} subjects, {result.get('sequences')} sequences, {frames} frames, "
                  f"{pain} pain frames ({pct:.1f}%)", soft_wrap=True)
    if result.get("pspi_histogram"):
        console.print(_histogram_table(result["pspi_histogram"]))
    console.print(f"check it with: fedcare data summary unbc {escape(str(result.get('root', out)))}", soft_wrap=True)

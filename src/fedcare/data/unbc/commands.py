"""`fedcare data summary unbc` (check a UNBC-McMaster copy) and `fedcare data synth pain` (a
synthetic cohort in its layout). The readers are imported when a command runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from fedcare.data.console import (fail, histogram_table, print_heading, print_problems, progress_bar, stderr, stdout,
                                  user_error)
from fedcare.errors import UserError


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
    from fedcare.data.unbc.reader import STRICT_PROBLEMS, load_unbc
    from fedcare.data.unbc.summary import summarize

    try:
        if check_images:
            with progress_bar("checking images") as update:
                ds = load_unbc(path, check_images=True, progress=update)
        else:
            ds = load_unbc(path, check_images=False)
    except UserError as e:
        user_error(e)
    summary = summarize(ds)
    if json_:
        typer.echo(json.dumps(summary, indent=2))
    else:
        _print_summary(summary)
    refused = sum(n for kind, n in summary["problem_counts"].items() if kind in STRICT_PROBLEMS)
    if strict and refused:
        stderr().print(f"[bold red]strict:[/] {refused} problem(s) that a run refuses "
                        f"({', '.join(k for k in summary['problem_counts'] if k in STRICT_PROBLEMS)})", soft_wrap=True)
        raise typer.Exit(1)


def _print_summary(summary: dict) -> None:
    out = stdout()
    print_heading(out, "UNBC-McMaster copy", summary, "these are not real patients.")
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
    out.print(histogram_table(summary["pspi_histogram"]))

    print_problems(out, summary)



def _parse_subjects(text: str | None) -> list[int] | None:
    if text is None or not text.strip():
        return None
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        fail(f"--subjects {text!r}: expected comma-separated subject numbers like 42,43,47")


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
    from fedcare.data.unbc.synthetic import generate_pain_cohort

    subject_list = _parse_subjects(subjects)
    try:
        with progress_bar("generating synthetic cohort") as update:
            result = generate_pain_cohort(
                out, seed=seed, subjects=subject_list, frame_scale=frame_scale, image_size=image_size,
                min_frames_per_sequence=min_frames_per_sequence, quirks=quirks, overwrite=overwrite,
                progress=update,
            )
    except (FileExistsError, UserError) as e:
        user_error(e)
    except OSError as e:  # e.g. a read-only or full disk
        fail(f"{e.filename}: {e.strerror}" if e.filename else str(e))
    console = stdout()
    console.print(f"[bold]synthetic pain cohort[/] written to {escape(str(result.get('root', out)))}", soft_wrap=True)
    subjects_out = result.get("subjects")
    n_subjects = len(subjects_out) if isinstance(subjects_out, (list, tuple, set)) else subjects_out
    frames = result.get("frames", 0)
    pain = result.get("pain_frames", 0)
    pct = 100.0 * pain / frames if frames else 0.0
    console.print(f"{n_subjects} subjects, {result.get('sequences')} sequences, {frames} frames, "
                  f"{pain} pain frames ({pct:.1f}%)", soft_wrap=True)
    if result.get("pspi_histogram"):
        console.print(histogram_table(result["pspi_histogram"]))
    console.print(f"check it with: fedcare data summary unbc {escape(str(result.get('root', out)))}", soft_wrap=True)


SUMMARY = {"unbc": summary_unbc}
SYNTH = {"pain": synth_pain}

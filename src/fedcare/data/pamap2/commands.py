"""`fedcare data summary pamap2` (check a PAMAP2 copy: subjects, rows, activities) and
`fedcare data synth pamap2` (synthetic recordings in its layout, the fedhealth2 study's
synthetic copy). The readers are imported when a command runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from fedcare.data.console import print_heading, progress_bar, stdout, user_error
from fedcare.errors import UserError

SAMPLE_RATE_HZ = 100  # PAMAP2's IMU rate: a row is 10 ms


def summarize(ds) -> dict:
    """JSON-ready facts of a loaded Pamap2Dataset: rows and the paper's activities per subject."""
    from fedcare.data.pamap2.reader import ACTIVITY_NAMES, PAPER_ACTIVITIES

    per_subject = []
    for recording in ds.recordings:
        counts = {ACTIVITY_NAMES[a]: int((recording.activity == a).sum()) for a in PAPER_ACTIVITIES}
        per_subject.append({"subject": recording.subject, "part": recording.part, "rows": len(recording),
                            "paper_activity_rows": counts})
    return {"root": str(ds.root), "synthetic": ds.synthetic, "subjects": ds.subjects(),
            "rows": sum(len(r) for r in ds.recordings), "per_subject": per_subject}


def summary_pamap2(
    path: Annotated[Path, typer.Argument(
        help="The PAMAP2 copy: PAMAP2_Dataset/ or a folder above it (Protocol/subjectNNN.dat inside).",
        show_default=False)],
    json_: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout instead of tables.")] = False,
) -> None:
    """Check a PAMAP2 copy and summarize it.

    Reads every Protocol/subjectNNN.dat and prints, per subject, its rows and the rows of each
    of the 10 activities the FedHealth 2 paper uses. Exit code 2 when PATH is not a PAMAP2
    copy or a file is malformed (the message names the file and line)."""
    from fedcare.data.pamap2.reader import load_pamap2

    try:
        with progress_bar("reading recordings") as update:
            ds = load_pamap2(path, progress=update)
    except UserError as e:
        user_error(e)
    summary = summarize(ds)
    if json_:
        typer.echo(json.dumps(summary, indent=2))
        return
    out = stdout()
    print_heading(out, "PAMAP2 copy", summary, "these are not real people.")
    out.print(f"{len(summary['subjects'])} subjects, {summary['rows']} rows "
              f"({summary['rows'] / SAMPLE_RATE_HZ / 60:.1f} min at {SAMPLE_RATE_HZ} Hz)", soft_wrap=True)
    activities = list(summary["per_subject"][0]["paper_activity_rows"])
    table = Table(title="Rows per subject and activity (the paper's 10)", title_justify="left")
    for col in ("subject", "rows", *activities):
        table.add_column(col, justify="right")
    for s in summary["per_subject"]:
        table.add_row(str(s["subject"]), str(s["rows"]), *(str(n) for n in s["paper_activity_rows"].values()))
    out.print(table)


def synth_pamap2(
    out: Annotated[Path, typer.Argument(
        help="Folder to create; it receives PAMAP2_Dataset/Protocol/subjectNNN.dat files and fedcare-synthetic.json.",
        show_default=False)],
    seed: Annotated[int, typer.Option(help="Random seed; the same seed gives the same files.", min=0)] = 0,
    subjects: Annotated[int, typer.Option(help="Number of synthetic subjects (ids 101..).", min=1)] = 9,
    seconds_per_activity: Annotated[float, typer.Option(
        help="Mean seconds of each of the 10 activities per subject (±20%).", min=0.1)] = 30.0,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace OUT if it already exists.")] = False,
) -> None:
    """Generate synthetic PAMAP2 recordings: 27 IMU channels of people who do not exist.

    Each subject performs the FedHealth 2 paper's 10 activities with their own body traits and
    sensor placement. Exit code 2 when OUT exists (without --overwrite) or an option is invalid."""
    from fedcare.data.pamap2.synthetic import generate_pamap2

    try:
        with progress_bar("writing synthetic recordings") as update:
            result = generate_pamap2(out, seed=seed, subjects=subjects, seconds_per_activity=seconds_per_activity,
                                     overwrite=overwrite, progress=update)
    except (FileExistsError, UserError) as e:
        user_error(e)
    console = stdout()
    console.print(f"[bold]synthetic PAMAP2[/] written to {escape(result['root'])}", soft_wrap=True)
    console.print(f"{result['files']} subjects, {result['rows']} rows", soft_wrap=True)
    console.print(f"check it with: fedcare data summary pamap2 {escape(result['root'])}", soft_wrap=True)


SUMMARY = {"pamap2": summary_pamap2}
SYNTH = {"pamap2": synth_pamap2}

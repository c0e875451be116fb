"""`fedcare data summary xray` (check a chest X-ray copy: images per class) and `fedcare data
synth xray` (synthetic X-rays in its layout, the fedhealth2 study's synthetic copy). The
readers are imported when a command runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from fedcare.data.console import print_heading, progress_bar, stdout, user_error
from fedcare.errors import UserError


def summarize(ds) -> dict:
    """JSON-ready facts of a loaded XrayDataset."""
    return {"root": str(ds.root), "synthetic": ds.synthetic, "images": len(ds.paths), "classes": ds.class_counts()}


def summary_xray(
    path: Annotated[Path, typer.Argument(
        help="The X-ray copy: the folder holding the four class folders, or a folder above it (a few levels).",
        show_default=False)],
    json_: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout instead of text.")] = False,
) -> None:
    """Check a chest X-ray copy (the Curated X-Ray Dataset layout) and summarize it.

    Finds the folder holding COVID-19/, Normal/, Pneumonia-Bacterial/ and Pneumonia-Viral/ and
    prints the images of each class. Exit code 2 when PATH holds no such folder."""
    from fedcare.data.xray.reader import load_xray

    try:
        ds = load_xray(path)
    except UserError as e:
        user_error(e)
    summary = summarize(ds)
    if json_:
        typer.echo(json.dumps(summary, indent=2))
        return
    out = stdout()
    print_heading(out, "chest X-ray copy", summary, "these are not real patients.")
    out.print(f"{summary['images']} images: " + ", ".join(f"{k} {v}" for k, v in summary["classes"].items()),
              soft_wrap=True)


def synth_xray(
    out: Annotated[Path, typer.Argument(
        help="Folder to create; it receives 'Curated X-Ray Dataset/<class>/*.jpg' and fedcare-synthetic.json.",
        show_default=False)],
    seed: Annotated[int, typer.Option(help="Random seed; the same seed gives the same files.", min=0)] = 0,
    scale: Annotated[float, typer.Option(help="Fraction of the real class counts to draw (at least 4 per class).")] = 0.02,
    image_size: Annotated[int, typer.Option(help="Smallest side of the images in pixels (sizes vary up to 1.5x).", min=16)] = 64,
    sites: Annotated[Optional[int], typer.Option(
        help="Write one copy per site (site-1/, site-2/, ...), each in its own source look.", show_default=False,
        min=2)] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace OUT if it already exists.")] = False,
) -> None:
    """Generate synthetic chest X-rays in four classes (not patients).

    Exit code 2 when OUT exists (without --overwrite) or an option is invalid."""
    from fedcare.data.xray.synthetic import generate_xray

    try:
        with progress_bar("drawing synthetic X-rays") as update:
            result = generate_xray(out, seed=seed, scale=scale, image_size=image_size, sites=sites,
                                   overwrite=overwrite, progress=update)
    except (FileExistsError, UserError) as e:
        user_error(e)
    console = stdout()
    console.print(f"[bold]synthetic chest X-rays[/] written to {escape(result['root'])}", soft_wrap=True)
    console.print(f"{result['images']} images: " + ", ".join(f"{k} {v}" for k, v in result["classes"].items()),
                  soft_wrap=True)
    console.print(f"check it with: fedcare data summary xray {escape(result['root'])}", soft_wrap=True)


SUMMARY = {"xray": summary_xray}
SYNTH = {"xray": synth_xray}

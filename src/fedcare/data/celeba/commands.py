"""`fedcare data summary celeba` (check a CelebA copy: identities, partition, face detection,
the thesis's attribute filters) and `fedcare data synth celeba` (drawn faces of people who do
not exist). The readers are imported when a command runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from fedcare.data.console import print_heading, print_problems, progress_bar, stdout, user_error
from fedcare.errors import UserError



def _filter_counts(ds: Any, rows: Any | None) -> list[dict]:
    """Images matching each Table 4.1 client filter (all listed images, and those with a face)."""
    import numpy as np

    from fedcare.data.celeba.reader import ATTRIBUTES
    from fedcare.data.celeba.identity_partition import load_attribute_clients

    out = []
    for spec in load_attribute_clients():
        ok = np.ones(len(ds), bool)
        for key, value in spec.filter.items():
            ok &= ds.attributes[:, ATTRIBUTES.index(key)] == value
        entry = {"client": spec.client, "table_size": spec.size, "images": int(ok.sum())}
        if rows is not None:
            entry["faces"] = int(ok[rows].sum())
        out.append(entry)
    return out


def summary_celeba(
    path: Annotated[Path, typer.Argument(
        help="Root of the CelebA copy: the folder holding img_align_celeba/ and the .txt files "
             "(or the folder above celeba/, or the Img/ Anno/ Eval/ tree).", show_default=False)],
    json_: Annotated[bool, typer.Option(
        "--json", help="Print the full summary (every problem) as JSON on stdout instead of tables.")] = False,
    detect: Annotated[bool, typer.Option(
        "--detect/--no-detect",
        help="Run the Haar face detector on the images (detection rate; crops are cached for later runs); "
             "--no-detect only reads the text files and lists the image folder.")] = True,
    identities: Annotated[Optional[int], typer.Option(
        help="Detect faces on this many randomly chosen identities only (seeded), for a quick estimate "
             "on the full dataset (default: all identities).", show_default=False, min=1)] = None,
    seed: Annotated[int, typer.Option(help="Seed of the --identities sample.")] = 0,
    cache_dir: Annotated[Optional[Path], typer.Option(
        help="Face-crop cache folder (default: $FEDCARE_CACHE/faces, else ~/.cache/fedcare/faces).",
        show_default=False)] = None,
    workers: Annotated[Optional[int], typer.Option(
        help="Threads for decoding and detection (default: CPUs, at most 4).", show_default=False, min=1)] = None,
) -> None:
    """Check a CelebA copy (aligned and cropped) and summarize it.

    Prints identities, images, images per identity, the official partition, the Haar-cascade
    face detection rate, attribute prevalences, how many images match each attribute filter of
    the Hess thesis (Table 4.1), and every problem found with its file and line. Exit code 2
    when PATH is not a CelebA copy."""
    import numpy as np

    from fedcare.data.celeba.faces import FaceCropper
    from fedcare.data.celeba.reader import load_celeba
    from fedcare.data.celeba.summary import summarize

    try:
        ds = load_celeba(path, strict=False)
        faces = None
        if detect and len(ds):
            people = ds.identity_ids()
            if identities is not None and identities < len(people):
                people = np.sort(np.random.default_rng([seed, 99]).choice(people, identities, replace=False))
            cropper = FaceCropper(cache_dir=cache_dir, workers=workers)
            with progress_bar("detecting faces") as update:
                faces = cropper.faces(ds, people, strict=False, progress=update)
    except UserError as e:
        user_error(e)
    summary = summarize(ds, faces)
    summary["attribute_filters"] = _filter_counts(ds, faces.rows if faces is not None else None)
    if json_:
        typer.echo(json.dumps(summary, indent=2))
        return
    _print_celeba(summary)


def _print_celeba(summary: dict) -> None:
    out = stdout()
    print_heading(out, "CelebA copy", summary, "these are not real people.")
    per = summary["images_per_identity"]
    out.print(f"{summary['identities']} identities, {summary['images']} images"
              + (f" ({per['min']}-{per['max']} per identity, mean {per['mean']})" if per else "")
              + (f"; {summary['unlisted_images']} image files not listed" if summary["unlisted_images"] else ""),
              soft_wrap=True)
    if summary["partition"]:
        out.print("official partition: " + ", ".join(f"{k} {v}" for k, v in summary["partition"].items()))
    det = summary["detection"]
    if det is None:
        out.print("faces not detected (--no-detect)")
    else:
        out.print(f"Haar face detection ({det['detector']}): {det['faces']} of {det['images'] - det['unreadable']} "
                  f"decoded images have a face = [bold]{det['rate_percent']:.1f}%[/] "
                  f"({det['identities']} identities; {det['no_face']} without a face"
                  + (f", {det['unreadable']} unreadable" if det["unreadable"] else "") + ")", soft_wrap=True)
    table = Table(title="Attribute prevalence (% of images)", title_justify="left")
    for _ in range(2):
        table.add_column("attribute")
        table.add_column("%", justify="right")
    items = list(summary["attribute_prevalence_percent"].items())
    half = (len(items) + 1) // 2
    for left, right in zip(items[:half], items[half:] + [("", None)] * (2 * half - len(items))):
        table.add_row(left[0], f"{left[1]:.1f}", right[0], "" if right[1] is None else f"{right[1]:.1f}")
    out.print(table)
    filters = Table(title="Hess Table 4.1 attribute filters: matching images", title_justify="left")
    for col in ("client", "table size", "images", "with a face"):
        filters.add_column(col, justify="right")
    for f in summary["attribute_filters"]:
        filters.add_row(str(f["client"]), str(f["table_size"]), str(f["images"]), str(f.get("faces", "-")))
    out.print(filters)
    print_problems(out, summary)



def synth_celeba(
    out: Annotated[Path, typer.Argument(
        help="Folder to create; it receives a CelebA-layout copy (img_align_celeba/, identity_CelebA.txt, "
             "list_attr_celeba.txt, list_eval_partition.txt) and fedcare-synthetic.json.", show_default=False)],
    seed: Annotated[int, typer.Option(help="Random seed; the same seed gives the same files.", min=0)] = 0,
    identities: Annotated[int, typer.Option(help="Number of synthetic people (identity ids 1..N).", min=1)] = 300,
    images_per_identity: Annotated[int, typer.Option(
        help="Mean pictures per person; each person gets between half and 1.5 times this many.", min=2)] = 20,
    workers: Annotated[Optional[int], typer.Option(
        help="Drawing processes (default: CPUs, at most 4).", show_default=False, min=1)] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace OUT if it already exists.")] = False,
) -> None:
    """Generate a synthetic CelebA copy: drawn faces of people who do not exist.

    Identities differ in face shape, skin, hair and the CelebA attributes they carry (glasses,
    hats, beards, hair colour, age, smiles, ...); each picture varies pose, lighting and
    expression. Exit code 2 when OUT exists (without --overwrite) or an option is invalid."""
    from fedcare.data.celeba.synthetic import generate_celeba

    try:
        with progress_bar("drawing synthetic faces") as update:
            result = generate_celeba(out, seed=seed, identities=identities, images_per_identity=images_per_identity,
                                     overwrite=overwrite, workers=workers, progress=update)
    except (FileExistsError, UserError) as e:
        user_error(e)
    console = stdout()
    console.print(f"[bold]synthetic CelebA[/] written to {escape(result['root'])}", soft_wrap=True)
    splits = result["splits"]
    console.print(f"{result['identities']} identities, {result['images']} images "
                  f"(official partition: train {splits['train']}, valid {splits['valid']}, test {splits['test']})",
                  soft_wrap=True)
    counts = result["attribute_counts"]
    shown = ("Male", "Young", "Eyeglasses", "Wearing_Hat", "Smiling", "No_Beard", "Gray_Hair", "Blond_Hair", "Bald")
    console.print("attributes (images): " + ", ".join(f"{k} {counts[k]}" for k in shown), soft_wrap=True)
    console.print(f"check it with: fedcare data summary celeba {escape(result['root'])}", soft_wrap=True)


SUMMARY = {"celeba": summary_celeba}
SYNTH = {"celeba": synth_celeba}

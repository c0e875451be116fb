"""`fedcare data ...`: check a dataset copy (`summary unbc`, `summary cholec80`, `summary
heichole`, `summary celeba`) and generate synthetic cohorts (`synth pain`, `synth surgical`,
`synth celeba`). The lead mounts `data_app` as `fedcare data`."""

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


def _print_problems(out: Console, summary: dict) -> None:
    """A summary's problems by kind, a few of each with the path (and line) they concern."""
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
            where = f"{p['path']}:{p['line']}" if p.get("line") else p["path"]
            out.print(f"  {escape(where)}: {escape(p['detail'])}", soft_wrap=True)
        if n > len(shown):
            out.print(f"  ... and {n - len(shown)} more (use --json for the full list)")


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

    _print_problems(out, summary)


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


# --------------------------------------------------------------------------- surgical videos

_CACHE_HELP = ("Frame cache folder: videos are decoded once at 1 fps into it (default: $FEDCARE_CACHE or "
               "~/.cache/fedcare/frames). A second summary of the same copy decodes nothing.")
_INTERMEDIATE_HELP = ("Border class threshold: a most-frequent black side border of at least this fraction of the "
                      "frame width (per side) is 'intermediate' (default 0.025 = 6 px of 240).")
_LARGE_HELP = ("Border class threshold: at least this fraction of the width per side is 'large' "
               "(default 0.09; a 4:3 picture pillarboxed in 16:9 has 0.125).")
_TOLERANCE_HELP = "Allowed difference, in seconds, between the annotation rows and the video's frames."
_WORKERS_HELP = "Videos decoded in parallel (default: min(4, CPUs))."
_SHORT_TOOLS = {"Coagulation Instrument": "Coag.", "Suction-Irrigation": "Suction", "Specimen Bag": "Bag"}


def _surgical_summary(dataset: str, path: Path, json_: bool, cache_dir: Optional[Path], intermediate: float,
                      large: float, tolerance: int, workers: Optional[int], **options: Any) -> None:
    from fedcare.data.common import DataError
    from fedcare.data.surgical import BorderThresholds, FrameCache, summarize, thesis_clients

    try:
        thresholds = BorderThresholds(intermediate=intermediate, large=large)
        cache = FrameCache(cache_dir)
        with _progress_bar("decoding videos") as update:
            if dataset == "cholec80":
                from fedcare.data.cholec80 import load_cholec80

                ds = load_cholec80(path, cache=cache, thresholds=thresholds, tolerance_s=tolerance, strict=False,
                                   workers=workers, progress=update)
                clients = thesis_clients(ds, None, cache=cache, cholec80_split=options["split"])
            else:
                from fedcare.data.heichole import load_heichole

                ds = load_heichole(path, cache=cache, thresholds=thresholds, tolerance_s=tolerance, hd=options["hd"],
                                   strict=False, workers=workers, progress=update)
                clients = thesis_clients(None, ds, cache=cache, seed=options["seed"],
                                         heichole_test=options["test_videos"])
    except (DataError, ValueError, OSError) as e:
        _fail(str(e))
    summary = summarize(ds, clients)
    if json_:
        typer.echo(json.dumps(summary, indent=2))
        return
    _print_surgical_summary(summary)


def _wide_stdout() -> Console:
    """Like _stdout, but piped output (not a terminal) gets 160 columns instead of rich's 80,
    so the per-video tables stay readable in logs."""
    out = _stdout()
    return out if out.is_terminal else Console(highlight=False, width=160)


def _print_surgical_summary(summary: dict) -> None:
    out = _wide_stdout()
    title = "Cholec80" if summary["dataset"] == "cholec80" else "HeiChole"
    out.print(f"[bold]{title} copy[/] {escape(summary['root'])}", soft_wrap=True)
    if summary["synthetic"]:
        out.print("[bold yellow]SYNTHETIC:[/] generated by fedcare (fedcare-synthetic.json found); "
                  "no patient, no surgery.", soft_wrap=True)
    white = f", {summary['white_frames_dropped']} white (censored) frames dropped" if summary["dataset"] == "heichole" else ""
    th = summary["border_thresholds"]
    borders = ", ".join(f"{k} {v}" for k, v in summary["border_classes"].items())
    out.print(f"{summary['videos']} videos, {summary['frames']} labelled frames at 1 fps{white}; borders: {borders} "
              f"(intermediate >= {th['intermediate']:g}, large >= {th['large']:g} of the width per side)",
              soft_wrap=True)
    split = summary["split"]
    if isinstance(split, str):
        out.print(f"split: {split}", soft_wrap=True)
    else:
        out.print(f"split: {split['test_videos_per_centre']} random test videos per centre, seed {split['seed']}",
                  soft_wrap=True)

    heichole = summary["dataset"] == "heichole"
    table = Table(title="Videos", title_justify="left")
    columns = ["video", "client", "split", *(["centre"] if heichole else []), "fps", "frames", "1 fps",
               *(["white"] if heichole else []), "border", "class"]
    for col in columns:
        table.add_column(col, justify="right" if col in ("fps", "frames", "1 fps", "white", "border") else "left")
    for v in summary["per_video"]:
        row = [v["id"], v["client"] or "-", v["split"] or "-", *([v["centre"]] if heichole else []),
               f"{v['native_fps']:g}", str(v["video_frames"]), str(v["frames"]),
               *([str(v["white_dropped"])] if heichole else []),
               f"{v['border_px']} px {100 * v['border_fraction']:.1f}%", v["border"]]
        table.add_row(*row)
    out.print(table)

    tools = summary["tools"]
    prevalence = Table(title="Tool prevalence (% of frames)", title_justify="left")
    for col in ["client", "split", "frames", *(_SHORT_TOOLS.get(t, t) for t in tools)]:
        prevalence.add_column(col, justify="left" if col in ("client", "split") else "right")
    for client, splits in summary["clients"].items():
        for split_name, entry in splits.items():
            prevalence.add_row(client, split_name, str(entry["frames"]),
                               *[f"{100 * entry['prevalence'][t]:.1f}" for t in tools])
    out.print(prevalence)
    cache = summary["cache"]
    out.print(f"frame cache {escape(cache['root'])}: {cache['hits']} videos read from the cache, {cache['misses']} "
              f"decoded; {cache['files']} videos, {cache['bytes'] / 1e6:.1f} MB on disk", soft_wrap=True)
    _print_problems(out, summary)


# --------------------------------------------------------------------------- summary celeba


def _filter_counts(ds: Any, rows: Any | None) -> list[dict]:
    """Images matching each Table 4.1 client filter (all listed images, and those with a face)."""
    import numpy as np

    from fedcare.data.celeba import ATTRIBUTES
    from fedcare.data.identity_partition import load_attribute_clients

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


@summary_app.command("celeba")
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

    from fedcare.data.celeba import CelebaLayoutError, FaceCropper, load_celeba, summarize
    from fedcare.data.common import DataError

    try:
        ds = load_celeba(path, strict=False)
        faces = None
        if detect and len(ds):
            people = ds.identity_ids()
            if identities is not None and identities < len(people):
                people = np.sort(np.random.default_rng([seed, 99]).choice(people, identities, replace=False))
            cropper = FaceCropper(cache_dir=cache_dir, workers=workers)
            with _progress_bar("detecting faces") as update:
                faces = cropper.faces(ds, people, strict=False, progress=update)
    except CelebaLayoutError as e:
        _fail(str(e))
    except (DataError, ValueError) as e:
        _fail(str(e))
    summary = summarize(ds, faces)
    summary["attribute_filters"] = _filter_counts(ds, faces.rows if faces is not None else None)
    if json_:
        typer.echo(json.dumps(summary, indent=2))
        return
    _print_celeba(summary)


def _print_celeba(summary: dict) -> None:
    out = _stdout()
    out.print(f"[bold]CelebA copy[/] {escape(summary['root'])}", soft_wrap=True)
    if summary["synthetic"]:
        out.print("[bold yellow]SYNTHETIC:[/] generated by fedcare (fedcare-synthetic.json found); "
                  "these are not real people.", soft_wrap=True)
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
    _print_problems(out, summary)


@summary_app.command("cholec80")
def summary_cholec80(
    path: Annotated[Path, typer.Argument(
        help="Root of the Cholec80 copy: the folder holding videos/ and tool_annotations/.", show_default=False)],
    json_: Annotated[bool, typer.Option(
        "--json", help="Print the full summary (every video and problem) as JSON on stdout instead of tables.")] = False,
    cache: Annotated[Optional[Path], typer.Option(help=_CACHE_HELP, show_default=False)] = None,
    split: Annotated[str, typer.Option(
        help="Train/test split of the video numbers: thesis (1-60 train, 61-80 test), 40/40, 32/8/40 or 40/8/32.")] = "thesis",
    intermediate: Annotated[float, typer.Option(help=_INTERMEDIATE_HELP)] = 0.025,
    large: Annotated[float, typer.Option(help=_LARGE_HELP)] = 0.09,
    tolerance: Annotated[int, typer.Option(help=_TOLERANCE_HELP)] = 2,
    workers: Annotated[Optional[int], typer.Option(help=_WORKERS_HELP, show_default=False)] = None,
) -> None:
    """Check a Cholec80 copy and summarize it for the surgical study.

    Decodes every video once at 1 fps (frame cache), maps the 7 tools to the thesis's 6
    (Bipolar + Hook = Coagulation Instrument), measures each video's black side border and
    assigns it to CHO1 (large), CHO2 (intermediate) or CHO3 (none). Prints videos, frames,
    border classes, tool prevalence per client and split, and every problem with its path
    (missing or malformed annotations, unreadable videos, frame-count mismatches).
    Exit code 2 when PATH is not a Cholec80 copy."""
    _surgical_summary("cholec80", path, json_, cache, intermediate, large, tolerance, workers, split=split)


@summary_app.command("heichole")
def summary_heichole(
    path: Annotated[Path, typer.Argument(
        help="Root of the HeiChole copy: the folder holding Videos/Full/ and Annotations/Instrument/.",
        show_default=False)],
    json_: Annotated[bool, typer.Option(
        "--json", help="Print the full summary (every video and problem) as JSON on stdout instead of tables.")] = False,
    cache: Annotated[Optional[Path], typer.Option(help=_CACHE_HELP, show_default=False)] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random test videos of each centre (as the study uses it).")] = 0,
    test_videos: Annotated[int, typer.Option(help="Random test videos per centre (thesis: 3).")] = 3,
    hd: Annotated[bool, typer.Option("--hd", help="Read the HD copies in Videos/Full/HD/ instead of the SD ones.")] = False,
    intermediate: Annotated[float, typer.Option(help=_INTERMEDIATE_HELP)] = 0.025,
    large: Annotated[float, typer.Option(help=_LARGE_HELP)] = 0.09,
    tolerance: Annotated[int, typer.Option(help=_TOLERANCE_HELP)] = 2,
    workers: Annotated[Optional[int], typer.Option(help=_WORKERS_HELP, show_default=False)] = None,
) -> None:
    """Check a HeiChole (EndoVis 2019) copy and summarize it for the surgical study.

    Decodes every video once at 1 fps (frame cache), drops white (censored) frames and the
    Stapler, assigns Hei-Chole1-12 to HEI1 (Heidelberg) and 13-24 to HEI2 (Salem) and draws
    each centre's test videos. Prints videos, frames, white frames, borders, tool prevalence
    per client and split, and every problem with its path. Exit code 2 when PATH is not a
    HeiChole copy."""
    _surgical_summary("heichole", path, json_, cache, intermediate, large, tolerance, workers, seed=seed,
                      test_videos=test_videos, hd=hd)


@synth_app.command("surgical")
def synth_surgical(
    out: Annotated[Path, typer.Argument(
        help="Folder to create; it receives cholec80/ and heichole/ copies (real mp4 files and annotations in the "
             "real layouts) and fedcare-synthetic.json.", show_default=False)],
    seed: Annotated[int, typer.Option(help="Random seed; the same seed gives the same annotation files "
                                           "(and, with the same OpenCV build, the same mp4 bytes).")] = 0,
    videos: Annotated[int, typer.Option(
        help="Cholec80 videos of CHO1 and of CHO3 (CHO2 gets twice as many: quantity skew); 2..16.")] = 4,
    heichole_videos: Annotated[int, typer.Option(
        help="HeiChole videos per centre (HEI1 Heidelberg, HEI2 Salem), 3 of them test videos; 4..12.")] = 6,
    seconds: Annotated[int, typer.Option(help="Mean length of a Cholec80 video in seconds (each client's span 0.8-1.2x).")] = 30,
    heichole_seconds: Annotated[Optional[int], typer.Option(
        help="Mean length of a HeiChole video in seconds (default: each HeiChole client gets about 3/4 of CHO1's "
             "frames, as HeiChole clients hold less data in the thesis).",
        show_default=False)] = None,
    width: Annotated[int, typer.Option(help="Frame width of the mp4 files in pixels (even).")] = 240,
    height: Annotated[int, typer.Option(help="Frame height of the mp4 files in pixels (even; mp4v drops an odd row).")] = 136,
    split_seed: Annotated[int, typer.Option(
        help="The seed the study will draw the HeiChole test videos with; HEI2's test videos are generated without "
             "Suction-Irrigation.")] = 0,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace OUT if it already exists.")] = False,
) -> None:
    """Generate synthetic laparoscopic videos in the Cholec80 and HeiChole layouts (not real surgery).

    Five clients as in the Markert thesis: CHO1/CHO2/CHO3 with large / intermediate / no black
    borders (CHO2 twice the data), HEI1 with label skew (more rare tools, less coagulation),
    HEI2 with an information bar and no Suction-Irrigation in its test set; six drawn tools
    entering and leaving in episodes. Exit code 2 when OUT exists (without --overwrite) or an
    option is invalid."""
    from fedcare.data.synthetic.surgical import generate_surgical

    try:
        with _progress_bar("writing synthetic videos") as update:
            result = generate_surgical(out, seed=seed, videos=videos, heichole_videos=heichole_videos, seconds=seconds,
                                       heichole_seconds=heichole_seconds, width=width, height=height,
                                       split_seed=split_seed, overwrite=overwrite, progress=update)
    except (FileExistsError, ValueError, RuntimeError) as e:
        _fail(str(e))
    console = _wide_stdout()
    console.print(f"[bold]synthetic surgical videos[/] written to {escape(result['root'])}", soft_wrap=True)
    console.print(f"{result['videos']} videos, {result['frames']} video frames, in {result['seconds_taken']:.1f} s",
                  soft_wrap=True)
    from fedcare.data.surgical import TOOLS

    table = Table(title="Clients (labelled frames at 1 fps, tool prevalence %)", title_justify="left")
    for col in ["client", "split", "videos", "frames", *(_SHORT_TOOLS.get(t, t) for t in TOOLS)]:
        table.add_column(col, justify="left" if col in ("client", "split") else "right")
    for client, splits in result["clients"].items():
        for split_name in ("train", "test"):
            e = splits.get(split_name)
            if e is None:
                continue
            n = e["frames"] or 1
            table.add_row(client, split_name, str(len(e["videos"])), str(e["frames"]),
                          *[f"{100 * c / n:.1f}" for c in e["tool_frames"]])
    console.print(table)
    console.print(f"check it with: fedcare data summary cholec80 {escape(result['cholec80'])}", soft_wrap=True)
    console.print(f"           and: fedcare data summary heichole {escape(result['heichole'])}", soft_wrap=True)
# --------------------------------------------------------------------------- synth celeba


@synth_app.command("celeba")
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
    from fedcare.data.synthetic.celeba import generate_celeba

    try:
        with _progress_bar("drawing synthetic faces") as update:
            result = generate_celeba(out, seed=seed, identities=identities, images_per_identity=images_per_identity,
                                     overwrite=overwrite, workers=workers, progress=update)
    except (FileExistsError, ValueError) as e:
        _fail(str(e))
    console = _stdout()
    console.print(f"[bold]synthetic CelebA[/] written to {escape(result['root'])}", soft_wrap=True)
    splits = result["splits"]
    console.print(f"{result['identities']} identities, {result['images']} images "
                  f"(official partition: train {splits['train']}, valid {splits['valid']}, test {splits['test']})",
                  soft_wrap=True)
    counts = result["attribute_counts"]
    shown = ("Male", "Young", "Eyeglasses", "Wearing_Hat", "Smiling", "No_Beard", "Gray_Hair", "Blond_Hair", "Bald")
    console.print("attributes (images): " + ", ".join(f"{k} {counts[k]}" for k in shown), soft_wrap=True)
    console.print(f"check it with: fedcare data summary celeba {escape(result['root'])}", soft_wrap=True)

"""`fedcare data summary cholec80|heichole` (check a copy of either layout and show the
thesis's clients) and `fedcare data synth surgical` (synthetic videos in both layouts). The
readers are imported when a command runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from fedcare.data.console import print_heading, print_problems, progress_bar, user_error, wide_stdout
from fedcare.errors import UserError



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
    from fedcare.data.surgical.clients import BorderThresholds, FrameCache, summarize, thesis_clients

    try:
        thresholds = BorderThresholds(intermediate=intermediate, large=large)
        cache = FrameCache(cache_dir)
        with progress_bar("decoding videos") as update:
            if dataset == "cholec80":
                from fedcare.data.surgical.cholec80 import load_cholec80

                ds = load_cholec80(path, cache=cache, thresholds=thresholds, tolerance_s=tolerance, strict=False,
                                   workers=workers, progress=update)
                clients = thesis_clients(ds, None, cache=cache, cholec80_split=options["split"])
            else:
                from fedcare.data.surgical.heichole import load_heichole

                ds = load_heichole(path, cache=cache, thresholds=thresholds, tolerance_s=tolerance, hd=options["hd"],
                                   strict=False, workers=workers, progress=update)
                clients = thesis_clients(None, ds, cache=cache, seed=options["seed"],
                                         heichole_test=options["test_videos"])
    except (UserError, OSError) as e:
        user_error(e)
    summary = summarize(ds, clients)
    if json_:
        typer.echo(json.dumps(summary, indent=2))
        return
    _print_surgical_summary(summary)



def _print_surgical_summary(summary: dict) -> None:
    out = wide_stdout()
    title = "Cholec80" if summary["dataset"] == "cholec80" else "HeiChole"
    print_heading(out, f"{title} copy", summary, "no patient, no surgery.")
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
    print_problems(out, summary)



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
    from fedcare.data.surgical.synthetic import generate_surgical

    try:
        with progress_bar("writing synthetic videos") as update:
            result = generate_surgical(out, seed=seed, videos=videos, heichole_videos=heichole_videos, seconds=seconds,
                                       heichole_seconds=heichole_seconds, width=width, height=height,
                                       split_seed=split_seed, overwrite=overwrite, progress=update)
    except (FileExistsError, UserError) as e:
        user_error(e)
    console = wide_stdout()
    console.print(f"[bold]synthetic surgical videos[/] written to {escape(result['root'])}", soft_wrap=True)
    console.print(f"{result['videos']} videos, {result['frames']} video frames, in {result['seconds_taken']:.1f} s",
                  soft_wrap=True)
    from fedcare.data.surgical.clients import TOOLS

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


SUMMARY = {"cholec80": summary_cholec80, "heichole": summary_heichole}
SYNTH = {"surgical": synth_surgical}

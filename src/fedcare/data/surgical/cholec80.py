"""Loader for Cholec80 (Twinanda et al. 2016) in its official layout, as the Markert thesis
uses it: tool presence at 1 fps, mapped to the thesis's 6 tools, each video's black side
border measured and classified.

Layout (reference/dataset-formats.md §3.1)::

    <root>/videos/videoNN.mp4                      NN = 01..80, 25 fps
    <root>/videos/videoNN-timestamp.txt            (ignored)
    <root>/tool_annotations/videoNN-tool.txt       tab-separated, one header line:
        Frame  Grasper  Bipolar  Hook  Scissors  Clipper  Irrigator  SpecimenBag
        0      1        0        0     0         0        0          0
        25     ...                                         one row per second (step 25)
    <root>/phase_annotations/videoNN-phase.txt     (ignored; phases are not used)

Folder and file names are matched case-insensitively; the 7 tool columns are found by their
header names (any order, any case), so only the names must be right.

Choices (the thesis and the reference are silent; see also common's docstring
for the border classes)
--------------------------------------------------------------------------------------

* **Tool mapping** (thesis Fig. 5.1): Grasper -> Grasper, Clipper -> Clipper, Bipolar OR
  Hook -> Coagulation Instrument, Scissors -> Scissors, Irrigator -> Suction-Irrigation,
  SpecimenBag -> Specimen Bag.
* **Frames**: the video is sampled at 1 fps from frame 0 (every 25th frame of a 25 fps
  video), so the k-th cached frame is the frame of the k-th annotation row (frame 25k).
  Rows must step by exactly 25 from 0 (anything else is a malformed line).
* **Frame-count tolerance**: the number of annotation rows must equal the number of 1-fps
  frames of the video, ceil(frames / 25), within ``tolerance_s`` = 2 rows (seconds); the
  common prefix is used. Larger differences mean the annotation belongs to another video
  or the video is cut, and are an error.
* **Split** (``SPLITS``): the thesis uses "the same split as Funke et al. 2018" without
  listing it. Its per-client test shares, 19% (CHO2) to 33% (CHO1), rule out the splits with
  40 test videos (40/40, 32/8/40: ~50%) and 32 (40/8/32: 40%); they fit 60 train / 20 test,
  the NCT Dresden convention: **videos 1-60 train, 61-80 test** (``"thesis"``, the default).
  The reference's other conventions are available by name: ``"40/40"`` (EndoNet),
  ``"32/8/40"`` (TMRNet; 33-40 are "val"), ``"40/8/32"`` (CAMMA; 41-48 are "val").

Problems
--------
``load_cholec80`` records one ``SurgicalProblem`` (kind, path, detail) per defect and, with
``strict=True`` (the default), raises the first fatal one as a ``DataError`` naming the
file. Kinds (``PROBLEM_KINDS``): see below. ``strict=False`` returns every video it could
load plus the problems (what ``fedcare data summary cholec80`` prints).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from fedcare.data.surgical.common import (
    TOOLS,
    BorderThresholds,
    SurgicalAnnotationError,
    SurgicalLayoutError,
    SurgicalVideo,
    VideoProblem,
    find_child,
    measure_border,
)
from fedcare.data.surgical.reader import Item, Layout, SurgicalDataset, check_root, load, read_annotation
from fedcare.data.video import FrameCache

__all__ = [
    "ANNOTATION_STEP",
    "CENTRE",
    "COLUMNS",
    "PROBLEM_KINDS",
    "SPLITS",
    "TOOL_MAP",
    "Cholec80Dataset",
    "load_cholec80",
    "map_tools",
    "read_tool_annotation",
    "split_of",
]

COLUMNS: tuple[str, ...] = ("Grasper", "Bipolar", "Hook", "Scissors", "Clipper", "Irrigator", "SpecimenBag")
# thesis tool -> the Cholec80 columns whose OR it is
TOOL_MAP: dict[str, tuple[str, ...]] = {
    "Grasper": ("Grasper",),
    "Clipper": ("Clipper",),
    "Coagulation Instrument": ("Bipolar", "Hook"),
    "Scissors": ("Scissors",),
    "Suction-Irrigation": ("Irrigator",),
    "Specimen Bag": ("SpecimenBag",),
}
ANNOTATION_STEP = 25  # tool rows are every 25th frame of the 25 fps video
CENTRE = "Strasbourg"
N_VIDEOS = 80
TOLERANCE_S = 2

SPLITS: dict[str, dict[str, range]] = {
    "thesis": {"train": range(1, 61), "test": range(61, 81)},
    "40/40": {"train": range(1, 41), "test": range(41, 81)},
    "32/8/40": {"train": range(1, 33), "val": range(33, 41), "test": range(41, 81)},
    "40/8/32": {"train": range(1, 41), "val": range(41, 49), "test": range(49, 81)},
}

PROBLEM_KINDS: dict[str, str] = {
    "missing_annotation": "video without its tool_annotations/videoNN-tool.txt",
    "malformed_annotation": "tool annotation file with a bad header or line",
    "unreadable_video": "video that cannot be opened or decoded (corrupt, truncated)",
    "frame_count_mismatch": "annotation rows and 1-fps video frames differ by more than the tolerance",
    "annotation_without_video": "tool annotation file without its video",
    "stray_file": "unexpected .mp4/.txt file in videos/ or tool_annotations/",
}

HEADER_TEXT = "Frame\\t" + "\\t".join(COLUMNS)  # as printed in messages
_LAYOUT_HINT = "expected the Cholec80 layout: videos/videoNN.mp4 and tool_annotations/videoNN-tool.txt"


@dataclass
class Cholec80Dataset(SurgicalDataset):
    def by_border(self, border: str) -> list[SurgicalVideo]:
        return [v for v in self.videos if v.border == border]


def split_of(number: int, split: str = "thesis") -> str | None:
    """"train", "val" or "test" for video `number` under the named split (``SPLITS``); None
    for numbers outside 1..80."""
    try:
        parts = SPLITS[split]
    except KeyError:
        raise ValueError(f"unknown Cholec80 split {split!r} (known: {', '.join(SPLITS)})") from None
    for name, numbers in parts.items():
        if number in numbers:
            return name
    return None


def read_tool_annotation(path: Path | str) -> np.ndarray:
    """The (rows, 7) uint8 tool columns of a ``videoNN-tool.txt`` file, in ``COLUMNS`` order.
    Raises SurgicalAnnotationError naming the file and line for a missing or bad header, a
    line without 8 whole numbers, a value other than 0/1, or a frame number that is not 25x
    the row index."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise SurgicalAnnotationError(f"{path}: cannot read the tool annotation ({e.strerror or e})") from None
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        raise SurgicalAnnotationError(f"{path}: empty tool annotation file (expected the header "
                                      f"'{HEADER_TEXT}' and one row per second)")
    header = lines[first].split()
    lower = [h.lower() for h in header]
    if not header or lower[0] != "frame" or len(header) != 8 or sorted(lower[1:]) != sorted(c.lower() for c in COLUMNS):
        raise SurgicalAnnotationError(f"{path}: line {first + 1}: expected the header '{HEADER_TEXT}', "
                                      f"got {lines[first].strip()[:80]!r}")
    order = [lower.index(c.lower()) for c in COLUMNS]
    rows: list[list[int]] = []
    for lineno in range(first + 2, len(lines) + 1):
        fields = lines[lineno - 1].split()
        if not fields:
            continue
        try:
            values = [int(f) for f in fields]
        except ValueError:
            values = []
        if len(values) != 8:
            raise SurgicalAnnotationError(f"{path}: line {lineno}: expected 8 whole numbers (frame and 7 tools), "
                                          f"got {lines[lineno - 1].strip()[:80]!r}")
        expected_frame = ANNOTATION_STEP * len(rows)
        if values[0] != expected_frame:
            raise SurgicalAnnotationError(f"{path}: line {lineno}: frame {values[0]}, expected {expected_frame} "
                                          f"(rows step by {ANNOTATION_STEP} from 0)")
        tools = [values[k] for k in order]
        if any(v not in (0, 1) for v in tools):
            raise SurgicalAnnotationError(f"{path}: line {lineno}: tool values must be 0 or 1, "
                                          f"got {lines[lineno - 1].strip()[:80]!r}")
        rows.append(tools)
    return np.asarray(rows, np.uint8).reshape(len(rows), len(COLUMNS))


def map_tools(raw: np.ndarray) -> np.ndarray:
    """(n, 7) Cholec80 columns (``COLUMNS`` order) -> (n, 6) uint8 thesis tools (``TOOLS``
    order); Coagulation Instrument = Bipolar OR Hook."""
    raw = np.asarray(raw)
    out = np.zeros((raw.shape[0], len(TOOLS)), np.uint8)
    for j, tool in enumerate(TOOLS):
        for column in TOOL_MAP[tool]:
            out[:, j] |= raw[:, COLUMNS.index(column)].astype(np.uint8)
    return out


def _folders(root: Path) -> tuple[Path, Path]:
    """videos/ and tool_annotations/ of the copy at `root` (any case), or a layout error."""
    videos_dir = find_child(root, "videos")
    tools_dir = find_child(root, "tool_annotations")
    if videos_dir is None or tools_dir is None:
        missing = " and ".join(n for n, d in (("videos/", videos_dir), ("tool_annotations/", tools_dir)) if d is None)
        hint = ""
        inner = find_child(root, "cholec80")
        if inner is not None and find_child(inner, "videos") is not None:
            hint = f"; did you mean {inner}?"
        raise SurgicalLayoutError(f"{root}: no {missing} folder ({_LAYOUT_HINT}){hint}")
    return videos_dir, tools_dir


def read_video(item: Item, cache: FrameCache, *, thresholds: BorderThresholds, tolerance_s: int) -> SurgicalVideo:
    """One video and its tool annotation: a row per second, the common prefix of rows and 1-fps frames."""
    raw = read_annotation(item, read_tool_annotation, "tool annotation")
    cached = cache.get(item.video)
    info = cached.info
    rows, sampled = raw.shape[0], info.frames
    if abs(rows - sampled) > tolerance_s:
        per_second = math.ceil(info.frame_count / info.step) if info.step else sampled
        raise VideoProblem(
            "frame_count_mismatch", item.annotation,
            f"{rows} annotation rows (1 per second) but the video {item.video} has {info.frame_count} frames at "
            f"{info.native_fps:g} fps = {per_second} frames at 1 fps (tolerance ±{tolerance_s})")
    n = min(rows, sampled)
    px, fraction, border = measure_border(cached.frames, thresholds)
    return SurgicalVideo(
        dataset="cholec80", id=f"video{item.number:02d}", number=item.number, path=item.video,
        annotation=item.annotation, centre=CENTRE, border=border, border_px=px, border_fraction=fraction,
        native_fps=info.native_fps, frame_count=info.frame_count, sampled=sampled,
        seconds=np.arange(n, dtype=np.int64), labels=map_tools(raw[:n]),
        unlabelled=max(0, sampled - n),
    )


LAYOUT = Layout(
    name="cholec80", hint=_LAYOUT_HINT,
    video_re=re.compile(r"^video(\d{2,})\.mp4$", re.IGNORECASE),
    annotation_re=re.compile(r"^video(\d{2,})-tool\.txt$", re.IGNORECASE),
    ignored_re=re.compile(r"^video\d{2,}-timestamp\.txt$", re.IGNORECASE),
    video_name="videoNN.mp4", annotation_name="videoNN-tool.txt",
    video_file=lambda number: f"video{number:02d}.mp4", annotation_file=lambda number: f"video{number:02d}-tool.txt",
    stray_suffixes=(".mp4", ".txt", ".csv", ".avi", ".mkv"), problem_kinds=PROBLEM_KINDS, dataset=Cholec80Dataset,
)


def load_cholec80(
    root: Path | str,
    *,
    cache: FrameCache | None = None,
    numbers: Iterable[int] | None = None,
    thresholds: BorderThresholds = BorderThresholds(),
    tolerance_s: int = TOLERANCE_S,
    strict: bool = True,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Cholec80Dataset:
    """Load a Cholec80 copy at `root` (see the module docstring).

    cache: the FrameCache the videos are decoded into (default: ``FrameCache()``, 240x135 at
        1 fps in $FEDCARE_CACHE or ~/.cache/fedcare/frames). A second load decodes nothing.
    numbers: only these video numbers (all when None).
    thresholds: border classes (fractions of the width per side).
    tolerance_s: allowed difference between annotation rows and 1-fps frames.
    strict: raise the first fatal problem as a DataError naming the file (else only record it).
    workers: decoding threads (default min(4, CPUs)); progress: ``progress(done, total)`` over videos.

    Raises SurgicalLayoutError naming the path if `root` is not a Cholec80 copy.
    """
    root = check_root(LAYOUT, root, tolerance_s)
    read = partial(read_video, thresholds=thresholds, tolerance_s=tolerance_s)
    return load(LAYOUT, root, _folders, read, cache=cache, numbers=numbers, thresholds=thresholds, strict=strict,
                workers=workers, progress=progress)

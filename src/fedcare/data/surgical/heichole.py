"""Loader for HeiChole (EndoVis 2019 "Surgical Workflow and Skill Analysis", the 24 public
training videos) in its distributed layout, as the Markert thesis uses it: tool presence at
1 fps, censored white frames dropped, Stapler dropped, the 6 thesis tools, the centre of
every video.

Layout (reference/dataset-formats.md §3.5)::

    <root>/Videos/Full/Hei-Chole<N>.mp4                      N = 1..24 (SD copies)
    <root>/Videos/Full/HD/Hei-Chole<N>.mp4                   (HD copies; ``hd=True``)
    <root>/Annotations/Instrument/Hei-Chole<N>_Annotation_Instrument.csv
        no header, one row per video frame at the native rate (25 or 50 fps), 22 fields:
        <frame>,c0,...,c20 with 0/1 values; c0 Grasper, c1 Clipper, c2 Coagulation
        instruments, c3 Scissors, c4 Suction-irrigation, c5 Specimen bag, c6 Stapler,
        c7..c19 reserved (0), c20 undefined instrument shaft
    (Annotations/{Phase,Action,Skill}, *_Detailed.csv and Videos/Skill are ignored)

Every folder and file name is matched case-insensitively (copies in lower case exist).

Choices (the thesis and the reference are silent)
-------------------------------------------------

* **Centres.** The thesis splits the 24 public videos into 12 from Heidelberg University
  Hospital (HEI1) and 12 from Salem Hospital (HEI2) but does not list them, and no per-video
  list was found. Default (``HEICHOLE_CENTRES``): **Hei-Chole1-12 = Heidelberg, 13-24 =
  Salem**. Evidence: videos 1-12 share one recording setup (960x540 SD with a 1920x1080 HD
  copy, 25 fps), 13-24 are a mix (720x576, native 1080p, 50 fps) — two groups of 12, as the
  thesis says. Pass ``centres={number: name}`` to use another assignment. Videos with no
  centre (e.g. the non-public 25-33) load with centre "unknown" and join no client.
* **Sampling.** 1 fps from frame 0: every ``round(fps)``-th frame, i.e. every 25th of a
  25 fps video and every 50th of a 50 fps one. Each sampled frame takes the labels of its
  own annotation row.
* **Tools.** c0..c5 are the thesis's 6 tools one to one (HeiChole's categories are its label
  space). **Stapler (c6) is dropped** (thesis §5.1), as is the undefined shaft (c20).
* **White frames** (``common.white_frames``) are dropped, with their labels.
* **Frame-count tolerance**: rows must number the video's frames within ``tolerance_s`` = 2
  seconds' worth of frames; sampled frames past the last row are left out (``unlabelled``).
* **Rows** must be numbered 0, 1, 2, ... (one per frame); 22 fields each.

Problems and errors: as in ``cholec80`` (``PROBLEM_KINDS``, ``strict``).
"""

from __future__ import annotations

import io
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
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
    white_frames,
)
from fedcare.data.surgical.reader import Item, Layout, SurgicalDataset, check_root, load, read_annotation
from fedcare.data.video import FrameCache

__all__ = [
    "CATEGORIES",
    "HEICHOLE_CENTRES",
    "N_FIELDS",
    "PROBLEM_KINDS",
    "TOOL_COLUMNS",
    "HeiCholeDataset",
    "load_heichole",
    "map_tools",
    "read_instrument_annotation",
    "test_videos",
]

CATEGORIES: dict[int, str] = {0: "Grasper", 1: "Clipper", 2: "Coagulation instruments", 3: "Scissors",
                              4: "Suction-irrigation", 5: "Specimen bag", 6: "Stapler",
                              20: "Undefined instrument shaft"}
N_FIELDS = 22  # frame + 21 category columns
# thesis tool -> category column (0-based category id; the CSV field is id + 1)
TOOL_COLUMNS: dict[str, int] = {"Grasper": 0, "Clipper": 1, "Coagulation Instrument": 2, "Scissors": 3,
                                "Suction-Irrigation": 4, "Specimen Bag": 5}
STAPLER = 6
HEICHOLE_CENTRES: dict[int, str] = {**{n: "Heidelberg" for n in range(1, 13)}, **{n: "Salem" for n in range(13, 25)}}
# fixed per centre, so a centre's test videos do not depend on the other centres'
_CENTRE_STREAM = {"Heidelberg": 1, "Salem": 2, "Sinsheim": 3}
TOLERANCE_S = 2

PROBLEM_KINDS: dict[str, str] = {
    "missing_annotation": "video without its Annotations/Instrument/Hei-Chole<N>_Annotation_Instrument.csv",
    "malformed_annotation": "instrument annotation file with a bad line",
    "unreadable_video": "video that cannot be opened or decoded (corrupt, truncated)",
    "frame_count_mismatch": "annotation rows and video frames differ by more than the tolerance",
    "annotation_without_video": "instrument annotation file without its video",
    "stray_file": "unexpected .mp4/.csv file in Videos/Full/ or Annotations/Instrument/",
}

_LAYOUT_HINT = ("expected the HeiChole layout: Videos/Full/Hei-Chole<N>.mp4 and "
                "Annotations/Instrument/Hei-Chole<N>_Annotation_Instrument.csv")


@dataclass
class HeiCholeDataset(SurgicalDataset):
    def by_centre(self, centre: str) -> list[SurgicalVideo]:
        return [v for v in self.videos if v.centre == centre]


def test_videos(numbers: Iterable[int], centre: str, *, n_test: int = 3, seed: int = 0) -> list[int]:
    """The thesis's random test videos of one centre: `n_test` of `numbers`, drawn with
    ``np.random.default_rng([seed, <centre stream>])`` from the sorted numbers; sorted.
    Deterministic, and independent of the other centres' videos."""
    pool = sorted({int(n) for n in numbers})
    if n_test < 0:
        raise ValueError(f"n_test must be >= 0, got {n_test}")
    if n_test > len(pool):
        raise ValueError(f"{centre}: {n_test} test videos requested but only {len(pool)} videos")
    stream = _CENTRE_STREAM.get(centre, sum(centre.encode()) + 100)
    rng = np.random.default_rng([int(seed), stream])
    return sorted(int(n) for n in rng.choice(pool, size=n_test, replace=False)) if n_test else []


test_videos.__test__ = False  # not a pytest test


def _bad_line(path: Path, text: str) -> SurgicalAnnotationError:
    """Find the first bad line of an instrument CSV (slow path, only after a failure)."""
    row = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.strip().split(",")]
        if len(fields) != N_FIELDS:
            return SurgicalAnnotationError(f"{path}: line {lineno}: expected {N_FIELDS} comma-separated fields "
                                           f"(frame and 21 categories), got {len(fields)}: {line.strip()[:80]!r}")
        try:
            values = [int(f) for f in fields]
        except ValueError:
            return SurgicalAnnotationError(f"{path}: line {lineno}: not whole numbers: {line.strip()[:80]!r}")
        if values[0] != row:
            return SurgicalAnnotationError(f"{path}: line {lineno}: frame {values[0]}, expected {row} "
                                           f"(one row per video frame from 0)")
        if any(v not in (0, 1) for v in values[1:]):
            return SurgicalAnnotationError(f"{path}: line {lineno}: category values must be 0 or 1, "
                                           f"got {line.strip()[:80]!r}")
        row += 1
    return SurgicalAnnotationError(f"{path}: cannot parse the instrument annotation")


def read_instrument_annotation(path: Path | str) -> np.ndarray:
    """The (rows, 21) uint8 category columns (c0..c20) of a
    ``Hei-Chole<N>_Annotation_Instrument.csv`` file; row r is video frame r. Raises
    SurgicalAnnotationError naming the file and line for a line without 22 whole numbers, a
    frame number out of sequence or a value other than 0/1."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise SurgicalAnnotationError(f"{path}: cannot read the instrument annotation ({e.strerror or e})") from None
    if not text.strip():
        raise SurgicalAnnotationError(f"{path}: empty instrument annotation file (expected one row "
                                      f"'<frame>,c0,...,c20' per video frame)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            values = np.loadtxt(io.StringIO(text), delimiter=",", dtype=np.int64, ndmin=2)
        if values.shape[1] != N_FIELDS:
            raise ValueError
    except ValueError:
        raise _bad_line(path, text) from None
    if not np.array_equal(values[:, 0], np.arange(len(values))) or ((values[:, 1:] != 0) & (values[:, 1:] != 1)).any():
        raise _bad_line(path, text)
    return values[:, 1:].astype(np.uint8)


def map_tools(categories: np.ndarray) -> np.ndarray:
    """(n, 21) HeiChole category columns -> (n, 6) uint8 thesis tools (``TOOLS`` order).
    Stapler (c6) and the undefined shaft (c20) are dropped."""
    categories = np.asarray(categories)
    return np.ascontiguousarray(categories[:, [TOOL_COLUMNS[t] for t in TOOLS]], dtype=np.uint8)


def _folders(root: Path, hd: bool) -> tuple[Path, Path]:
    """Videos/Full/ (or Videos/Full/HD/) and Annotations/Instrument/ of the copy at `root`
    (any case), or a layout error."""
    videos_root = find_child(root, "Videos")
    full = find_child(videos_root, "Full") if videos_root is not None else None
    if full is not None and hd:
        full = find_child(full, "HD")
    annotations_root = find_child(root, "Annotations")
    instrument = find_child(annotations_root, "Instrument") if annotations_root is not None else None
    if full is None or instrument is None:
        missing = " and ".join(n for n, d in ((f"Videos/Full{'/HD' if hd else ''}/", full),
                                             ("Annotations/Instrument/", instrument)) if d is None)
        hint = ""
        for name in ("HeiChole", "heichole", "Hei-Chole"):
            inner = find_child(root, name)
            if inner is not None and find_child(inner, "Videos") is not None:
                hint = f"; did you mean {inner}?"
                break
        raise SurgicalLayoutError(f"{root}: no {missing} folder ({_LAYOUT_HINT}){hint}")
    return full, instrument


def read_video(item: Item, cache: FrameCache, *, centres: Mapping[int, str], thresholds: BorderThresholds,
               tolerance_s: int) -> SurgicalVideo:
    """One video and its instrument annotation: a row per native frame, white frames dropped."""
    categories = read_annotation(item, read_instrument_annotation, "instrument annotation")
    cached = cache.get(item.video)
    info = cached.info
    rows = categories.shape[0]
    allowed = round(tolerance_s * info.native_fps)
    if abs(rows - info.frame_count) > allowed:
        raise VideoProblem(
            "frame_count_mismatch", item.annotation,
            f"{rows} annotation rows (1 per frame) but the video {item.video} has {info.frame_count} frames "
            f"at {info.native_fps:g} fps (tolerance ±{allowed} frames = {tolerance_s} s)")
    index = np.asarray(info.frame_indices, np.int64)
    labelled = index < rows
    white = white_frames(cached.frames)
    keep = labelled & ~white
    seconds = np.flatnonzero(keep).astype(np.int64)
    px, fraction, border = measure_border(cached.frames, thresholds, exclude=white)
    return SurgicalVideo(
        dataset="heichole", id=f"Hei-Chole{item.number}", number=item.number, path=item.video,
        annotation=item.annotation, centre=centres.get(item.number, "unknown"), border=border,
        border_px=px, border_fraction=fraction, native_fps=info.native_fps, frame_count=info.frame_count,
        sampled=info.frames, seconds=seconds, labels=map_tools(categories[index[seconds]]),
        white_dropped=int((white & labelled).sum()), unlabelled=int((~labelled).sum()),
    )


LAYOUT = Layout(
    name="heichole", hint=_LAYOUT_HINT,
    video_re=re.compile(r"^hei-chole(\d+)\.mp4$", re.IGNORECASE),
    annotation_re=re.compile(r"^hei-chole(\d+)_annotation_instrument\.csv$", re.IGNORECASE),
    ignored_re=re.compile(r"^hei-chole\d+_annotation_instrument_detailed\.csv$", re.IGNORECASE),
    video_name="Hei-Chole<N>.mp4", annotation_name="Hei-Chole<N>_Annotation_Instrument.csv",
    video_file=lambda number: f"Hei-Chole{number}.mp4",
    annotation_file=lambda number: f"Hei-Chole{number}_Annotation_Instrument.csv",
    stray_suffixes=(".mp4", ".csv", ".avi", ".mkv"), problem_kinds=PROBLEM_KINDS, dataset=HeiCholeDataset,
)


def load_heichole(
    root: Path | str,
    *,
    cache: FrameCache | None = None,
    numbers: Iterable[int] | None = None,
    centres: Mapping[int, str] | None = None,
    hd: bool = False,
    thresholds: BorderThresholds = BorderThresholds(),
    tolerance_s: int = TOLERANCE_S,
    strict: bool = True,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> HeiCholeDataset:
    """Load a HeiChole copy at `root` (see the module docstring).

    centres: video number -> centre name (default ``HEICHOLE_CENTRES``: 1-12 Heidelberg,
        13-24 Salem). hd: read ``Videos/Full/HD/`` instead of the SD copies.
    The other arguments are those of ``load_cholec80``. Raises SurgicalLayoutError naming
    the path if `root` is not a HeiChole copy.
    """
    root = check_root(LAYOUT, root, tolerance_s)
    read = partial(read_video, centres=dict(HEICHOLE_CENTRES if centres is None else centres),
                   thresholds=thresholds, tolerance_s=tolerance_s)
    return load(LAYOUT, root, partial(_folders, hd=hd), read, cache=cache, numbers=numbers, thresholds=thresholds,
                strict=strict, workers=workers, progress=progress)

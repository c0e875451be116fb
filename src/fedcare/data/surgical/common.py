"""What the Cholec80 and HeiChole loaders share: the thesis's 6-tool label space, the video
record, problems and errors, and the two frame measurements (black side borders, white
censored frames). The study should import from ``fedcare.data.surgical.clients``, which re-exports
everything here.

Black borders
-------------
A column of a frame is *black* when at least ``dark_share`` (95%) of its pixels have every
channel <= ``black_level`` (20 of 255). A frame's border width is the number of black columns
running in from the left edge or from the right edge, whichever is smaller (letterboxing is
symmetric; the smaller side keeps a dark instrument or a dark corner at one edge from
inflating it). Frames that are black over at least half their width (camera covered, fade to
black) have no border width and are left out. A video's border is the MOST FREQUENT width
over its sampled frames (ties go to the smaller width), given in pixels of the cached frame
and as a fraction of its width, so the classes do not depend on the cache resolution.

Classes, per side, as a fraction of the frame width (``BorderThresholds``):

* ``large``: >= 0.09. A 4:3 endoscope picture pillarboxed in a 16:9 frame leaves 12.5% per
  side, the typical large border of Cholec80;
* ``intermediate``: >= 0.025 (6 px of 240);
* ``none``: below that ("none or small" in the thesis). A few dark columns are common at any
  edge (resizing, the optics' vignette), so very small borders count as none.

The thesis gives no numbers: it classifies visually into "none or small", "intermediate"
and "large" from the mean images (Fig. 5.3). These defaults are our choice; both are
arguments of every function that classifies, and of the CLI.

White frames
------------
HeiChole replaces frames showing the outside of the patient by white frames ("censored");
the thesis discards them. A frame is white when at least ``white_share`` (90%) of its pixels
have every channel >= ``white_level`` (230). 90% rather than 100% lets an overlay (the info
bar of one centre, compression noise) stay in a censored frame.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedcare.data.common import DataError

__all__ = [
    "BORDER_CLASSES",
    "TOOLS",
    "BorderThresholds",
    "SurgicalAnnotationError",
    "SurgicalLayoutError",
    "SurgicalProblem",
    "SurgicalVideo",
    "border_widths",
    "classify_border",
    "modal_border",
    "white_frames",
]

# The thesis's 6-tool label space (Markert §5.1, HeiChole's names), in this order everywhere.
TOOLS: tuple[str, ...] = ("Grasper", "Clipper", "Coagulation Instrument", "Scissors", "Suction-Irrigation",
                          "Specimen Bag")
BORDER_CLASSES: tuple[str, ...] = ("large", "intermediate", "none")

BLACK_LEVEL = 20
DARK_SHARE = 0.95
WHITE_LEVEL = 230
WHITE_SHARE = 0.90
_CHUNK = 128


class SurgicalLayoutError(DataError):
    """The path is not a Cholec80 / HeiChole copy (missing, or the expected folders are absent)."""


class SurgicalAnnotationError(DataError):
    """A missing or malformed annotation file, or one that does not match its video; the
    message names the file (and the line)."""


@dataclass(frozen=True)
class SurgicalProblem:
    kind: str  # see cholec80.PROBLEM_KINDS / heichole.PROBLEM_KINDS
    path: Path
    detail: str

    def error(self) -> DataError:
        from fedcare.data.video import VideoDecodeError

        cls = VideoDecodeError if self.kind == "unreadable_video" else SurgicalAnnotationError
        return cls(f"{self.path}: {self.detail}")

    def as_dict(self) -> dict:
        return {"kind": self.kind, "path": str(self.path), "detail": self.detail}


@dataclass(frozen=True)
class BorderThresholds:
    """Border classes as a fraction of the frame width on each side (see the module docstring)."""

    intermediate: float = 0.025
    large: float = 0.09

    def __post_init__(self) -> None:
        if not 0.0 < self.intermediate < self.large < 0.5:
            raise ValueError(f"border thresholds must satisfy 0 < intermediate < large < 0.5, got "
                             f"intermediate={self.intermediate}, large={self.large}")


@dataclass(eq=False)
class SurgicalVideo:
    """One annotated video at 1 fps.

    ``seconds[k]`` is the position in the video's cached 1-fps frame array (= its second) of
    the k-th usable frame, ``labels[k]`` its 6 tool labels (uint8 0/1, in ``TOOLS`` order).
    Frames without an annotation row and (HeiChole) white frames are not in ``seconds``.
    """

    dataset: str  # "cholec80" or "heichole"
    id: str  # "video01", "Hei-Chole1"
    number: int  # 1, 1
    path: Path  # the video file
    annotation: Path  # its tool annotation file
    centre: str  # "Strasbourg", "Heidelberg", "Salem", ... ("unknown" if not known)
    border: str  # one of BORDER_CLASSES
    border_px: int  # most frequent border width in pixels of the cached frame
    border_fraction: float  # border_px / cached frame width
    native_fps: float
    frame_count: int  # decoded frames of the video (native rate)
    sampled: int  # frames in the 1-fps cache entry
    seconds: np.ndarray = field(repr=False)  # (n,) int64
    labels: np.ndarray = field(repr=False)  # (n, 6) uint8
    white_dropped: int = 0  # white (censored) frames left out
    unlabelled: int = 0  # sampled frames beyond the last annotation row

    @property
    def frames_count(self) -> int:
        return len(self.seconds)

    def frames(self, cache) -> np.ndarray:
        """(n, H, W, 3) uint8 RGB frames matching ``labels``, read from `cache` (a FrameCache
        with the settings this video was loaded with; it decodes the video if needed)."""
        return np.asarray(cache.frames(self.path)[self.seconds])

    def summary(self) -> dict:
        return {
            "id": self.id, "dataset": self.dataset, "path": str(self.path), "annotation": str(self.annotation),
            "centre": self.centre, "border": self.border, "border_px": self.border_px,
            "border_fraction": round(self.border_fraction, 4), "native_fps": self.native_fps,
            "video_frames": self.frame_count, "sampled_frames": self.sampled, "frames": self.frames_count,
            "white_dropped": self.white_dropped, "unlabelled": self.unlabelled,
            "tool_frames": {t: int(n) for t, n in zip(TOOLS, self.labels.sum(axis=0, dtype=np.int64))},
        }


# --------------------------------------------------------------------------- measurements


def border_widths(frames: np.ndarray, *, black_level: int = BLACK_LEVEL, dark_share: float = DARK_SHARE) -> np.ndarray:
    """Per frame, the width in pixels of the black left/right border (the smaller side; see
    the module docstring); -1 for frames black over at least half their width. `frames` is
    (n, H, W, 3) uint8 (a memory map is read in chunks)."""
    n, _, w = frames.shape[:3]
    out = np.empty(n, np.int64)
    for start in range(0, n, _CHUNK):
        chunk = np.asarray(frames[start:start + _CHUNK])
        dark = chunk.max(axis=3) <= black_level  # (c, H, W)
        black = dark.mean(axis=1) >= dark_share  # (c, W)
        all_black = black.all(axis=1)
        left = np.where(all_black, w, np.argmax(~black, axis=1))
        right = np.where(all_black, w, np.argmax(~black[:, ::-1], axis=1))
        width = np.minimum(left, right)
        out[start:start + len(chunk)] = np.where(width * 2 >= w, -1, width)
    return out


def modal_border(widths: np.ndarray) -> int:
    """The most frequent width (ties: the smaller), ignoring -1; 0 when no frame counts."""
    valid = widths[widths >= 0]
    if valid.size == 0:
        return 0
    return int(np.argmax(np.bincount(valid)))


def classify_border(fraction: float, thresholds: BorderThresholds = BorderThresholds()) -> str:
    if fraction >= thresholds.large:
        return "large"
    if fraction >= thresholds.intermediate:
        return "intermediate"
    return "none"


def white_frames(frames: np.ndarray, *, white_level: int = WHITE_LEVEL, white_share: float = WHITE_SHARE) -> np.ndarray:
    """(n,) bool: the white (censored) frames of (n, H, W, 3) uint8 `frames`."""
    n = frames.shape[0]
    out = np.empty(n, bool)
    for start in range(0, n, _CHUNK):
        chunk = np.asarray(frames[start:start + _CHUNK])
        out[start:start + len(chunk)] = (chunk.min(axis=3) >= white_level).mean(axis=(1, 2)) >= white_share
    return out


# --------------------------------------------------------------------------- folder helpers


def find_child(parent: Path, name: str) -> Path | None:
    """``parent/name`` matched case-insensitively (exact case preferred)."""
    exact = parent / name
    if exact.is_dir():
        return exact
    try:
        for entry in sorted(parent.iterdir()):
            if entry.name.lower() == name.lower() and entry.is_dir():
                return entry
    except OSError:
        return None
    return None


def is_junk(name: str) -> bool:
    return name.startswith(".") or name.lower() in {"thumbs.db", "desktop.ini", "__macosx"}


# --------------------------------------------------------------------------- loading videos


# a video the annotations list but the copy lacks (deleted, or a link to a device) would drop its frames
# silently from a client: an error in a run, like every file the layout lists and the loader cannot use
FATAL_KINDS = frozenset({"missing_annotation", "malformed_annotation", "unreadable_video", "frame_count_mismatch",
                         "annotation_without_video"})


class VideoProblem(Exception):
    """Raised inside a per-video task: becomes a SurgicalProblem of the loader."""

    def __init__(self, kind: str, path: Path, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.problem = SurgicalProblem(kind, Path(path), detail)


def run_tasks(items: list, task, *, workers: int | None, progress) -> list:
    """Run ``task(item)`` for every item (threads: OpenCV and numpy release the GIL), in
    item order. Returns a list of (result or None, SurgicalProblem or None)."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from fedcare.data.video import VideoDecodeError

    def guarded(item):
        try:
            return task(item), None
        except VideoProblem as e:
            return None, e.problem
        except VideoDecodeError as e:
            path = getattr(item, "video", None) or Path(str(e).split(": ", 1)[0])
            detail = str(e)
            prefix = f"{path}: "
            return None, SurgicalProblem("unreadable_video", Path(path), detail.removeprefix(prefix))

    total = len(items)
    if progress:
        progress(0, total)
    n_workers = max(1, min(workers if workers is not None else min(4, os.cpu_count() or 1), total or 1))
    results = []
    if n_workers == 1:
        for i, item in enumerate(items, start=1):
            results.append(guarded(item))
            if progress:
                progress(i, total)
        return results
    with ThreadPoolExecutor(max_workers=n_workers, thread_name_prefix="fedcare-video") as pool:
        for i, result in enumerate(pool.map(guarded, items), start=1):
            results.append(result)
            if progress:
                progress(i, total)
    return results


def raise_if_fatal(problems: list[SurgicalProblem], command: str) -> None:
    fatal = [p for p in problems if p.kind in FATAL_KINDS]
    if not fatal:
        return
    error = fatal[0].error()
    if len(fatal) > 1:
        error = type(error)(f"{error} (and {len(fatal) - 1} more problems; `{command}` lists them all)")
    raise error


def measure_border(frames: np.ndarray, thresholds: BorderThresholds,
                   exclude: np.ndarray | None = None) -> tuple[int, float, str]:
    """(modal width in px, as a fraction of the width, class); `exclude` masks frames out
    (HeiChole's white frames, which have no border)."""
    widths = border_widths(frames)
    if exclude is not None:
        widths = np.where(exclude, -1, widths)
    px = modal_border(widths)
    fraction = px / frames.shape[2] if frames.shape[0] else 0.0
    return px, fraction, classify_border(fraction, thresholds)

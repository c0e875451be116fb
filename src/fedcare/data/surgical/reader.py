"""The one scanner and loader of both surgical layouts (Cholec80 and HeiChole): pair each video
with its annotation file, record what is stray, missing or duplicated, then read the videos in
parallel (each decoded once into the frame cache) and collect every problem.

A layout (``cholec80.LAYOUT``, ``heichole.LAYOUT``) says what differs: its file names, where
its two folders are, its problem kinds, and how one video and its annotation become a
``SurgicalVideo`` (``cholec80.read_video``, ``heichole.read_video``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedcare.data.common import SYNTHETIC_MARKER
from fedcare.data.surgical.common import (
    BorderThresholds,
    SurgicalAnnotationError,
    SurgicalLayoutError,
    SurgicalProblem,
    SurgicalVideo,
    VideoProblem,
    is_junk,
    raise_if_fatal,
    run_tasks,
)
from fedcare.data.video import FrameCache


@dataclass
class SurgicalDataset:
    """A loaded copy of either layout."""

    root: Path
    videos: list[SurgicalVideo]  # the videos that loaded, by number
    problems: list[SurgicalProblem]
    synthetic: bool  # <root>/fedcare-synthetic.json exists
    thresholds: BorderThresholds


@dataclass(frozen=True)
class Item:
    """A video file and its annotation file (None when missing) found by the scan."""

    number: int
    video: Path
    annotation: Path | None
    expected_annotation: Path


@dataclass(frozen=True)
class Layout:
    """What tells a layout apart (see the module docstring)."""

    name: str  # "cholec80": also the `fedcare data summary` command of this layout
    hint: str  # "expected the ... layout: ..." (in every layout error)
    video_re: re.Pattern  # a video file name; group 1 is the video number
    annotation_re: re.Pattern  # an annotation file name; group 1 is the video number
    ignored_re: re.Pattern  # files of the layout that are not used
    video_name: str  # "videoNN.mp4": a video's file name in messages
    annotation_name: str  # "videoNN-tool.txt"
    video_file: Callable[[int], str]  # number -> the file name a video should have
    annotation_file: Callable[[int], str]  # number -> the file name an annotation should have
    stray_suffixes: tuple[str, ...]  # other files with these suffixes are reported as stray
    problem_kinds: dict[str, str]  # kind -> what it means, in report order
    dataset: type[SurgicalDataset]


def scan(layout: Layout, videos_dir: Path, annotations_dir: Path,
         numbers: set[int] | None) -> tuple[list[Item], list[SurgicalProblem]]:
    """Pair the videos of `videos_dir` with the annotations of `annotations_dir` by number
    (only `numbers` when given); duplicates and unexpected files are problems."""
    problems: list[SurgicalProblem] = []
    videos: dict[int, Path] = {}
    annotations: dict[int, Path] = {}
    for folder, pattern, found, what in ((videos_dir, layout.video_re, videos, layout.video_name),
                                         (annotations_dir, layout.annotation_re, annotations, layout.annotation_name)):
        for entry in sorted(folder.iterdir()):
            if is_junk(entry.name) or layout.ignored_re.match(entry.name) or entry.is_dir():
                continue
            match = pattern.match(entry.name)
            if match and entry.is_file():
                number = int(match.group(1))
                if number in found:
                    problems.append(SurgicalProblem("stray_file", entry, f"duplicate video number {number} "
                                                    f"(already {found[number].name}); ignored"))
                else:
                    found[number] = entry
            elif entry.suffix.lower() in layout.stray_suffixes:
                problems.append(SurgicalProblem("stray_file", entry, f"unexpected file in {folder.name}/ (expected {what})"))
    if not videos:
        raise SurgicalLayoutError(f"{videos_dir}: no {layout.video_name} files ({layout.hint})")
    items = [Item(number, videos[number], annotations.get(number), annotations_dir / layout.annotation_file(number))
             for number in sorted(videos) if numbers is None or number in numbers]
    for number in sorted(set(annotations) - set(videos)):
        if numbers is None or number in numbers:
            problems.append(SurgicalProblem("annotation_without_video", annotations[number],
                                            f"no video (expected {videos_dir / layout.video_file(number)})"))
    return items, problems


def read_annotation(item: Item, read: Callable[[Path], np.ndarray], what: str) -> np.ndarray:
    """A video's annotation read with `read`; a missing or malformed one is the video's problem."""
    if item.annotation is None:
        raise VideoProblem("missing_annotation", item.video, f"no {what} file (expected {item.expected_annotation})")
    try:
        return read(item.annotation)
    except SurgicalAnnotationError as e:
        raise VideoProblem("malformed_annotation", item.annotation, str(e).split(": ", 1)[1]) from None


def check_root(layout: Layout, root: Path | str, tolerance_s: int) -> Path:
    """`root` as a Path; a layout error naming it if it is not a folder."""
    root = Path(root)
    if not root.exists():
        raise SurgicalLayoutError(f"{root}: no such file or directory ({layout.hint})")
    if not root.is_dir():
        raise SurgicalLayoutError(f"{root}: not a directory ({layout.hint})")
    if isinstance(tolerance_s, bool) or not isinstance(tolerance_s, int) or tolerance_s < 0:
        raise ValueError(f"tolerance_s must be a non-negative whole number, got {tolerance_s!r}")
    return root


def load(
    layout: Layout,
    root: Path,
    folders: Callable[[Path], tuple[Path, Path]],
    read_video: Callable[[Item, FrameCache], SurgicalVideo],
    *,
    cache: FrameCache | None,
    numbers: Iterable[int] | None,
    thresholds: BorderThresholds,
    strict: bool,
    workers: int | None,
    progress: Callable[[int, int], None] | None,
) -> SurgicalDataset:
    """Scan the copy at `root` (checked by ``check_root``; `folders` finds its video and
    annotation folders or raises a layout error), read every video with `read_video` in
    parallel, and sort the problems by kind; with `strict`, raise the first fatal one."""
    cache = cache if cache is not None else FrameCache()
    wanted = None if numbers is None else {int(n) for n in numbers}
    items, problems = scan(layout, *folders(root), wanted)
    results = run_tasks(items, lambda item: read_video(item, cache), workers=workers, progress=progress)
    videos = [video for video, _ in results if video is not None]
    problems = sorted(problems + [p for _, p in results if p is not None],
                      key=lambda p: (list(layout.problem_kinds).index(p.kind), str(p.path)))
    if strict:
        raise_if_fatal(problems, f"fedcare data summary {layout.name} {root}")
    return layout.dataset(root=root, videos=videos, problems=problems,
                          synthetic=(root / SYNTHETIC_MARKER).is_file(), thresholds=thresholds)

"""The five clients of the Markert thesis (surgical tool presence), built from a Cholec80 copy
and a HeiChole copy: the one entry point of the data layer for the surgical study.

    from fedcare.data.surgical.clients import TOOLS, FrameCache, normalize, thesis_clients

    clients = thesis_clients("data/cholec80", "data/heichole", cache=FrameCache(), seed=0)
    for name in clients.names:                             # HEI1 HEI2 CHO1 CHO2 CHO3
        x, y = clients.arrays(name, "train")               # (N,135,240,3) uint8 RGB, (N,6) uint8
    clients.prevalence()                                   # {client: {split: {tool: share}}}
    batch = normalize(x[:16])                              # float32 (16,3,135,240), ImageNet-normalized

Clients (thesis §5.1.1, ``CLIENTS``):

| client | source | videos | train / test |
|---|---|---|---|
| HEI1 | HeiChole, Heidelberg University Hospital | centre | 3 random test videos (seeded), rest train |
| HEI2 | HeiChole, Salem Hospital | centre | as HEI1 |
| CHO1 | Cholec80, large black side border | most frequent border width | Cholec80 split (default ``"thesis"``: 1-60 train, 61-80 test) |
| CHO2 | Cholec80, intermediate border | | as CHO1 |
| CHO3 | Cholec80, none or small border | | as CHO1 |

What is returned is plain data: ``SurgicalClients.videos[client][split]`` is a list of
``SurgicalVideo`` (path, id, centre, border class, ``seconds`` and ``labels`` (n, 6) uint8).
Frames stay uint8 on disk (the FrameCache) and in memory; ``normalize`` turns a batch into
ImageNet-normalized float32 for the model (``IMAGENET_MEAN``/``IMAGENET_STD``).

The HeiChole test draw is ``heichole.test_videos``: 3 of a centre's videos, from
``np.random.default_rng([seed, centre stream])``, independent of the other centre. With the
Cholec80 splits that have a validation part (``"32/8/40"``, ``"40/8/32"``) the Cholec80
clients also get a ``"val"`` list; the thesis itself has none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedcare.data.surgical.cholec80 import SPLITS, Cholec80Dataset, load_cholec80, split_of
from fedcare.data.surgical.heichole import HeiCholeDataset, load_heichole, test_videos
from fedcare.data.surgical.common import (
    BORDER_CLASSES,
    TOOLS,
    BorderThresholds,
    SurgicalAnnotationError,
    SurgicalLayoutError,
    SurgicalProblem,
    SurgicalVideo,
    border_widths,
    classify_border,
    modal_border,
    white_frames,
)
from fedcare.data.video import (
    CacheStats,
    FrameCache,
    VideoDecodeError,
    default_cache_dir,
)
from fedcare.errors import InputError

__all__ = [
    "BORDER_CLASSES",
    "CLIENTS",
    "CLIENT_SOURCES",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "TOOLS",
    "BorderThresholds",
    "CacheStats",
    "FrameCache",
    "SurgicalAnnotationError",
    "SurgicalClients",
    "SurgicalLayoutError",
    "SurgicalProblem",
    "SurgicalVideo",
    "VideoDecodeError",
    "border_widths",
    "classify_border",
    "default_cache_dir",
    "modal_border",
    "normalize",
    "positive_weights",
    "prevalence",
    "summarize",
    "thesis_clients",
    "white_frames",
]

CLIENTS: tuple[str, ...] = ("HEI1", "HEI2", "CHO1", "CHO2", "CHO3")
# client -> (dataset, centre for HeiChole / border class for Cholec80)
CLIENT_SOURCES: dict[str, tuple[str, str]] = {
    "HEI1": ("heichole", "Heidelberg"),
    "HEI2": ("heichole", "Salem"),
    "CHO1": ("cholec80", "large"),
    "CHO2": ("cholec80", "intermediate"),
    "CHO3": ("cholec80", "none"),
}
IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)
HEICHOLE_TEST_VIDEOS = 3


def prevalence(labels: np.ndarray) -> dict[str, float]:
    """Share of frames showing each tool, {tool: fraction}; 0.0 for no frames."""
    labels = np.asarray(labels)
    if labels.shape[0] == 0:
        return {t: 0.0 for t in TOOLS}
    return {t: float(v) for t, v in zip(TOOLS, labels.mean(axis=0))}


def positive_weights(labels: np.ndarray) -> np.ndarray:
    """The thesis's BCE positive weights p_j = negatives / positives of tool j (float64, (6,)).
    A tool without positives gets 1.0 (its positive term never occurs)."""
    labels = np.asarray(labels)
    pos = labels.sum(axis=0, dtype=np.float64)
    neg = labels.shape[0] - pos
    return np.where(pos > 0, neg / np.maximum(pos, 1.0), 1.0)


def normalize(frames) -> torch.Tensor:  # noqa: F821 - torch is imported lazily
    """uint8 RGB frames (n, H, W, 3) (numpy or torch) -> float32 (n, 3, H, W) in ImageNet
    normalization: (x / 255 - mean) / std. A single frame (H, W, 3) gives (3, H, W)."""
    import torch

    x = torch.as_tensor(np.asarray(frames) if not isinstance(frames, torch.Tensor) else frames)
    if x.dtype != torch.uint8:
        raise ValueError(f"expected uint8 frames, got {x.dtype}")
    single = x.ndim == 3
    if single:
        x = x.unsqueeze(0)
    if x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"expected frames shaped (n, H, W, 3), got {tuple(x.shape)}")
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    out = (x.permute(0, 3, 1, 2).float().div_(255.0) - mean) / std
    return out[0] if single else out


@dataclass
class SurgicalClients:
    """The five clients: ``videos[client][split]`` lists of ``SurgicalVideo``."""

    videos: dict[str, dict[str, list[SurgicalVideo]]]
    cache: FrameCache
    seed: int
    cholec80_split: str
    synthetic: bool  # any of the copies is a fedcare synthetic copy
    heichole_test: int = HEICHOLE_TEST_VIDEOS  # test videos drawn per HeiChole centre
    # videos that loaded but belong to no client (unknown HeiChole centre, Cholec80 number
    # outside the split)
    unassigned: list[SurgicalVideo] = field(default_factory=list)
    problems: list[SurgicalProblem] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [c for c in CLIENTS if c in self.videos]

    def splits(self, client: str) -> list[str]:
        return list(self.videos[client])

    def labels(self, client: str, split: str) -> np.ndarray:
        """(N, 6) uint8 labels of a client's split, videos in order."""
        parts = [v.labels for v in self.videos[client][split]]
        return np.concatenate(parts) if parts else np.zeros((0, len(TOOLS)), np.uint8)

    def frames(self, video: SurgicalVideo) -> np.ndarray:
        """(n, H, W, 3) uint8 RGB frames of one video, matching ``video.labels``."""
        return video.frames(self.cache)

    def arrays(self, client: str, split: str) -> tuple[np.ndarray, np.ndarray]:
        """(frames (N, H, W, 3) uint8 RGB, labels (N, 6) uint8) of a client's split, in memory."""
        videos = self.videos[client][split]
        if not videos:
            w, h = self.cache.size or (0, 0)
            return np.zeros((0, h, w, 3), np.uint8), self.labels(client, split)
        return np.concatenate([self.frames(v) for v in videos]), self.labels(client, split)

    def counts(self) -> dict[str, dict[str, int]]:
        """Frames per client and split."""
        return {c: {s: int(sum(v.frames_count for v in vids)) for s, vids in splits.items()}
                for c, splits in self.videos.items()}

    def prevalence(self) -> dict[str, dict[str, dict[str, float]]]:
        """{client: {split: {tool: share of frames}}}."""
        return {c: {s: prevalence(self.labels(c, s)) for s in splits} for c, splits in self.videos.items()}

    def summary(self) -> dict:
        """JSON-ready: per client and split the videos, frame counts and tool prevalence."""
        return {
            "seed": self.seed,
            "heichole_test": self.heichole_test,
            "cholec80_split": self.cholec80_split,
            "synthetic": self.synthetic,
            "tools": list(TOOLS),
            "clients": {
                c: {s: {"videos": [v.id for v in vids], "frames": int(sum(v.frames_count for v in vids)),
                        "prevalence": prevalence(self.labels(c, s))} for s, vids in splits.items()}
                for c, splits in self.videos.items()
            },
            "unassigned": [v.id for v in self.unassigned],
            "problems": [p.as_dict() for p in self.problems],
        }


def _heichole_clients(hds: HeiCholeDataset, seed: int, heichole_test: int) -> dict[str, dict[str, list[SurgicalVideo]]]:
    """HEI1 and HEI2 (a centre each; none for a centre without videos), `heichole_test` test
    videos each drawn with `seed`."""
    videos = {}
    for client in ("HEI1", "HEI2"):
        centre = CLIENT_SOURCES[client][1]
        own = hds.by_centre(centre)
        if not own:
            continue  # no video of this centre: no client
        if len(own) <= heichole_test:
            raise SurgicalLayoutError(
                f"{hds.root}: {centre} ({client}) has {len(own)} videos; {heichole_test} test videos and at "
                f"least one training video are needed")
        test = set(test_videos([v.number for v in own], centre, n_test=heichole_test, seed=seed))
        videos[client] = {"train": [v for v in own if v.number not in test],
                          "test": [v for v in own if v.number in test]}
    return videos


def _cholec80_clients(cds: Cholec80Dataset, split: str) -> dict[str, dict[str, list[SurgicalVideo]]]:
    """CHO1, CHO2 and CHO3 (a border class each), split by video number."""
    return {client: {p: [v for v in cds.by_border(CLIENT_SOURCES[client][1]) if split_of(v.number, split) == p]
                     for p in SPLITS[split]}
            for client in ("CHO1", "CHO2", "CHO3")}


def thesis_clients(
    cholec80: Path | str | Cholec80Dataset | None,
    heichole: Path | str | HeiCholeDataset | None,
    *,
    cache: FrameCache | None = None,
    seed: int = 0,
    heichole_test: int = HEICHOLE_TEST_VIDEOS,
    cholec80_split: str = "thesis",
    thresholds: BorderThresholds = BorderThresholds(),
    centres: Mapping[int, str] | None = None,
    strict: bool = True,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SurgicalClients:
    """Build the thesis's five clients (see the module docstring).

    cholec80, heichole: the copies' roots (or datasets already loaded with the same cache);
        either may be None, which leaves out its clients.
    cache: the FrameCache (default ``FrameCache()``: 240x135 at 1 fps in $FEDCARE_CACHE or
        ~/.cache/fedcare/frames); frames are decoded once, on the first call.
    seed: draws the HeiChole test videos (``heichole_test`` per centre).
    cholec80_split: a name in ``cholec80.SPLITS``; thresholds: the border classes.
    centres: HeiChole video number -> centre (default ``heichole.HEICHOLE_CENTRES``).
    strict, workers, progress: as in the loaders (progress counts the videos of both).
    """
    if cholec80 is None and heichole is None:
        raise InputError("thesis_clients needs a Cholec80 copy, a HeiChole copy or both")
    if cholec80_split not in SPLITS:
        raise InputError(f"unknown Cholec80 split {cholec80_split!r} (known: {', '.join(SPLITS)})")
    cache = cache if cache is not None else FrameCache()
    videos: dict[str, dict[str, list[SurgicalVideo]]] = {}
    unassigned: list[SurgicalVideo] = []
    problems: list[SurgicalProblem] = []
    synthetic = False
    done_before = [0]

    def sub_progress(done: int, total: int) -> None:
        if progress:
            progress(done_before[0] + done, done_before[0] + total)

    if heichole is not None:
        hds = heichole if isinstance(heichole, HeiCholeDataset) else load_heichole(
            heichole, cache=cache, centres=centres, thresholds=thresholds, strict=strict, workers=workers,
            progress=sub_progress)
        done_before[0] += len(hds.videos)
        synthetic |= hds.synthetic
        problems += hds.problems
        videos.update(_heichole_clients(hds, seed, heichole_test))
        unassigned += [v for v in hds.videos if v.centre not in ("Heidelberg", "Salem")]
    if cholec80 is not None:
        cds = cholec80 if isinstance(cholec80, Cholec80Dataset) else load_cholec80(
            cholec80, cache=cache, thresholds=thresholds, strict=strict, workers=workers, progress=sub_progress)
        synthetic |= cds.synthetic
        problems += cds.problems
        videos.update(_cholec80_clients(cds, cholec80_split))
        unassigned += [v for v in cds.videos if split_of(v.number, cholec80_split) is None]
    ordered = {c: videos[c] for c in CLIENTS if c in videos}
    return SurgicalClients(videos=ordered, cache=cache, seed=seed, cholec80_split=cholec80_split,
                           synthetic=synthetic, heichole_test=heichole_test, unassigned=unassigned, problems=problems)


def summarize(dataset: Cholec80Dataset | HeiCholeDataset, clients: SurgicalClients) -> dict:
    """JSON-ready overview of a loaded copy: videos (client, split, fps, frames, border,
    white frames), frames at 1 fps, border classes, tool prevalence per client and split,
    cache statistics and every problem (what ``fedcare data summary cholec80|heichole`` prints)."""
    name = "cholec80" if isinstance(dataset, Cholec80Dataset) else "heichole"
    where: dict[str, tuple[str, str]] = {}
    for client, splits in clients.videos.items():
        for split, vids in splits.items():
            for v in vids:
                where[v.id] = (client, split)
    per_video = []
    for v in dataset.videos:
        client, split = where.get(v.id, (None, None))
        per_video.append({**v.summary(), "client": client, "split": split})
    kinds = {p.kind for p in dataset.problems}
    counts = {k: sum(p.kind == k for p in dataset.problems) for k in sorted(kinds)}
    borders = {b: sum(v.border == b for v in dataset.videos) for b in BORDER_CLASSES}
    return {
        "dataset": name,
        "root": str(dataset.root),
        "synthetic": dataset.synthetic,
        "videos": len(dataset.videos),
        "frames": int(sum(v.frames_count for v in dataset.videos)),
        "white_frames_dropped": int(sum(v.white_dropped for v in dataset.videos)),
        "border_thresholds": {"intermediate": dataset.thresholds.intermediate, "large": dataset.thresholds.large},
        "border_classes": borders,
        "tools": list(TOOLS),
        "split": clients.cholec80_split if name == "cholec80" else {"seed": clients.seed,
                                                                    "test_videos_per_centre": clients.heichole_test},
        "clients": clients.summary()["clients"],
        "per_video": per_video,
        "cache": clients.cache.stats().as_dict(),
        "problem_counts": counts,
        "problems": [p.as_dict() for p in dataset.problems],
    }

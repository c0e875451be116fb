"""The surgical study's data: the thesis's five clients (`fedcare.data.surgical.clients.thesis_clients`)
as sites, each holding one institution's frames by reference (`Split("train")`, `Split("test")`).

Where the videos are
--------------------
In this process: `data.root` holds `cholec80/` (a Cholec80 copy) and `heichole/` (a HeiChole
copy), or `data.cholec80` / `data.heichole` name the copies, or `[data.synthetic]` generates
both into the run directory (`synthetic-data/cholec80`, `synthetic-data/heichole`; a resumed
run finds them there and does not generate again).

At a site (Flower): the site holds one client, named by `[deployment.sites]` (site name ->
HEI1 .. CHO3) or by its own name when that is a client's name. Its data directory holds its
own copy: `heichole/` for HEI1 and HEI2, `cholec80/` for CHO1, CHO2 and CHO3 (the site may
also hold only its own videos: a Cholec80 client takes the videos of its border class, a
HeiChole client those of its centre, and the HeiChole test draw depends on the centre's
video numbers alone). So a site reads exactly what the in-process run reads for that client.

Frames
------
Frames are decoded once into the frame cache (`data.cache`, default `$FEDCARE_CACHE` or
~/.cache/fedcare/frames; for synthetic data in this process `<run>/frame-cache`), resized to
`data.frame_size`, and read from its memory-mapped files on demand: a `FrameStack` is a
client's frames as a lazy (N, 3, H, W) uint8 array, so the whole Cholec80 (about 18 GB at
240x135) never has to fit in memory. Labels are (N, 6) float32 in thesis tool order.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from fedcare.algorithms.training import ClientData
from fedcare.data.common import DataError
from fedcare.data.surgical.clients import CLIENT_SOURCES, TOOLS, FrameCache, SurgicalClients, SurgicalVideo, default_cache_dir, thesis_clients
from fedcare.runtime.refs import DataRef, Split
from fedcare.studies.rundir import SYNTHETIC_DIR, Progress
from fedcare.studies.surgical.config import SurgicalExperiment

SPLITS = ("train", "test")
FRAME_CACHE_DIR = "frame-cache"  # synthetic data in this process: the frame cache inside the run directory


class FrameStack:
    """A client's frames, video after video, as a lazy (N, 3, H, W) uint8 array: indexing with
    integers, a slice or an index tensor returns a uint8 tensor read from the frame cache's
    memory maps. `torch.cat` of stacks is a stack (pooled data for CENT)."""

    def __init__(self, parts: Sequence[tuple[np.ndarray, np.ndarray]], size: tuple[int, int]):
        # parts: (memory-mapped frames of one video (n, H, W, 3), which of them, in order)
        self.parts = [(frames, np.asarray(index, dtype=np.int64)) for frames, index in parts]
        self.offsets = np.cumsum([0] + [len(i) for _, i in self.parts])
        self.size = tuple(size)  # (width, height)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self), 3, self.size[1], self.size[0])

    dtype = torch.uint8

    def __getitem__(self, key) -> torch.Tensor:
        n = len(self)
        if isinstance(key, slice):
            index = np.arange(n)[key]
        elif isinstance(key, torch.Tensor):
            index = key.numpy().astype(np.int64).reshape(-1)
        else:
            index = np.asarray(key, dtype=np.int64).reshape(-1)
        index = np.where(index < 0, index + n, index)
        if index.size and (index.min() < 0 or index.max() >= n):
            raise IndexError(f"frame index out of range for {n} frames")
        out = np.empty((len(index), self.size[1], self.size[0], 3), dtype=np.uint8)
        part = np.searchsorted(self.offsets, index, side="right") - 1
        for p in np.unique(part):
            rows = np.nonzero(part == p)[0]
            frames, which = self.parts[p]
            out[rows] = frames[which[index[rows] - self.offsets[p]]]
        return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.cat and not kwargs and all(isinstance(p, FrameStack) for p in args[0]):
            stacks = list(args[0])
            sizes = {s.size for s in stacks}
            if len(sizes) > 1:
                raise ValueError(f"frames of different sizes cannot be pooled: {sorted(sizes)}")
            return FrameStack([part for s in stacks for part in s.parts], stacks[0].size)
        return NotImplemented


TRAIN, TEST = Split("train"), Split("test")  # a client's frames of its training and test videos


class SurgicalSite:
    """One client (HEI1 .. CHO3): its training and test frames (`Split("train")`, `Split("test")`) and labels."""

    data_refs: ClassVar[tuple[type[DataRef], ...]] = (Split,)

    def __init__(self, client: str, sets: dict[str, ClientData], synthetic: bool, videos: dict[str, list[str]]):
        self.client = client
        self.sets = sets
        self.synthetic = synthetic
        self.videos = videos

    def summary(self) -> dict:
        """Frames per split (the protocol weights clients by their training frames)."""
        return {split: len(self.sets[split]) for split in SPLITS}

    def inventory(self) -> dict:
        """Exact counts for the preflight (`fedcare.runtime.preflight`, which suppresses the
        small ones before they leave the site): frames, videos and frames per tool per split."""
        splits = {}
        for split in SPLITS:
            y = self.sets[split].y
            per_tool = y.sum(dim=0).long().tolist() if len(y) else [0] * len(TOOLS)
            splits[split] = {"examples": len(y), "videos": len(self.videos[split]),
                             "labels": dict(zip(TOOLS, per_tool))}
        return {"unit": "frames", "splits": splits}

    def data(self, ref: DataRef) -> ClientData:
        if not isinstance(ref, Split) or ref.name not in self.sets:
            raise ValueError(f"unknown surgical data reference {ref!r} (a Split, one of {', '.join(SPLITS)})")
        return self.sets[ref.name]


def client_data(clients: SurgicalClients, client: str, split: str) -> ClientData:
    videos: list[SurgicalVideo] = clients.videos[client].get(split, [])
    size = clients.cache.size
    stack = FrameStack([(clients.cache.frames(v.path), v.seconds) for v in videos], size)
    return ClientData(stack, torch.from_numpy(clients.labels(client, split).astype(np.float32)))


def site_of(clients: SurgicalClients, client: str) -> SurgicalSite:
    sets = {split: client_data(clients, client, split) for split in SPLITS}
    videos = {split: [v.id for v in clients.videos[client].get(split, [])] for split in SPLITS}
    return SurgicalSite(client, sets, clients.synthetic, videos)


# -- reading ---------------------------------------------------------------------------------
def generate(config: SurgicalExperiment, workdir: Path, progress: Progress | None) -> Path:
    """The configured synthetic Cholec80 and HeiChole copies in the run directory (generated
    unless a resumed run has them: the generator writes its folder whole or not at all)."""
    from fedcare.data.surgical.synthetic import generate_surgical

    root = Path(workdir) / SYNTHETIC_DIR
    if not root.is_dir():
        s = config.data.synthetic
        generate_surgical(root, seed=s.seed, videos=s.videos, heichole_videos=s.heichole_videos, seconds=s.seconds,
                          heichole_seconds=s.heichole_seconds, width=s.width, height=s.height,
                          split_seed=config.data.split_seed,
                          progress=(lambda d, t: progress("generating synthetic surgical videos", d, t)) if progress else None)
    return root


def copies(config: SurgicalExperiment, root: Path | None) -> tuple[Path | None, Path | None]:
    """(the Cholec80 copy, the HeiChole copy) the configured clients need (None: not needed)."""
    d = config.data
    need = {CLIENT_SOURCES[c][0] for c in config.clients}
    cholec80 = d.cholec80 or (root / "cholec80" if root is not None else None)
    heichole = d.heichole or (root / "heichole" if root is not None else None)
    return (cholec80 if "cholec80" in need else None), (heichole if "heichole" in need else None)


def check_folder(path: Path | None, what: str, key: str) -> None:
    if path is None:
        raise DataError(f"no {what} copy given for the clients that need it: set data.root (a folder holding "
                        f"{key}/) or data.{key}")
    if not Path(path).is_dir():
        raise DataError(f"{path}: no such folder (the {what} copy; data.root must hold {key}/, or set data.{key})")


def frame_cache(config: SurgicalExperiment, default: Path | None = None) -> FrameCache:
    folder = config.data.cache or default or default_cache_dir()
    return FrameCache(folder, size=tuple(config.data.frame_size))


def read_clients(config: SurgicalExperiment, cholec80: Path | None, heichole: Path | None, cache: FrameCache,
                 progress: Progress | None = None) -> SurgicalClients:
    """The thesis's clients from the copies (either may be None: its clients are left out)."""
    d = config.data
    return thesis_clients(cholec80, heichole, cache=cache, seed=d.split_seed, cholec80_split=d.cholec80_split,
                          progress=(lambda done, total: progress("decoding videos (once, into the frame cache)", done,
                                                                 total)) if progress else None)


def check_clients(clients: SurgicalClients, wanted: Sequence[str], where: str) -> None:
    """Every wanted client exists and has training and test frames."""
    for c in wanted:
        if c not in clients.videos:
            raise DataError(f"{where}: no videos of client {c} ({' / '.join(CLIENT_SOURCES[c])})")
        for split in SPLITS:
            if not clients.videos[c].get(split):
                raise DataError(f"{where}: client {c} has no {split} videos ({' / '.join(CLIENT_SOURCES[c])})")

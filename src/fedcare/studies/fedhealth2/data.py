"""The FedHealth 2 study's data: every client's examples, as a site sees them.

Two ways to make clients (`protocol.split`):

- "dirichlet" (the paper): one pooled dataset (PAMAP2 windows of every subject, or every
  X-ray), z-scored (PAMAP2) over all of it, split per seed by a Dirichlet label split into
  `protocol.clients` clients. Dividing one dataset is a pooled step: this runs in one process.
- "natural": one client per PAMAP2 subject, or per X-ray site folder, each reading only its
  own data and (PAMAP2) z-scoring its own windows: the same at a site on Flower as here.

Every client is a `FedHealth2Site` whose data references are `SeededSplit(name, seed)`: "train"
and "test" (its per-client 50/50 split for that run seed) and "pretrain" (its share of the
training data for FedAP's federated pretraining).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from fedcare.algorithms.base import ClientId
from fedcare.algorithms.training import ClientData
from fedcare.data.common import DataError
from fedcare.data.partition import dirichlet_label_split, train_test_split_per_client
from fedcare.data.pamap2.reader import PAPER_CLASS_NAMES
from fedcare.data.xray.reader import CLASSES, XrayLayoutError, find_class_root, load_xray, read_xray
from fedcare.runtime.refs import DataRef, SeededSplit
from fedcare.seeding import numpy_rng
from fedcare.studies.fedhealth2.config import FedHealth2Experiment
from fedcare.studies.rundir import SYNTHETIC_DIR, Progress

Split = Callable[[int], tuple[np.ndarray, np.ndarray]]  # run seed -> (train indices, test indices)


@dataclass
class Examples:
    x: torch.Tensor  # uint8 images (N, 1, S, S) or float windows (N, 27, T)
    y: torch.Tensor  # int64 class labels
    synthetic: bool
    description: str


SPLITS = ("train", "test", "pretrain")  # a client's `SeededSplit`s


class FedHealth2Site:
    """One client's examples and its split per run seed (a `fedcare.runtime.sites.Site`)."""

    data_refs: ClassVar[tuple[type[DataRef], ...]] = (SeededSplit,)

    def __init__(self, client: ClientId, examples: Examples, split: Split, config: FedHealth2Experiment):
        self.client = client
        self.x, self.y = examples.x, examples.y
        self.synthetic = examples.synthetic
        self.split = split
        self.config = config
        self._cache: dict[str, ClientData] = {}
        self._cache_seed: int | None = None

    def summary(self) -> dict:
        """Training examples per run seed (a client with fewer than 2 sits a seed out)."""
        return {"train": {str(seed): len(self.split(seed)[0]) for seed in self.config.seeds}}

    def inventory(self) -> dict:
        """Exact counts for the preflight (`fedcare.runtime.preflight`, which suppresses the
        small ones before they leave the site): examples per class in the first run seed's
        train and test splits (a label past the known classes is named by its index)."""
        names = class_names(self.config)
        splits = {}
        for name, index in zip(("train", "test"), self.split(self.config.seeds[0])):
            counts = np.bincount(self.y.numpy()[index], minlength=len(names))
            splits[name] = {"examples": len(index),
                            "labels": {names[i] if i < len(names) else f"class {i}": int(n) for i, n in enumerate(counts)}}
        return {"unit": "examples", "splits": splits}

    def data(self, ref: DataRef) -> ClientData:
        if not isinstance(ref, SeededSplit) or ref.name not in SPLITS:
            raise ValueError(f"unknown FedHealth 2 data reference {ref!r} (a SeededSplit, one of {', '.join(SPLITS)})")
        kind, seed = ref.name, ref.seed
        if seed != self._cache_seed:  # keep the current run seed's sets only
            self._cache, self._cache_seed = {}, seed
        if kind not in self._cache:
            train, test = self.split(seed)
            if kind == "train":
                index = train
            elif kind == "test":
                index = test
            else:
                share = numpy_rng(seed, "pretrain-share", self.client).permutation(len(train))
                index = train[np.sort(share[: max(2, int(self.config.protocol.pretrain_fraction * len(train)))])]
            self._cache[kind] = subset(self.x, self.y, index)
        return self._cache[kind]


def class_names(config: FedHealth2Experiment) -> tuple[str, ...]:
    """The classes the model predicts, by name: the four X-ray classes or the paper's ten activities."""
    return tuple(CLASSES) if config.data.dataset == "xray" else PAPER_CLASS_NAMES


def subset(x: torch.Tensor, y: torch.Tensor, idx: np.ndarray) -> ClientData:
    index = torch.from_numpy(np.asarray(idx, dtype=np.int64))
    return ClientData(x[index], y[index])


# -- the two splits ------------------------------------------------------------------------
class DirichletSplits:
    """The paper's split of one pooled dataset, drawn per run seed and kept: client k's
    (train, test) indices into the pooled examples."""

    def __init__(self, y: np.ndarray, config: FedHealth2Experiment):
        self.y, self.config = y, config
        self._by_seed: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}

    def __call__(self, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
        if seed not in self._by_seed:
            p = self.config.protocol
            try:
                parts = dirichlet_label_split(self.y, p.clients, p.dirichlet_alpha, numpy_rng(seed, "partition"))
            except ValueError as e:
                raise DataError(f"protocol.clients = {p.clients}, protocol.dirichlet_alpha = {p.dirichlet_alpha}: "
                                f"{e}; use fewer clients or more data") from None
            rng = numpy_rng(seed, "train-test")  # one generator across the clients, in order
            self._by_seed = {seed: [train_test_split_per_client(idx, p.test_fraction, rng) for idx in parts]}
        return self._by_seed[seed]


def natural_split(client: ClientId, n: int, test_fraction: float) -> Split:
    """A client's own 50/50 split for each run seed, from its own generator: a site draws it alone."""
    return lambda seed: train_test_split_per_client(np.arange(n), test_fraction, numpy_rng(seed, "train-test", client))


# -- reading ---------------------------------------------------------------------------------
def generate(config: FedHealth2Experiment, workdir: Path, progress: Progress | None) -> Path:
    """Write the configured synthetic copy into the run directory (a resumed run has it
    already: generators write a folder whole or not at all); returns its root."""
    syn = config.data.synthetic
    root = workdir / SYNTHETIC_DIR
    if root.is_dir():
        return root
    if config.data.dataset == "xray":
        from fedcare.data.xray.synthetic import generate_xray

        generate_xray(root, seed=syn.seed, scale=syn.scale, image_size=syn.image_size,
                      sites=syn.sites if config.protocol.split == "natural" else None,
                      progress=(lambda d, t: progress("generating synthetic X-rays", d, t)) if progress else None)
    else:
        from fedcare.data.pamap2.synthetic import generate_pamap2

        generate_pamap2(root, seed=syn.seed, subjects=syn.subjects, seconds_per_activity=syn.seconds_per_activity,
                        progress=(lambda d, t: progress("generating synthetic PAMAP2", d, t)) if progress else None)
    return root


def read_xray_examples(root: Path, config: FedHealth2Experiment, progress: Progress | None = None) -> Examples:
    size = config.protocol.image_size
    ds = load_xray(root)
    images = []
    for i, path in enumerate(ds.paths):
        images.append(read_xray(path, size))
        if progress and (i % 100 == 0 or i == len(ds.paths) - 1):
            progress("reading X-rays", i + 1, len(ds.paths))
    x = torch.from_numpy(np.stack(images)[:, None])
    kind = "synthetic chest X-rays generated by fedcare, not patients" if ds.synthetic else f"chest X-rays from {ds.root}"
    return Examples(x, torch.from_numpy(ds.labels), ds.synthetic, f"{len(x)} {kind}; classes {ds.class_counts()}")


def read_pamap2(root: Path, config: FedHealth2Experiment, subjects: Sequence[int] | None = None) -> Examples:
    """PAMAP2 windows (27 channels, 10 activities) of `subjects` (default all), z-scored per
    channel over the windows read: over every subject for the Dirichlet split (a pooled
    preprocessing step, as the authors' preprocessed array was), over its own windows at a
    natural-split site."""
    from fedcare.data.pamap2.reader import load_pamap2_windows

    p = config.protocol
    windows = load_pamap2_windows(root, window=p.window, step=p.step, subjects=subjects)
    kind = "synthetic PAMAP2 recordings generated by fedcare, not people" if windows.synthetic else f"PAMAP2 from {root}"
    return Examples(torch.from_numpy(windows.x), torch.from_numpy(windows.y), windows.synthetic,
                    f"{len(windows.y)} windows of {kind}; classes {windows.class_counts()}")


def natural_clients(root: Path, config: FedHealth2Experiment) -> list[ClientId]:
    """Every natural client under `root`: PAMAP2 subject ids, or the X-ray site folders' names
    (subfolders holding an X-ray copy)."""
    if config.data.dataset == "pamap2":
        from fedcare.data.pamap2.reader import pamap2_subjects

        return pamap2_subjects(root)
    folders = sorted(p.name for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith(".")) \
        if Path(root).is_dir() else []
    sites = [name for name in folders if _holds_xray(Path(root) / name)]
    if not sites:
        raise XrayLayoutError(f"{root}: no site folders holding an X-ray copy (the natural split reads one "
                              f"folder per site, each with the four class folders {', '.join(CLASSES)})")
    return sites


def _holds_xray(folder: Path) -> bool:
    try:
        find_class_root(folder)
        return True
    except XrayLayoutError:
        return False


def read_client(root: Path, client: ClientId, config: FedHealth2Experiment) -> Examples:
    """A natural-split client's own examples: its PAMAP2 subject, or its X-ray folder
    (`root/<client>`, or `root` itself when that is the site's own copy)."""
    if config.data.dataset == "pamap2":
        return read_pamap2(root, config, [int(client)])
    folder = Path(root) / str(client)
    return read_xray_examples(folder if folder.is_dir() else Path(root), config)

"""The pain cohort: every frame decoded and preprocessed once, grouped by subject and session,
plus the thesis's balancing (Algorithm 3, as its code does it).

Memory: each frame is stored once, as the uint8 pre-crop image (250 px for the thesis's 215 px
network input), with the rotation direction drawn for it. Its four variants (original,
flipped, rotated, flipped+rotated; `fedcare.data.transforms.variant`) are cut when a batch
asks for them, so a training, validation or test set costs its item index, not its images
(`FrameItems`). The variants are byte-identical to the ones the cohort used to hold. A cohort
read for a run in this process keeps its frames in a memory-mapped file in the run directory
(`build_cohort(store_dir=...)`): the kernel pages it in and out instead of the process holding
it. The file has no name (it is unlinked when created), so nothing is left behind, even after
a SIGKILL."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from fedcare.algorithms.training import ClientData
from fedcare.data.common import DataError
from fedcare.data.transforms import precrop_size, preprocess, variant
from fedcare.data.unbc.reader import UnbcDataset, load_for_run
from fedcare.runtime.refs import DataRef
from fedcare.seeding import numpy_rng

VARIANTS_PER_FRAME = 4


class PainDataError(DataError):
    """Input data the study cannot use; the message names the path."""


@dataclass
class Session:
    frames: np.ndarray  # (frames, P, P) uint8 pre-crop images: the one stored copy
    signs: np.ndarray  # (frames,) int8: the direction (+1/-1) each frame's rotated variants turn
    labels: np.ndarray  # (frames,) 0/1
    pspi: np.ndarray  # (frames,) float
    image_size: int  # the network's input size, which the variants are cropped to

    @property
    def positives(self) -> int:
        return int(self.labels.sum())

    def item(self, frame: int, which: int) -> np.ndarray:
        """Variant `which` (0..3) of frame `frame`: (image_size, image_size) uint8."""
        return variant(self.frames[frame], which, self.image_size, int(self.signs[frame]))

    def as_client_data(self) -> ClientData:
        """Every frame in all 4 variants, unbalanced: the thesis's validation and test sets."""
        items = session_items(0, len(self.labels))
        return ClientData(FrameItems([self], items), torch.from_numpy(np.repeat(self.labels, VARIANTS_PER_FRAME)
                                                                       .astype(np.float32)))


class FrameItems:
    """The images of (session, frame, variant) items, a `ClientData.x` that cuts each variant
    from its session's stored frame when indexed: `items[idx]` is a (len, 1, S, S) uint8
    tensor, as the rows of a stacked tensor would be. `sessions` are the sessions the rows'
    first column indexes (one subject's, or several subjects' after `torch.cat`)."""

    dtype = torch.uint8

    def __init__(self, sessions: list[Session], rows: np.ndarray):
        self.sessions = sessions
        self.rows = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
        self.size = sessions[0].image_size if sessions else 0

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self.rows), 1, self.size, self.size))

    def __getitem__(self, index) -> torch.Tensor:
        if isinstance(index, torch.Tensor):
            index = index.numpy()
        single = not isinstance(index, slice) and np.ndim(index) == 0
        rows = self.rows[[int(index)] if single else index]
        out = np.empty((len(rows), 1, self.size, self.size), np.uint8)
        for i, (s, f, v) in enumerate(rows):
            out[i, 0] = self.sessions[s].item(f, v)
        return torch.from_numpy(out[0] if single else out)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """`torch.cat` of items is items (pooled data for centralized training), as for the
        surgical study's `FrameStack`."""
        if func is torch.cat and not kwargs and all(isinstance(p, FrameItems) for p in args[0]):
            sessions: list[Session] = []
            rows = []
            for part in args[0]:
                rows.append(part.rows + np.array([len(sessions), 0, 0]))
                sessions.extend(part.sessions)
            return FrameItems(sessions, np.concatenate(rows) if rows else np.zeros((0, 3), np.int64))
        return NotImplemented


@dataclass
class PainCohort:
    sessions: dict[int, list[Session]]  # subject -> its sessions in order
    image_size: int
    synthetic: bool

    def subjects(self) -> list[int]:
        return sorted(self.sessions)


def frame_store(frames: int, side: int, directory: Path | None) -> np.ndarray:
    """Room for `frames` (side, side) uint8 images: in memory, or with `directory` a memory map
    of a file there that has no name (created unlinked) and goes when the array does."""
    if directory is None or frames == 0:
        return np.empty((frames, side, side), np.uint8)
    try:
        with tempfile.TemporaryFile(prefix=".pain-frames-", dir=directory) as file:
            # reserve the blocks now: a full disk is this error, not a SIGBUS on a later write
            os.posix_fallocate(file.fileno(), 0, frames * side * side)
            return np.memmap(file, dtype=np.uint8, mode="r+", shape=(frames, side, side))
    except OSError as e:
        raise PainDataError(f"{directory}: cannot create the frame store of {frames * side * side / 2**20:.0f} MB "
                            f"({e.strerror or e})") from None


def build_cohort(
    ds: UnbcDataset,
    subjects: Iterable[int],
    *,
    image_size: int,
    crop_ratio: float,
    pspi_threshold: float,
    drop_black_frames: bool,
    augment_seed: int,
    progress: Callable[[int, int], None] | None = None,
    store_dir: Path | None = None,
) -> PainCohort:
    """Read and preprocess the frames of `subjects`, each stored once (in memory, or in a
    memory-mapped file in `store_dir`). Fails naming the path on a missing or corrupt image or
    a frame without a PSPI label."""
    wanted = set(subjects)
    missing = wanted - set(ds.subjects())
    if missing:
        raise PainDataError(f"{ds.root}: subjects {sorted(missing)} not found (found {ds.subjects()})")
    frames = ds.frames_of(wanted)  # sorted by (subject, session, index)
    store = frame_store(len(frames), precrop_size(image_size, crop_ratio), store_dir)
    signs = np.empty(len(frames), np.int8)
    pspi = np.empty(len(frames), np.float32)
    spans: dict[tuple[int, int], list[int]] = {}  # (subject, session) -> [first row, end row)
    kept = 0
    for i, frame in enumerate(frames):
        if frame.pspi is None:
            raise PainDataError(f"{frame.image}: no PSPI label (expected Frame_Labels/PSPI/.../{frame.image.stem}_facs.txt)")
        grey = frame.grey()
        if not (drop_black_frames and grey.mean() < 1.0):
            rng = numpy_rng(augment_seed, "rotation", frame.subject, frame.sequence, frame.index)
            signs[kept] = 1 if rng.random() < 0.5 else -1
            store[kept] = preprocess(grey, image_size, crop_ratio)
            pspi[kept] = frame.pspi
            spans.setdefault((frame.subject, frame.session), [kept, kept])[1] = kept + 1
            kept += 1
        if progress and (i % 50 == 0 or i == len(frames) - 1):
            progress(i + 1, len(frames))
    sessions: dict[int, list[Session]] = {}
    for subject in sorted(wanted):
        count = 1 + max((s for (subj, s) in spans if subj == subject), default=-1)
        subject_sessions = []
        for s in range(count):
            a, b = spans.get((subject, s), (0, 0))
            subject_sessions.append(Session(store[a:b], signs[a:b], (pspi[a:b] >= pspi_threshold).astype(np.uint8),
                                            pspi[a:b], image_size))
        sessions[subject] = subject_sessions
    return PainCohort(sessions, image_size, ds.synthetic)


def balance_items(sessions: list[Session], upto: int, per_class: int, rng: np.random.Generator) -> np.ndarray | None:
    """SessionBalancing as the thesis code's `balance_data` does it: walk back from session
    `upto` until more than `per_class` examples of each class are gathered (or the sessions run
    out), then draw `per_class` of each (frame, variant) item: without replacement when enough
    exist, else all of them topped up with replacement. Returns the drawn items as rows
    (session, frame, variant), a row repeated when topped up; None when a class is missing."""
    chosen: list[int] = []
    pos = neg = 0
    for s in range(upto, -1, -1):
        chosen.append(s)
        pos += 4 * sessions[s].positives
        neg += 4 * (len(sessions[s].labels) - sessions[s].positives)
        if pos > per_class and neg > per_class:
            break
    if pos == 0 or neg == 0:
        return None
    items = np.concatenate([session_items(s, len(sessions[s].labels)) for s in chosen])
    labels = np.concatenate([np.repeat(sessions[s].labels, 4) for s in chosen])
    picks = []
    for cls in (1, 0):
        idx = np.flatnonzero(labels == cls)
        if len(idx) >= per_class:
            picks.append(rng.choice(idx, size=per_class, replace=False))
        else:
            picks.append(np.concatenate([idx, rng.choice(idx, size=per_class - len(idx), replace=True)]))
    return items[np.concatenate(picks)]


def session_items(session: int, frames: int) -> np.ndarray:
    """Every (session, frame, variant) item of a session, frame by frame."""
    f, v = np.divmod(np.arange(4 * frames), 4)
    return np.stack([np.full(4 * frames, session), f, v], axis=1).astype(np.int64)


def items_data(sessions: list[Session], items: np.ndarray) -> ClientData:
    """The (session, frame, variant) items, in their order, as a data set (images cut on demand)."""
    y = np.array([sessions[s].labels[f] for s, f, _ in items], dtype=np.float32)
    return ClientData(FrameItems(sessions, items), torch.from_numpy(y))


def balance(sessions: list[Session], upto: int, per_class: int, rng: np.random.Generator) -> ClientData | None:
    """The balanced training set of sessions 0..upto (`balance_items`); None when a class is missing."""
    items = balance_items(sessions, upto, per_class, rng)
    return None if items is None else items_data(sessions, items)


@dataclass(frozen=True)
class TrainingSet(DataRef):
    """The balanced training set of sessions 0..upto, drawn for run seed `seed` (`balance`)."""

    kind: ClassVar[str] = "train"
    seed: int
    upto: int


@dataclass(frozen=True)
class SessionFrames(DataRef):
    """Every frame of session `session` in its 4 variants (validation and test)."""

    kind: ClassVar[str] = "session"
    session: int


class PainSite:
    """One subject's sessions as the site holding them sees them (a `fedcare.runtime.sites.Site`).
    The study addresses the data by reference (`TrainingSet`, `SessionFrames`), so the same
    protocol code runs in process and on Flower, where a site's frames never leave it."""

    data_refs: ClassVar[tuple[type[DataRef], ...]] = (TrainingSet, SessionFrames)

    def __init__(self, subject: int, sessions: list[Session], per_class: int, synthetic: bool):
        self.subject = self.client = subject
        self.sessions = sessions
        self.per_class = per_class
        self.synthetic = synthetic
        self._session_data: dict[int, ClientData] = {}
        self._train: tuple[TrainingSet, ClientData] | None = None

    def summary(self) -> dict:
        """What the protocol needs to know about a site, and no more: how many sessions it
        has, which hold frames, and up to which session a balanced training set exists."""
        has_frames = [len(s.labels) > 0 for s in self.sessions]
        pos = np.cumsum([s.positives for s in self.sessions])
        neg = np.cumsum([len(s.labels) - s.positives for s in self.sessions])
        return {"sessions": len(self.sessions), "has_frames": has_frames,
                "trainable": [bool(p > 0 and q > 0) for p, q in zip(pos, neg)]}

    def inventory(self) -> dict:
        """Exact counts for the preflight (`fedcare.runtime.preflight`, which suppresses the
        small ones before they leave the site): the subject's frames, sessions and frames per label."""
        frames = sum(len(s.labels) for s in self.sessions)
        pain = sum(s.positives for s in self.sessions)
        return {"unit": "frames", "splits": {"sessions": {
            "examples": frames, "sessions": sum(len(s.labels) > 0 for s in self.sessions),
            "labels": {"no pain": frames - pain, "pain": pain}}}}

    def data(self, ref: DataRef) -> ClientData:
        if isinstance(ref, SessionFrames):
            s = ref.session
            if s not in self._session_data:
                self._session_data[s] = self.sessions[s].as_client_data()
            return self._session_data[s]
        if isinstance(ref, TrainingSet):
            # every round of a phase asks for the same set (fit, then after-aggregation): keep the last one
            if self._train is None or self._train[0] != ref:
                last = min(ref.upto, len(self.sessions) - 1)
                data = balance(self.sessions, last, self.per_class, numpy_rng(ref.seed, "balance", self.subject, last))
                if data is None:
                    raise PainDataError(f"subject {self.subject}: no balanced training set up to session {last}")
                self._train = (ref, data)
            return self._train[1]
        raise ValueError(f"unknown pain data reference {ref!r}")


def pretraining_sets(
    cohort: PainCohort, subjects: Iterable[int], val_fraction: float, rng: np.random.Generator
) -> tuple[dict[int, ClientData], dict[int, ClientData]]:
    """The Group-1 set of thesis §6.1: every positive item (4 variants) and as many negatives
    drawn across the whole group without replacement, split by frame (a frame's 4 variants
    stay together, so no augmented copy leaks into validation) into train and validation.
    Returned per subject: the federated pretraining keeps each subject's data on its client."""
    rows = []  # (subject, session, frame, variant, label)
    for subject in sorted(subjects):
        for s, session in enumerate(cohort.sessions[subject]):
            for f, label in enumerate(session.labels):
                rows.extend((subject, s, f, v, int(label)) for v in range(4))
    table = np.array(rows, dtype=np.int64).reshape(-1, 5)
    pos = np.flatnonzero(table[:, 4] == 1)
    neg = np.flatnonzero(table[:, 4] == 0)
    if len(pos) == 0 or len(neg) == 0:
        raise PainDataError(f"pretraining subjects {sorted(subjects)} lack pain or no-pain frames")
    neg = rng.choice(neg, size=min(len(pos), len(neg)), replace=False)
    table = table[np.sort(np.concatenate([pos, neg]))]
    frame_ids = np.unique(table[:, :3], axis=0)
    is_val_frame = rng.random(len(frame_ids)) < val_fraction
    val_frames = {tuple(r) for r in frame_ids[is_val_frame]}
    in_val = np.array([tuple(r) in val_frames for r in table[:, :3]], dtype=bool)
    train, val = {}, {}
    for subject in sorted(subjects):
        for split, mask in ((train, ~in_val), (val, in_val)):
            part = table[(table[:, 0] == subject) & mask]
            if len(part):
                split[subject] = ClientData(FrameItems(cohort.sessions[subject], part[:, 1:4]),
                                            torch.from_numpy(part[:, 4].astype(np.float32)))
    return train, val


def read_cohort(config, root: Path, subjects: list[int], progress: Callable[[str, int, int], None] | None = None,
                store_dir: Path | None = None) -> PainCohort:
    """Read and preprocess `subjects` of the UNBC-McMaster copy at `root` (frames kept in a
    memory-mapped file in `store_dir` if given, else in memory); fails naming the files that
    cannot be used."""
    dataset = load_for_run(root, subjects)
    protocol, data = config.protocol, config.data
    return build_cohort(
        dataset, subjects, image_size=protocol.image_size, crop_ratio=protocol.crop_ratio,
        pspi_threshold=data.pspi_threshold, drop_black_frames=data.drop_black_frames, augment_seed=data.augment_seed,
        progress=(lambda d, t: progress("reading frames", d, t)) if progress else None, store_dir=store_dir,
    )

"""Loader for PAMAP2 (UCI 231) in its real on-disk layout, as the FedHealth 2 study uses it.

Layout (reference/dataset-formats.md §4)::

    PAMAP2_Dataset/Protocol/subject101.dat ... subject109.dat
    PAMAP2_Dataset/Optional/subject101.dat subject105.dat ...      (optional activities only)

Each ``.dat`` file is plain text, whitespace-separated, no header, 54 columns per row at 100 Hz:
timestamp (s), activityID, heart rate (bpm, ~9 Hz, literal ``NaN`` otherwise), then three IMU
blocks of 17 columns (hand 3-19, chest 20-36, ankle 37-53, 0-based): temperature, acc ±16 g
(3), acc ±6 g (3), gyroscope (3), magnetometer (3), orientation (4, "invalid in this data
collection"). Missing values are the literal ``NaN``.

Choices (the paper is silent; written down here and in the study config)
------------------------------------------------------------------------
* **27 channels**: per IMU (hand, chest, ankle, in that order) acc ±16 g x/y/z, gyro x/y/z,
  magnetometer x/y/z = 9 x 3 (``CHANNEL_COLUMNS``, ``CHANNEL_NAMES``). The ±6 g accelerometer
  (saturates; the readme recommends ±16 g), temperature, heart rate and the invalid orientation
  columns are dropped.
* **10 activities** (``PAPER_ACTIVITIES``): lying, sitting, standing, walking, cycling, Nordic
  walking, ascending stairs, descending stairs, vacuum cleaning, ironing -> labels 0..9 in
  that order (ascending activity id). The authors' code drops labels 0, 5 and 12 of its
  preprocessed array and re-indexes the rest; we read that array as the usual 13-label map
  (0 = other, then the 12 protocol activities 1-7, 12, 13, 16, 17, 24 in id order), so 0 = other,
  5 = running, 12 = rope jumping are dropped. This also matches the paper's 17,639 windows
  (about 1.80 M rows of these 10 activities / 100-sample stride). Activity 0 is always dropped
  (the readme says to discard it); other activities outside the chosen set are dropped too.
* **Missing values**: IMU ``NaN`` cells (wireless drop-outs) are linearly interpolated along
  time within each contiguous segment (``nan_policy="interpolate"``, edges take the nearest
  value; a segment in which a channel is entirely NaN is dropped), or the rows are removed and
  split the segment (``nan_policy="drop"``). Heart rate is kept raw (NaN between readings) and
  is not a model input.
* **Windows**: cut per subject within contiguous segments of kept rows (rows 0.01 s apart, no
  dropped row in between), so a window never bridges a removed transient, a gap in the
  timestamps or two subjects. Default 200 samples (2 s), stride 100 (50 % overlap): the HAR
  CNN's flatten size 32 x 44 implies T = 200; the stride is our choice. A window's label is the
  majority label of its samples (ties -> the smaller label), or with ``label_rule="last"`` the
  label of its last sample.
* **Scale**: ``load_pamap2_windows`` z-scores each channel over all loaded windows by default
  (``standardize``; see there).

Errors: a malformed row (wrong column count, a token that is not a number, an infinite value,
an unknown or non-integer activity id, a NaN timestamp or activity) raises ``Pamap2FormatError``
naming the file and 1-based line; a missing folder or a folder without ``subjectNNN.dat`` files
raises ``Pamap2LayoutError`` naming the path.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import numpy as np

from fedcare.data.common import SYNTHETIC_MARKER, DataError
from fedcare.errors import InputError

__all__ = [
    "ACTIVITY_NAMES",
    "CHANNEL_COLUMNS",
    "CHANNEL_NAMES",
    "N_COLUMNS",
    "PAPER_ACTIVITIES",
    "PAPER_CLASS_NAMES",
    "Pamap2Dataset",
    "Pamap2FormatError",
    "Pamap2LayoutError",
    "Pamap2Recording",
    "Pamap2Windows",
    "find_pamap2_root",
    "load_pamap2",
    "load_pamap2_windows",
    "make_windows",
    "read_pamap2_file",
]

N_COLUMNS = 54
SAMPLE_RATE = 100.0
IMUS = ("hand", "chest", "ankle")
IMU_START = {"hand": 3, "chest": 20, "ankle": 37}  # 0-based first column (temperature) of each block
IMU_WIDTH = 17
# offsets inside a block
TEMPERATURE, ACC16, ACC6, GYRO, MAG, ORIENTATION = 0, 1, 4, 7, 10, 13
_SENSORS = (("acc16", ACC16), ("gyro", GYRO), ("mag", MAG))
CHANNEL_COLUMNS: tuple[int, ...] = tuple(
    IMU_START[imu] + offset + axis for imu in IMUS for _, offset in _SENSORS for axis in range(3)
)
CHANNEL_NAMES: tuple[str, ...] = tuple(
    f"{imu}_{name}_{axis}" for imu in IMUS for name, _ in _SENSORS for axis in "xyz"
)
ORIENTATION_COLUMNS: tuple[int, ...] = tuple(IMU_START[imu] + ORIENTATION + k for imu in IMUS for k in range(4))

ACTIVITY_NAMES: dict[int, str] = {
    0: "other (transient)", 1: "lying", 2: "sitting", 3: "standing", 4: "walking", 5: "running",
    6: "cycling", 7: "Nordic walking", 9: "watching TV", 10: "computer work", 11: "car driving",
    12: "ascending stairs", 13: "descending stairs", 16: "vacuum cleaning", 17: "ironing",
    18: "folding laundry", 19: "house cleaning", 20: "playing soccer", 24: "rope jumping",
}
PROTOCOL_ACTIVITIES = (1, 2, 3, 4, 5, 6, 7, 12, 13, 16, 17, 24)
PAPER_ACTIVITIES: tuple[int, ...] = (1, 2, 3, 4, 6, 7, 12, 13, 16, 17)
PAPER_CLASS_NAMES: tuple[str, ...] = tuple(ACTIVITY_NAMES[a] for a in PAPER_ACTIVITIES)

_FILE_RE = re.compile(r"^subject(\d{3})\.dat$")
_PARTS = ("Protocol", "Optional")
_LAYOUT_HINT = "expected the PAMAP2 layout: PAMAP2_Dataset/Protocol/subject101.dat ..."


class Pamap2LayoutError(DataError):
    """The path does not hold the PAMAP2 layout; the message names the path."""


class Pamap2FormatError(DataError):
    """A malformed row; the message names the file and the 1-based line."""

    def __init__(self, path: Path | str, line: int, detail: str):
        super().__init__(f"{path}: line {line}: {detail}")
        self.path, self.line, self.detail = Path(path), line, detail


@dataclass
class Pamap2Recording:
    """One ``subjectNNN.dat`` file, every row (activity 0 included), raw values."""

    subject: int  # 101 for subject101.dat
    part: str  # "Protocol" or "Optional"
    path: Path
    timestamps: np.ndarray  # (n,) float64 seconds
    activity: np.ndarray  # (n,) int64 raw activity ids
    heart_rate: np.ndarray  # (n,) float32, NaN between readings
    channels: np.ndarray  # (n, 27) float32 in CHANNEL_NAMES order, NaN where missing

    def __len__(self) -> int:
        return len(self.activity)


@dataclass
class Pamap2Dataset:
    root: Path  # the PAMAP2_Dataset folder (holding Protocol/)
    recordings: list[Pamap2Recording]  # sorted by (part, subject)
    synthetic: bool

    def subjects(self) -> list[int]:
        return sorted({r.subject for r in self.recordings})


@dataclass
class Pamap2Windows:
    x: np.ndarray  # (N, 27, window) float32
    y: np.ndarray  # (N,) int64 labels 0..len(activities)-1
    subject: np.ndarray  # (N,) int64 subject id per window
    activities: tuple[int, ...]  # raw activity id of each label
    root: Path
    synthetic: bool
    info: dict = field(default_factory=dict)  # counts of dropped rows / segments
    standardized: bool = False  # x z-scored per channel with channel_mean / channel_std
    channel_mean: np.ndarray | None = None  # (27,) raw-unit mean per channel over all windows
    channel_std: np.ndarray | None = None  # (27,) raw-unit standard deviation per channel

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(ACTIVITY_NAMES[a] for a in self.activities)

    def class_counts(self) -> dict[str, int]:
        return {name: int((self.y == i).sum()) for i, name in enumerate(self.class_names)}


# --------------------------------------------------------------------------- reading files


def _scan_for_error(path: Path) -> None:
    """Find the first malformed line of `path` (slow path, only after a fast parse failed)."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            tokens = line.split()
            if not tokens:
                continue
            if len(tokens) != N_COLUMNS:
                raise Pamap2FormatError(path, lineno, f"expected {N_COLUMNS} whitespace-separated columns, got {len(tokens)}")
            for col, token in enumerate(tokens, start=1):
                try:
                    value = float(token)
                except ValueError:
                    raise Pamap2FormatError(path, lineno, f"column {col}: {token[:40]!r} is not a number") from None
                if math.isinf(value):
                    raise Pamap2FormatError(path, lineno, f"column {col}: {token!r} is not finite")


def _line_numbers(path: Path) -> np.ndarray:
    """1-based file line of each non-blank line (the rows np.loadtxt returns)."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        return np.array([i for i, line in enumerate(fh, start=1) if line.strip()], dtype=np.int64)


def _check_values(path: Path, data: np.ndarray) -> None:
    bad_rows = [
        (np.isinf(data).any(axis=1), "a value is not finite"),
        (np.isnan(data[:, 0]), "timestamp is NaN"),
        (np.isnan(data[:, 1]), "activity id is NaN"),
    ]
    activity = data[:, 1]
    known = np.isin(activity, list(ACTIVITY_NAMES))
    bad_rows.append((~np.isnan(activity) & ~known, "unknown activity id"))
    first = None
    for mask, detail in bad_rows:
        hits = np.flatnonzero(mask)
        if len(hits) and (first is None or hits[0] < first[0]):
            first = (int(hits[0]), detail)
    if first is not None:
        row, detail = first
        line = int(_line_numbers(path)[row])
        if detail == "unknown activity id":
            detail = f"activity id {data[row, 1]:g} is not a PAMAP2 activity (known: {sorted(ACTIVITY_NAMES)})"
        elif detail == "a value is not finite":
            _scan_for_error(path)  # names the column
        raise Pamap2FormatError(path, line, detail)


def read_pamap2_file(path: Path | str, part: str = "Protocol") -> Pamap2Recording:
    """Read one ``subjectNNN.dat`` file; the subject id comes from the file name."""
    path = Path(path)
    match = _FILE_RE.match(path.name)
    if not match:
        raise Pamap2LayoutError(f"{path}: not a PAMAP2 subject file (expected subjectNNN.dat)")
    if not path.is_file():
        raise Pamap2LayoutError(f"{path}: no such file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "input contained no data": handled below
            data = np.loadtxt(path, dtype=np.float64, ndmin=2, encoding="utf-8")
    except ValueError:
        _scan_for_error(path)
        raise  # pragma: no cover - the scan finds what loadtxt rejected
    if data.size == 0:
        raise Pamap2LayoutError(f"{path}: empty file (expected rows of {N_COLUMNS} columns)")
    if data.shape[1] != N_COLUMNS:
        _scan_for_error(path)
    _check_values(path, data)
    return Pamap2Recording(
        subject=int(match.group(1)),
        part=part,
        path=path,
        timestamps=data[:, 0].copy(),
        activity=data[:, 1].astype(np.int64),
        heart_rate=data[:, 2].astype(np.float32),
        channels=np.ascontiguousarray(data[:, CHANNEL_COLUMNS], dtype=np.float32),
    )


# --------------------------------------------------------------------------- layout


def find_pamap2_root(path: Path | str) -> Path:
    """The ``PAMAP2_Dataset`` folder: `path` itself if it holds ``Protocol/``, else
    ``path/PAMAP2_Dataset``. Raises Pamap2LayoutError naming the path."""
    path = Path(path)
    if not path.is_dir():
        raise Pamap2LayoutError(f"{path}: no such folder ({_LAYOUT_HINT})")
    for candidate in (path, path / "PAMAP2_Dataset"):
        if (candidate / "Protocol").is_dir():
            return candidate
    raise Pamap2LayoutError(f"{path}: no Protocol/ folder here or in PAMAP2_Dataset/ ({_LAYOUT_HINT})")


def _is_synthetic(root: Path, start: Path) -> bool:
    """A fedcare marker in PAMAP2_Dataset/, its parent (where the generator writes it) or the
    folder given."""
    return any((folder / SYNTHETIC_MARKER).is_file() for folder in (root, root.parent, start))


def _subject_files(folder: Path) -> dict[int, Path]:
    files = {}
    if folder.is_dir():
        for p in sorted(folder.iterdir()):
            m = _FILE_RE.match(p.name)
            if m and p.is_file():
                files[int(m.group(1))] = p
    return files


def pamap2_subjects(path: Path | str) -> list[int]:
    """The subject ids with a ``Protocol/subjectNNN.dat`` file in the copy at `path`."""
    subjects = sorted(_subject_files(find_pamap2_root(path) / "Protocol"))
    if not subjects:
        raise Pamap2LayoutError(f"{find_pamap2_root(path) / 'Protocol'}: no subjectNNN.dat files ({_LAYOUT_HINT})")
    return subjects


def load_pamap2(
    path: Path | str,
    *,
    subjects: Iterable[int] | None = None,
    include_optional: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> Pamap2Dataset:
    """Read ``Protocol/subjectNNN.dat`` (and ``Optional/`` with `include_optional`) for all
    subjects, or only `subjects` (ids like 101; a requested subject without a Protocol file is
    an error naming the expected path)."""
    start = Path(path)
    root = find_pamap2_root(start)
    protocol = _subject_files(root / "Protocol")
    if not protocol:
        raise Pamap2LayoutError(f"{root / 'Protocol'}: no subjectNNN.dat files ({_LAYOUT_HINT})")
    wanted = sorted(protocol) if subjects is None else sorted({int(s) for s in subjects})
    if not wanted:
        raise InputError("subjects is empty: give at least one subject id (e.g. 101)")
    missing = [s for s in wanted if s not in protocol]
    if missing:
        raise Pamap2LayoutError(
            f"{root / 'Protocol'}: no file for subject(s) {missing} "
            f"(expected e.g. {root / 'Protocol' / f'subject{missing[0]}.dat'}; found {sorted(protocol)})"
        )
    jobs = [(protocol[s], "Protocol") for s in wanted]
    if include_optional:
        optional = _subject_files(root / "Optional")
        jobs += [(optional[s], "Optional") for s in wanted if s in optional]
    recordings = []
    for i, (file, part) in enumerate(jobs):
        recordings.append(read_pamap2_file(file, part))
        if progress:
            progress(i + 1, len(jobs))
    return Pamap2Dataset(root, recordings, _is_synthetic(root, start))


# --------------------------------------------------------------------------- windows


def make_windows(
    signals: np.ndarray,
    labels: np.ndarray,
    window: int,
    step: int,
    *,
    label_rule: str = "majority",
) -> tuple[np.ndarray, np.ndarray]:
    """Sliding windows over one contiguous recording.

    `signals` (T, C), `labels` (T,) non-negative ints. Windows start at 0, step, 2*step, ... and
    only full windows are kept: ``max(0, (T - window) // step + 1)`` of them. Returns x
    (N, C, window) float32 and y (N,) int64; y is the most frequent label in the window (ties ->
    the smaller label) for ``label_rule="majority"``, the label of the window's last sample for
    ``"last"``."""
    if window < 1 or step < 1:
        raise ValueError(f"window and step must be >= 1, got {window}, {step}")
    if label_rule not in ("majority", "last"):
        raise ValueError(f"label_rule must be 'majority' or 'last', got {label_rule!r}")
    signals = np.asarray(signals)
    labels = np.asarray(labels, dtype=np.int64)
    if signals.ndim != 2 or len(signals) != len(labels):
        raise ValueError(f"signals must be (T, C) with T = len(labels), got {signals.shape} and {labels.shape}")
    n = max(0, (len(labels) - window) // step + 1)
    if n == 0:
        return np.zeros((0, signals.shape[1], window), np.float32), np.zeros(0, np.int64)
    starts = np.arange(n) * step
    take = starts[:, None] + np.arange(window)[None, :]
    x = np.ascontiguousarray(signals[take].transpose(0, 2, 1), dtype=np.float32)
    win_labels = labels[take]
    if label_rule == "last":
        y = win_labels[:, -1].copy()
    else:
        if labels.min(initial=0) < 0:
            raise ValueError("labels must be non-negative for the majority rule")
        counts = np.zeros((n, int(labels.max()) + 1), np.int64)
        np.add.at(counts, (np.repeat(np.arange(n), window), win_labels.ravel()), 1)
        y = counts.argmax(axis=1).astype(np.int64)
    return x, y


def _segments(keep: np.ndarray, timestamps: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) runs of kept rows whose timestamps advance by one sample (0.01 s)."""
    dt = np.diff(timestamps)
    continuous = np.abs(dt - 1.0 / SAMPLE_RATE) < 0.5 / SAMPLE_RATE
    joined = keep[:-1] & keep[1:] & continuous
    breaks = np.flatnonzero(~joined) + 1
    bounds = np.concatenate([[0], breaks, [len(keep)]])
    return [(int(a), int(b)) for a, b in pairwise(bounds) if keep[a]]


def _interpolate(block: np.ndarray) -> np.ndarray | None:
    """Linear interpolation of NaN along time per channel; None if a channel is all NaN."""
    nan = np.isnan(block)
    if not nan.any():
        return block
    out = block.copy()
    t = np.arange(len(block))
    for c in np.flatnonzero(nan.any(axis=0)):
        good = ~nan[:, c]
        if not good.any():
            return None
        out[nan[:, c], c] = np.interp(t[nan[:, c]], t[good], block[good, c])
    return out


def _recording_windows(rec: Pamap2Recording, label: np.ndarray, nan_policy: str, window: int, step: int,
                       label_rule: str, info: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (x, y) windows of each kept segment of one recording (`label`: each row's class,
    -1 for an activity left out); counts rows and segments into `info`."""
    nan_rows = np.isnan(rec.channels).any(axis=1)
    keep = label >= 0
    info["rows"] += len(rec)
    info["rows_activity_0"] += int((rec.activity == 0).sum())
    info["rows_other_activities"] += int(((label < 0) & (rec.activity != 0)).sum())
    info["rows_with_nan"] += int((keep & nan_rows).sum())
    if nan_policy == "drop":
        keep = keep & ~nan_rows
    windows = []
    for a, b in _segments(keep, rec.timestamps):
        info["segments"] += 1
        block = _interpolate(rec.channels[a:b])
        if block is None:
            info["segments_dropped_all_nan"] += 1
            continue
        info["rows_kept"] += b - a
        windows.append(make_windows(block, label[a:b], window, step, label_rule=label_rule))
    return windows


def load_pamap2_windows(
    path: Path | str,
    *,
    window: int = 200,
    step: int = 100,
    activities: Sequence[int] = PAPER_ACTIVITIES,
    subjects: Iterable[int] | None = None,
    include_optional: bool = False,
    label_rule: str = "majority",
    nan_policy: str = "interpolate",
    standardize: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> Pamap2Windows:
    """Load a PAMAP2 copy and cut it into labelled windows of the 27 channels (see the module
    docstring for every choice). Label k = the k-th id of `activities` (default the paper's 10).

    `standardize` (default on): every channel is z-scored with its mean and standard deviation
    over all windows loaded (``channel_mean`` / ``channel_std`` keep them). The raw channels
    differ in scale by two orders of magnitude (magnetometer tens of μT, gyroscope ~1 rad/s);
    without it the HAR CNN at the paper's SGD lr 0.01 learns slowly and poorly. This is a
    global preprocessing step of the pooled data, like the preprocessed arrays the authors'
    code reads, not a federated computation; pass False for raw units."""
    if nan_policy not in ("interpolate", "drop"):
        raise ValueError(f"nan_policy must be 'interpolate' or 'drop', got {nan_policy!r}")
    activities = tuple(int(a) for a in activities)
    unknown = [a for a in activities if a not in ACTIVITY_NAMES or a == 0]
    if unknown or len(set(activities)) != len(activities) or not activities:
        raise InputError(f"activities must be distinct PAMAP2 activity ids other than 0, got {activities}")
    ds = load_pamap2(path, subjects=subjects, include_optional=include_optional, progress=progress)
    lookup = np.full(max(ACTIVITY_NAMES) + 1, -1, np.int64)
    lookup[list(activities)] = np.arange(len(activities))
    xs, ys, ss = [], [], []
    info = {"rows": 0, "rows_kept": 0, "rows_activity_0": 0, "rows_other_activities": 0,
            "rows_with_nan": 0, "segments": 0, "segments_dropped_all_nan": 0}
    for rec in ds.recordings:
        for x, y in _recording_windows(rec, lookup[rec.activity], nan_policy, window, step, label_rule, info):
            xs.append(x)
            ys.append(y)
            ss.append(np.full(len(y), rec.subject, np.int64))
    if not xs or sum(len(y) for y in ys) == 0:
        raise Pamap2LayoutError(f"{ds.root}: no {window}-sample windows of activities {activities} found")
    x = np.concatenate(xs)
    mean = x.mean(axis=(0, 2), dtype=np.float64)
    std = np.maximum(x.std(axis=(0, 2), dtype=np.float64), 1e-6)
    if standardize:
        x -= mean[None, :, None].astype(np.float32)
        x /= std[None, :, None].astype(np.float32)
    return Pamap2Windows(
        x=x, y=np.concatenate(ys), subject=np.concatenate(ss), activities=activities,
        root=ds.root, synthetic=ds.synthetic, info=info, standardized=standardize,
        channel_mean=mean.astype(np.float32), channel_std=std.astype(np.float32),
    )

"""Synthetic PAMAP2 recordings in the real layout, for tests and the FedHealth 2 demo.

Writes ``<out>/PAMAP2_Dataset/Protocol/subject1NN.dat``: 54 space-separated columns at 100 Hz
with the real conventions (timestamps with 2 decimals rising by 0.01 s, integer activity ids,
heart rate as an integer about every 11th row (~9 Hz) and ``NaN`` otherwise, orientation
``1 0 0 0``, short wireless drop-outs that make a whole IMU block ``NaN``, transient activity 0
between activities). Each subject performs the paper's 10 activities in the protocol order.

Signal model (body frame of each IMU: hand, chest, ankle): acceleration = gravity along the
activity's posture direction + periodic motion; gyroscope = angular motion at the same rhythm;
magnetometer = the earth field seen from the posture and a heading that changes per activity.
* lying: gravity on a different axis than upright, almost no variance; sitting / standing:
  still postures that differ in the hand and ankle tilt; ironing: standing, small ~1 Hz hand
  strokes; vacuum cleaning: slow large hand push-pull plus shuffling steps;
* walking, Nordic walking (big pole swing in the hand), ascending stairs (slower, bigger
  vertical ankle motion, forward lean), descending stairs (faster, sharp impacts): periodic
  acceleration at the subject's cadence; cycling: forward lean and circular ankle motion.
Per subject: cadence and amplitude factors, noise level, temperature, heart-rate offset and a
fixed small rotation of each IMU's axes (sensor placement). Deterministic from the seed
(byte-identical files); written atomically with a ``fedcare-synthetic.json`` marker at `out`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from fedcare.data.pamap2.reader import (
    ACTIVITY_NAMES,
    IMU_START,
    IMUS,
    N_COLUMNS,
    PAPER_ACTIVITIES,
)
from fedcare.data.synthetic.output import atomic_directory
from fedcare.data.common import SYNTHETIC_MARKER
from fedcare.errors import InputError

G = 9.81
RATE = 100
GENERATOR = "fedcare.data.synthetic.pamap2"  # in the marker; --overwrite replaces only a copy it names
PROTOCOL_ORDER = (1, 2, 3, 17, 16, 12, 13, 4, 7, 6)  # the real protocol order, minus running / rope jumping
_EARTH = np.array([20.0, -40.0, 30.0])  # μT

# posture: unit gravity direction in each IMU's frame (hand, chest, ankle)
_UP = (0.0, 1.0, 0.0)
_POSTURE = {
    1: ((0.0, 0.2, 1.0), (0.1, 0.0, 1.0), (0.0, 0.3, 1.0)),  # lying: gravity on z
    2: ((0.2, 0.3, 1.0), (0.0, 1.0, 0.15), (0.6, 1.0, 0.0)),  # sitting: hand on lap, shin tilted
    3: ((1.0, 0.3, 0.1), _UP, _UP),  # standing: arm hanging
    4: ((1.0, 0.3, 0.1), _UP, _UP),
    6: ((0.5, 0.8, 0.4), (0.0, 1.0, -0.5), (0.3, 1.0, 0.0)),  # cycling: lean forward, hands on bar
    7: ((0.7, 0.7, 0.2), (0.0, 1.0, -0.2), _UP),
    12: ((1.0, 0.3, 0.1), (0.0, 1.0, -0.35), _UP),  # stairs up: forward lean
    13: ((1.0, 0.3, 0.1), (0.0, 1.0, 0.2), _UP),  # stairs down: slight backward lean
    16: ((0.6, 0.5, 0.6), (0.0, 1.0, -0.3), _UP),
    17: ((0.3, 0.4, 1.0), (0.0, 1.0, -0.15), _UP),  # ironing: hand flat on the iron
}
# rhythm: (base frequency Hz, hand amp, chest amp, ankle amp [m/s²], harmonic sharpness, gyro scale)
_MOTION = {
    1: (0.25, 0.05, 0.05, 0.02, 0.0, 0.02),  # breathing
    2: (0.3, 0.15, 0.08, 0.05, 0.0, 0.05),
    3: (0.3, 0.2, 0.12, 0.1, 0.0, 0.06),
    4: (1.85, 3.0, 2.2, 7.0, 0.4, 1.0),
    6: (1.2, 0.6, 1.0, 5.0, 0.0, 1.2),
    7: (1.95, 7.0, 2.8, 7.5, 0.4, 1.4),
    12: (1.45, 2.5, 2.0, 8.5, 0.3, 0.9),
    13: (1.75, 3.0, 3.2, 9.0, 1.2, 1.1),
    16: (0.6, 5.0, 1.0, 2.0, 0.2, 0.8),
    17: (1.0, 2.2, 0.3, 0.2, 0.1, 0.5),
}
_HEART = {1: 75, 2: 80, 3: 88, 4: 112, 6: 125, 7: 124, 12: 130, 13: 118, 16: 105, 17: 92}


def _rotation(rng: np.random.Generator, max_degrees: float) -> np.ndarray:
    axis = rng.normal(size=3)
    axis /= np.linalg.norm(axis)
    angle = np.deg2rad(rng.uniform(-max_degrees, max_degrees))
    k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    return np.eye(3) + np.sin(angle) * k + (1 - np.cos(angle)) * k @ k


def _subject_traits(seed: int, subject: int) -> dict:
    rng = np.random.default_rng([seed, subject, 1])
    return {
        "cadence": rng.uniform(0.85, 1.15),
        "amplitude": rng.uniform(0.8, 1.25),
        "noise": rng.uniform(0.1, 0.4),
        "placement": [_rotation(rng, 20.0) for _ in IMUS],
        # each subject's own way of doing each activity: tilt of every IMU and per-IMU vigour
        "style": [[_rotation(rng, 20.0) for _ in IMUS] for _ in range(len(PROTOCOL_ORDER) + 1)],
        "imu_gain": rng.uniform(0.7, 1.4, size=(len(PROTOCOL_ORDER) + 1, 3)),
        "temperature": rng.uniform(30.0, 34.0, size=3),
        "heart": rng.uniform(-8.0, 8.0),
        "activity_gain": rng.uniform(0.85, 1.15, size=len(PROTOCOL_ORDER)),
    }


def _segment(activity: int, n: int, traits: dict, rng: np.random.Generator, k: int) -> np.ndarray:
    """(n, 3 IMUs, 12): acc16 (3), acc6 (3), gyro (3), mag (3) for one activity bout."""
    t = np.arange(n) / RATE
    out = np.zeros((n, 3, 12))
    if activity == 0:  # transient: drift from a standing posture with random small motions
        postures, motion = _POSTURE[3], (0.7, 1.0, 0.6, 1.0, 0.2, 0.4)
    else:
        postures, motion = _POSTURE[activity], _MOTION[activity]
    freq, amps, sharp, gyro_scale = motion[0], motion[1:4], motion[4], motion[5]
    freq = freq * traits["cadence"] * rng.uniform(0.97, 1.03)
    gain = traits["amplitude"] * (traits["activity_gain"][k] if activity else 1.0)
    heading = _rotation(rng, 180.0) if activity else np.eye(3)
    phase0 = rng.uniform(0, 2 * np.pi, size=3)
    wander = np.cumsum(rng.normal(0, 0.002, size=n))  # slow phase wander: not a pure sine
    for i in range(3):
        g = traits["style"][k][i] @ np.asarray(postures[i], float)
        g = g / np.linalg.norm(g)
        # ankle moves at stride frequency (half the step frequency) for gait-like activities
        f = freq / 2 if (i == 2 and activity in (4, 7, 12, 13)) or (i == 0 and activity in (4, 7)) else freq
        ph = 2 * np.pi * f * t + phase0[i] + wander
        wave = np.sin(ph) + sharp * np.sin(2 * ph + 0.5) ** 3
        a = amps[i] * gain * traits["imu_gain"][k, i]
        motion_vec = np.stack([0.6 * a * wave, a * np.cos(ph + 0.3), 0.4 * a * np.sin(ph + 1.1)], axis=1)
        if activity == 6 and i == 2:  # pedalling: circular ankle motion
            motion_vec[:, 0] = a * np.cos(ph)
            motion_vec[:, 1] = a * np.sin(ph)
        acc = G * g[None, :] + motion_vec
        gyro = gyro_scale * gain * np.stack([np.cos(ph + 0.2), 0.5 * np.sin(ph), 0.3 * np.cos(2 * ph)], axis=1)
        mag = (heading @ _EARTH)[None, :] + 5.0 * np.cross(g, [0.0, 0.0, 1.0])[None, :] \
            + 3.0 * gyro_scale * np.sin(ph)[:, None]
        rot = traits["placement"][i]
        noise = traits["noise"]
        acc = acc @ rot.T + rng.normal(0, noise, size=(n, 3))
        gyro = gyro @ rot.T + rng.normal(0, noise * 0.1, size=(n, 3))
        mag = mag @ rot.T + rng.normal(0, 0.8, size=(n, 3))
        acc6 = np.clip(acc + rng.normal(0, noise * 0.5, size=(n, 3)), -6 * G, 6 * G)
        out[:, i] = np.concatenate([acc, acc6, gyro, mag], axis=1)
    return out


def _subject_table(subject: int, seed: int, seconds: float) -> tuple[np.ndarray, dict[int, int]]:
    """All rows of one subject's Protocol file as a float (rows, 54) array (NaN = missing)."""
    traits = _subject_traits(seed, subject)
    rng = np.random.default_rng([seed, subject, 2])
    blocks, labels = [], []
    for k, activity in enumerate(PROTOCOL_ORDER):
        gap = int(rng.uniform(3.0, 8.0) * RATE)
        blocks.append(_segment(0, gap, traits, rng, k))
        labels.append(np.zeros(gap, np.int64))
        n = max(1, round(seconds * rng.uniform(0.8, 1.2) * RATE))
        blocks.append(_segment(activity, n, traits, rng, k))
        labels.append(np.full(n, activity, np.int64))
    tail = int(rng.uniform(3.0, 8.0) * RATE)
    blocks.append(_segment(0, tail, traits, rng, len(PROTOCOL_ORDER)))
    labels.append(np.zeros(tail, np.int64))
    imu = np.concatenate(blocks)
    activity = np.concatenate(labels)
    n = len(activity)
    table = np.full((n, N_COLUMNS), np.nan)
    table[:, 0] = np.round(rng.uniform(5.0, 10.0), 2) + np.arange(n) / RATE
    table[:, 1] = activity
    # heart rate: ~9 Hz readings of a smoothed activity-dependent level
    level = np.array([_HEART.get(int(a), 95) for a in activity], float) + traits["heart"]
    level = np.convolve(level, np.ones(1500) / 1500, mode="same") + np.cumsum(rng.normal(0, 0.02, n))
    level[:750], level[-750:] = level[750], level[-751]
    readings = np.arange(int(rng.integers(0, 11)), n, 11)
    table[readings, 2] = np.round(level[readings])
    for i, name in enumerate(IMUS):
        c = IMU_START[name]
        table[:, c] = np.round((traits["temperature"][i] + np.linspace(0.0, 1.5, n)) * 16) / 16  # 1/16 °C steps
        table[:, c + 1 : c + 13] = imu[:, i]
        table[:, c + 13 : c + 17] = (1.0, 0.0, 0.0, 0.0)  # orientation: invalid, written as in the real files
        for start in rng.integers(0, n, size=max(1, n // 3000)):  # wireless drop-outs: whole block NaN
            table[start : start + int(rng.integers(1, 6)), c : c + 17] = np.nan
    counts = {int(a): int((activity == a).sum()) for a in (0, *PROTOCOL_ORDER)}
    return table, counts


_ROW_FORMAT = " ".join(["%.2f", "%d", "%.6g"] + ["%.6g"] * (N_COLUMNS - 3))


def _format(table: np.ndarray) -> str:
    activity = table[:, 1].astype(np.int64)
    rows = table.tolist()
    lines = []
    for row, act in zip(rows, activity.tolist()):
        row[1] = act
        lines.append(_ROW_FORMAT % tuple(row))
    return ("\n".join(lines) + "\n").replace("nan", "NaN")


def _subject_ids(subjects: int | Iterable[int]) -> list[int]:
    if isinstance(subjects, int):
        if not 1 <= subjects <= 99:
            raise InputError(f"subjects must be between 1 and 99 (ids 101..), got {subjects}")
        return list(range(101, 101 + subjects))
    ids = sorted({int(s) for s in subjects})
    if not ids or any(not 100 <= s <= 999 for s in ids):
        raise InputError(f"subject ids must be 3-digit numbers like 101, got {ids}")
    return ids


def generate_pamap2(
    out: Path | str,
    *,
    seed: int = 0,
    subjects: int | Iterable[int] = 9,
    seconds_per_activity: float = 30.0,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Write ``out/PAMAP2_Dataset/Protocol/subject<id>.dat`` for `subjects` (a count -> ids
    101.., or explicit ids), each with the paper's 10 activities of about
    `seconds_per_activity` (±20 %) and 3-8 s of activity 0 around them. Returns {"root",
    "dataset", "subjects", "files", "rows", "rows_per_activity", "seed"}. Raises
    FileExistsError naming `out` if it exists and is not empty (unless `overwrite`)."""
    if not isinstance(seed, int) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")
    if not 0 < seconds_per_activity <= 3600:  # nan and inf too: an hour of each activity is plenty
        raise InputError(f"seconds_per_activity must be above 0 and at most 3600, got {seconds_per_activity!r}")
    ids = _subject_ids(subjects)
    out = Path(out)
    rows_per_activity = {ACTIVITY_NAMES[a]: 0 for a in (0, *PAPER_ACTIVITIES)}
    total = 0
    with atomic_directory(out, overwrite, GENERATOR) as tmp:
        folder = tmp / "PAMAP2_Dataset" / "Protocol"
        folder.mkdir(parents=True)
        for i, subject in enumerate(ids):
            table, counts = _subject_table(subject, seed, float(seconds_per_activity))
            (folder / f"subject{subject}.dat").write_text(_format(table), encoding="utf-8")
            total += len(table)
            for a, c in counts.items():
                rows_per_activity[ACTIVITY_NAMES[a]] += c
            if progress:
                progress(i + 1, len(ids))
        note = {
            "generator": GENERATOR,
            "seed": seed,
            "note": "SYNTHETIC PAMAP2-layout recordings, not people",
            "options": {"subjects": ids, "seconds_per_activity": seconds_per_activity},
        }
        (tmp / SYNTHETIC_MARKER).write_text(json.dumps(note, indent=2, sort_keys=True) + "\n")
    return {"root": str(out), "dataset": str(out / "PAMAP2_Dataset"), "subjects": ids, "files": len(ids),
            "rows": total, "rows_per_activity": rows_per_activity, "seed": seed}

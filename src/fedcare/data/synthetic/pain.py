"""Synthetic UNBC-McMaster cohort: procedurally drawn faces in the archive's exact on-disk layout.

``generate_pain_cohort(out)`` writes (reference/dataset-formats.md §1.2-1.9)::

    Images/<NNN>-<ii><NNN>/<seq>/<seq><FFF>.png                 colour PNG, FFF 1-based
    Frame_Labels/PSPI/<subj>/<seq>/<seq><FFF>_facs.txt         one number, "%15.7e"
    Frame_Labels/FACS/<subj>/<seq>/<seq><FFF>_facs.txt         "AU intensity" per active AU (may be empty)
    AAM_landmarks/<subj>/<seq>/<seq><FFF>_aam.txt              66 lines "x y" of the face as drawn
    Sequence_Labels/{AFF,OPR,SEN,VAS}/<subj>/<seq>.txt         one whole number each
    fedcare-synthetic.json                                     marker: these are NOT real patients

so the real loader reads it unchanged. Every frame is a face drawn from 66 landmarks whose
geometry follows the frame's action units: AU4 lowers and draws the brows together (glabella
furrows), AU6/AU7 raise the cheek and lower lid and narrow the eye (crow's feet), AU9/AU10
raise the nostrils and upper lip (nose wrinkles, nasolabial folds), AU43 closes the eyes.
PSPI = AU4 + max(AU6, AU7) + max(AU9, AU10) + AU43 is computed from the drawn AUs. AU12
(smile) and AU25/AU26 (lips part, jaw drop) are distractors, independent of pain.

What makes the task realistic rather than trivial:

* Intensity k moves landmarks by ``_UNIT * k**1.4`` times the subject's expressiveness:
  at intensity 1 a fraction of a pixel and no added texture, the same size as the
  frame-to-frame jitter of brows, lids, mouth and head pose and the sensor noise, so PSPI 1
  is hard to tell from 0, as in the real data. From intensity 2 on, furrows, wrinkles and
  crow's feet darken and the eyes clearly narrow.
* Subjects differ in face shape, eye spacing, brow height, skin and hair colour and
  expressiveness; sessions (sequences) differ in lighting, gradient light, colour cast,
  contrast, blur, sensor noise, background, clothes, scale, rotation and translation.
* Pain comes in smooth episodes (rise and fall over several frames) inside mostly neutral
  sequences; per-subject pain prevalence follows Tobis Table 3.1 and the Group 2 sessions
  follow Table 6.3 (session counts and the number of sessions with pain).

Everything is drawn from ``np.random.default_rng([seed, subject, stream])``: the same seed
gives byte-identical files, and a subject's frames do not depend on which other subjects
are generated.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from fedcare.data.synthetic.output import atomic_directory, check_output_dir
from fedcare.data.common import SYNTHETIC_MARKER, THESIS_GROUP1, THESIS_GROUP2

GENERATOR = "fedcare.data.synthetic.pain"
MARKER_FILE = SYNTHETIC_MARKER
NOTE = "SYNTHETIC data, not UNBC-McMaster"

# The 25 subject folders of the public archive, exactly as named (dataset-formats.md §1.3).
SUBJECT_FOLDERS: dict[int, str] = {
    int(name[:3]): name
    for name in (
        "042-ll042 043-jh043 047-jl047 048-aa048 049-bm049 052-dr052 059-fn059 064-ak064 "
        "066-mg066 080-bn080 092-ch092 095-tv095 096-bg096 097-gf097 101-mg101 103-jk103 "
        "106-nm106 107-hs107 108-th108 109-ib109 115-jy115 120-kz120 121-vw121 123-jh123 124-dn124"
    ).split()
}

# Tobis thesis §3 "Subject removal and groups": 101 has no pain and is dropped; fixed split.
GROUP1: tuple[int, ...] = THESIS_GROUP1  # pre-training
GROUP2: tuple[int, ...] = THESIS_GROUP2  # training and evaluation
DEFAULT_SUBJECTS: tuple[int, ...] = tuple(sorted(GROUP1 + GROUP2))

# Tobis thesis Table 3.1 / 6.1: frames per subject before augmentation, (no pain, pain).
# 101 is not in the table: 48,106 frames (thesis §3) minus the table's 45,289 = 2,817, no pain.
TABLE_3_1: dict[int, tuple[int, int]] = {
    42: (1895, 239), 47: (1544, 64), 49: (2194, 524), 66: (1947, 512), 95: (304, 498),
    97: (3212, 147), 103: (2738, 824), 106: (2281, 517), 108: (2453, 455), 121: (478, 40),
    123: (822, 361), 124: (699, 996),
    43: (1028, 92), 48: (798, 84), 52: (2503, 106), 59: (640, 133), 64: (1394, 155),
    80: (896, 1068), 92: (1031, 471), 96: (2175, 178), 107: (1599, 442), 109: (1724, 179),
    115: (1184, 99), 120: (1490, 76),
    101: (2817, 0),
}

# Tobis thesis Table 6.3 (Group 2): number of sessions per subject.
TABLE_6_3_SESSIONS: dict[int, int] = {
    43: 9, 48: 7, 52: 10, 59: 2, 64: 6, 80: 7, 92: 5, 96: 9, 107: 8, 109: 8, 115: 5, 120: 8,
}
# Tobis thesis Table 6.3: the non-empty per-session positives, in session order (these
# include the 4x augmentation, so each subject's sum is 4 x its Table 3.1 pain count).
TABLE_6_3_POSITIVES: dict[int, tuple[int, ...]] = {
    43: (140, 228), 48: (148, 188), 52: (72, 44, 120, 188), 59: (532,), 64: (244, 64, 64, 248),
    80: (1052, 536, 484, 484, 660, 792, 264), 92: (464, 696, 724), 96: (112, 512, 88),
    107: (32, 848, 60, 828), 109: (600, 116), 115: (60, 220, 56, 60), 120: (116, 188),
}
# Which session each of those positives belongs to. The table's column positions were lost
# in extraction, so this is a reconstruction that fits every fact the thesis text states:
# 80 has pain in sessions 0-6; session 7 has no positives; sessions 8 and 9 hold 3 and 1
# subjects (43, 52, 96 have more than 8 sessions, only 52 has 10); session 6 positives come
# from 52 (44), 80 (264) and 96 only; session 4 has 2,860 positives (80: 660, 107: 828,
# 92: 724, 96: 512, 52: 72, 64: 64); session 3 is little painful; 59's pain is in session 1.
GROUP2_PAIN_SESSIONS: dict[int, tuple[int, ...]] = {
    43: (0, 2), 48: (1, 5), 52: (4, 6, 8, 9), 59: (1,), 64: (0, 2, 4, 5),
    80: (0, 1, 2, 3, 4, 5, 6), 92: (1, 2, 4), 96: (1, 4, 6), 107: (0, 1, 2, 4),
    109: (2, 5), 115: (0, 1, 2, 3), 120: (1, 5),
}
# Thesis: "90% of session-5 positives are level 1" -> Group 2 pain in session 5 is mild.
GROUP2_MILD_SESSIONS: frozenset[int] = frozenset({5})

# Thesis §7 observations: "All of subject 48's positives are level 1"; "Subject 92's
# positives are all above 1". (lowest, highest) PSPI of a subject's pain frames.
SUBJECT_PSPI_RANGE: dict[int, tuple[int, int]] = {48: (1, 1), 92: (2, 16)}

# Group 1 and 101 are not broken down by session in the thesis: plausible session counts
# (2-9; subject 42 has the 8 sequences named in dataset-formats.md §1.4) and the sessions
# that carry its pain (invented, spread over early and late sessions).
OTHER_SESSIONS: dict[int, int] = {
    42: 8, 47: 7, 49: 9, 66: 8, 95: 4, 97: 9, 103: 9, 106: 8, 108: 9, 121: 3, 123: 6, 124: 7, 101: 5,
}
OTHER_PAIN_SESSIONS: dict[int, tuple[int, ...]] = {
    42: (0, 1, 4), 47: (2, 5), 49: (0, 1, 3, 6), 66: (0, 2, 3, 5, 7), 95: (0, 1, 2, 3), 97: (1, 4),
    103: (0, 2, 3, 5, 8), 106: (0, 1, 4, 6), 108: (1, 2, 5), 121: (1,), 123: (0, 2, 3, 4),
    124: (0, 1, 2, 3, 4, 5, 6), 101: (),
}

# Real sequence names (dataset-formats.md §1.4) kept where a subject has them.
KNOWN_SEQUENCES: dict[int, tuple[str, ...]] = {
    42: ("ll042t1aaaff", "ll042t1aaunaff", "ll042t1aeunaff", "ll042t1afaff", "ll042t1afunaff",
         "ll042t1aiaff", "ll042t1aiunaff", "ll042t2afaff"),
    43: ("jh043t1afaff",), 48: ("aa048t2aaunaff",), 59: ("fn059t2afunaff",), 95: ("tv095t2aeunaff",),
    97: ("gf097t2aiunaff",), 120: ("kz120t2afunaff",),
}
# The archive's pure-black frames: tv095t2aeunaff001..007 (dataset-formats.md §1.4).
BLACK_FRAMES_SUBJECT = 95
BLACK_FRAMES = 7

AU_CODES: tuple[int, ...] = (4, 6, 7, 9, 10, 12, 25, 26, 43)
_I4, _I6, _I7, _I9, _I10, _I12, _I25, _I26, _I43 = range(len(AU_CODES))
N_LANDMARKS = 66

_WRITERS = 4  # threads that encode PNGs and write files (both release the GIL)
_MAX_PENDING = 16  # sequences drawn but not yet written
_UNIT = 0.0042  # landmark displacement (fraction of the image) of an intensity-1 AU at gain 1
_SEQ_LABEL_RANGES = {"VAS": 10, "OPR": 5, "SEN": 15, "AFF": 15}


# --------------------------------------------------------------------------------------
# Cohort plan


@dataclass
class _SeqPlan:
    name: str
    session: int
    frames: int
    pain: int  # frames with PSPI >= 1
    mild: bool = False
    black: int = 0  # leading pure-black frames (quirks)


@dataclass
class _SubjectPlan:
    subject: int
    folder: str
    sequences: list[_SeqPlan] = field(default_factory=list)

    @property
    def frames(self) -> int:
        return sum(s.frames for s in self.sequences)


def sequence_names(subject: int) -> list[str]:
    """The 16 possible sequence names of a subject, in plain string-sort order."""
    stem = SUBJECT_FOLDERS[subject][4:]
    return sorted(f"{stem}t{t}a{m}{limb}" for t in "12" for m in "aefi" for limb in ("aff", "unaff"))


def _choose_names(subject: int, n: int, rng: np.random.Generator) -> list[str]:
    """n distinct names whose sorted order is the session order; real names are kept."""
    pool = sequence_names(subject)
    if n > len(pool):
        raise ValueError(f"subject {subject}: {n} sessions, but only {len(pool)} sequence names exist")
    known = list(KNOWN_SEQUENCES.get(subject, ()))[:n]
    if subject == BLACK_FRAMES_SUBJECT and known:
        pool = [p for p in pool if p <= known[-1]]  # keep the real black-frame sequence last
    rest = [p for p in pool if p not in known]
    chosen = known + [rest[i] for i in rng.choice(len(rest), size=n - len(known), replace=False)]
    return sorted(chosen)


def _largest_remainder(total: int, weights: np.ndarray) -> np.ndarray:
    weights = np.asarray(weights, dtype=float)
    if total <= 0 or weights.sum() <= 0:
        return np.zeros(len(weights), dtype=int)
    exact = total * weights / weights.sum()
    out = np.floor(exact).astype(int)
    order = np.argsort(-(exact - out), kind="stable")
    out[order[: total - out.sum()]] += 1
    return out


def _plan_subject(subject: int, seed: int, frame_scale: float, min_frames: int) -> _SubjectPlan:
    rng = np.random.default_rng([seed, subject, 0])
    no_pain, pain = TABLE_3_1[subject]
    if subject in TABLE_6_3_SESSIONS:
        n_sessions = TABLE_6_3_SESSIONS[subject]
        pain_sessions = GROUP2_PAIN_SESSIONS[subject]
        pain_weights = np.array(TABLE_6_3_POSITIVES[subject], dtype=float)
        mild = GROUP2_MILD_SESSIONS
    else:
        n_sessions = OTHER_SESSIONS[subject]
        pain_sessions = OTHER_PAIN_SESSIONS[subject]
        pain_weights = rng.gamma(2.0, 1.0, size=len(pain_sessions)) + 0.2
        mild = frozenset()
    names = _choose_names(subject, n_sessions, rng)

    # Pain frames: scaled Table 3.1 count, split over the pain sessions like Table 6.3,
    # at least one per pain session so the number of painful sessions is the table's.
    pain_per = np.zeros(n_sessions, dtype=int)
    if pain_sessions:
        n_pain = max(int(round(pain * frame_scale)), len(pain_sessions))
        share = _largest_remainder(n_pain - len(pain_sessions), pain_weights) + 1
        pain_per[list(pain_sessions)] = share
    # Neutral frames: each sequence needs min_frames, and a painful one starts and ends neutral
    # (at least 2 neutral frames, and no more than ~75% pain); the rest is spread at random.
    base = np.maximum(min_frames - pain_per, 0)
    base = np.maximum(base, np.where(pain_per > 0, np.maximum(2, np.ceil(pain_per / 3.0)), 0)).astype(int)
    total_no_pain = int(round(no_pain * frame_scale))
    spread = _largest_remainder(max(total_no_pain - int(base.sum()), 0), rng.uniform(0.4, 1.6, size=n_sessions))
    no_pain_per = base + spread

    plan = _SubjectPlan(subject, SUBJECT_FOLDERS[subject])
    for s, name in enumerate(names):
        plan.sequences.append(
            _SeqPlan(name, s, int(pain_per[s] + no_pain_per[s]), int(pain_per[s]), mild=s in mild)
        )
    return plan


# --------------------------------------------------------------------------------------
# Action units per frame


def _bump(n: int, peak: float, gamma: float = 1.0) -> np.ndarray:
    """A smooth rise-and-fall profile over n frames, > 0 everywhere, max 1 near `peak`."""
    x = (np.arange(n) + 0.5) / n
    rise = np.sin(0.5 * np.pi * np.clip(x / peak, 0, 1))
    fall = np.sin(0.5 * np.pi * np.clip((1 - x) / (1 - peak), 0, 1))
    return np.where(x < peak, rise, fall) ** gamma


def _split_positive(total: int, parts: int, rng: np.random.Generator) -> np.ndarray:
    """`parts` integers >= 1 summing to `total`."""
    return rng.multinomial(total - parts, rng.dirichlet(np.full(parts, 2.0))) + 1


def _decompose(pspi: int, recipe: dict) -> tuple[int, int, int, int]:
    """Split a PSPI level into (AU4, orbit, nose, AU43) following an episode's recipe."""
    au43 = 1 if (recipe["au43"] and pspi >= recipe["au43_from"]) else 0
    rest = min(pspi - au43, 15)
    w = np.array([recipe["r4"], recipe["r_orb"], recipe["r_nose"]])
    comp = np.floor(rest * w / w.sum()).astype(int)
    for i in recipe["priority"]:  # the remainder goes out in a fixed order: monotone in pspi
        if comp.sum() >= rest:
            break
        if w[i] > 0 or i == 1:
            comp[i] += 1
    while comp.sum() < rest:  # only when a weight is 0 and the others are full
        comp[int(np.argmin(comp))] += 1
    over = np.maximum(comp - 5, 0).sum()
    comp = np.minimum(comp, 5)
    for i in recipe["priority"]:
        add = min(over, 5 - comp[i])
        comp[i] += add
        over -= add
    return int(comp[0]), int(comp[1]), int(comp[2]), au43


def _pain_aus(length: int, n_pain: int, mild: bool, severity: float, rng: np.random.Generator,
              pspi_range: tuple[int, int] = (1, 16)) -> np.ndarray:
    """(length, 9) AU intensities with exactly n_pain frames of PSPI >= 1, in smooth episodes
    whose PSPI stays within `pspi_range`."""
    au = np.zeros((length, len(AU_CODES)), dtype=np.int64)
    if n_pain <= 0:
        return au
    zeros = length - n_pain
    k = min(n_pain, 1 + rng.poisson(n_pain / 18.0), 4)
    k = max(1, min(k, zeros))
    lengths = _split_positive(n_pain, k, rng)
    # gaps: k+1 runs of neutral frames; the sequence starts neutral and the k-1 inner gaps
    # are at least 1 frame long (when there are neutral frames at all)
    reserved = np.zeros(k + 1, int)
    if zeros > 0:
        reserved[:-1] = 1
    extra = zeros - int(reserved.sum())
    gaps = rng.multinomial(extra, rng.dirichlet(np.full(k + 1, 2.0))) if extra > 0 else np.zeros(k + 1, int)
    gaps += reserved
    pos = int(gaps[0])
    for e in range(k):
        n = int(lengths[e])
        amp = math.exp(rng.normal(1.05, 0.6)) * severity
        if mild:
            amp = min(amp, 1.0 + rng.uniform(0.0, 0.9))
        prof = _bump(n, rng.uniform(0.3, 0.7), rng.uniform(0.8, 1.5))
        levels = np.clip(np.round(amp * prof), pspi_range[0], pspi_range[1]).astype(int)
        r4 = rng.uniform(0.3, 0.9) if rng.random() < 0.6 else 0.0
        r_nose = rng.uniform(0.25, 0.8) if rng.random() < 0.55 else 0.0
        first = 1
        u = rng.random()
        if u < 0.18 and r4 > 0:
            first = 0
        elif u < 0.26 and r_nose > 0:
            first = 2
        priority = [first] + [i for i in np.argsort([-r4, -1.0, -r_nose]) if i != first]
        recipe = {"r4": r4, "r_orb": 1.0, "r_nose": r_nose, "priority": priority,
                  "au43": rng.random() < 0.35, "au43_from": int(rng.integers(4, 7))}
        six_dominant = rng.random() < 0.5
        orb_drop = int(rng.choice([0, 1, 1, 2, 9]))
        ten_dominant = rng.random() < 0.6
        nose_drop = int(rng.choice([0, 1, 2, 9]))
        for t in range(n):
            a4, orb, nose, a43 = _decompose(int(levels[t]), recipe)
            other_orb = max(0, orb - orb_drop)
            other_nose = max(0, nose - nose_drop)
            row = au[pos + t]
            row[_I4] = a4
            row[_I6], row[_I7] = (orb, other_orb) if six_dominant else (other_orb, orb)
            row[_I10], row[_I9] = (nose, other_nose) if ten_dominant else (other_nose, nose)
            row[_I43] = a43
        pos += n + int(gaps[e + 1])
    return au


def _distractor_aus(au: np.ndarray, rng: np.random.Generator) -> None:
    """AU12 (smile), AU25 (lips part) and AU26 (jaw drop) episodes, independent of pain."""
    length = au.shape[0]
    for _ in range(rng.poisson(length / 70.0 + 0.25)):
        n = int(rng.integers(4, 22))
        start = int(rng.integers(-n // 2, length))
        peak = rng.uniform(1.0, 4.4)
        seg = np.round(peak * _bump(n, rng.uniform(0.3, 0.7))).astype(int)
        lo, hi = max(start, 0), min(start + n, length)
        if hi > lo:
            au[lo:hi, _I12] = np.maximum(au[lo:hi, _I12], seg[lo - start : hi - start])
    for _ in range(rng.poisson(length / 45.0 + 0.3)):
        n = int(rng.integers(3, 16))
        start = int(rng.integers(-n // 2, length))
        peak = rng.uniform(1.0, 3.4)
        seg = np.round(peak * _bump(n, rng.uniform(0.3, 0.7))).astype(int)
        lo, hi = max(start, 0), min(start + n, length)
        if hi > lo:
            au[lo:hi, _I25] = np.maximum(au[lo:hi, _I25], seg[lo - start : hi - start])
            if rng.random() < 0.4:
                jaw = np.round(seg * rng.uniform(0.4, 0.8)).astype(int)
                au[lo:hi, _I26] = np.maximum(au[lo:hi, _I26], jaw[lo - start : hi - start])
    au[:, _I25] = np.maximum(au[:, _I25], np.minimum(au[:, _I26], 1))  # a dropped jaw parts the lips


def _ar1(length: int, dims: int, rho: float, rng: np.random.Generator) -> np.ndarray:
    """Unit-variance AR(1) noise, (length, dims): neighbouring frames are correlated."""
    z = rng.standard_normal((length, dims))
    out = np.empty_like(z)
    out[0] = z[0]
    c = math.sqrt(1 - rho * rho)
    for t in range(1, length):
        out[t] = rho * out[t - 1] + c * z[t]
    return out


# --------------------------------------------------------------------------------------
# Identity, session conditions and face geometry


def _identity(subject: int, seed: int) -> dict:
    rng = np.random.default_rng([seed, subject, 1])
    U = rng.uniform
    eye_y = U(0.42, 0.46)
    tone = U(0.0, 1.0)  # 0 dark .. 1 light skin
    lum = 95 + 140 * tone
    skin = np.array([lum * U(0.62, 0.74), lum * U(0.76, 0.86), min(255.0, lum * U(0.98, 1.05))])
    hair_kind = rng.choice(4, p=[0.45, 0.3, 0.15, 0.1])  # black, brown, blond, grey
    hair = np.array([[28, 30, 34], [35, 55, 85], [90, 150, 185], [150, 150, 155]], dtype=float)[hair_kind]
    hair = np.clip(hair * U(0.8, 1.2), 0, 255)
    nose_y = eye_y + U(0.13, 0.16)
    mouth_y = nose_y + U(0.072, 0.09)
    return {
        "fw": U(0.25, 0.30), "eye_y": eye_y, "jaw_top": eye_y + U(0.0, 0.035),
        "chin": max(eye_y + U(0.36, 0.41), mouth_y + 0.1), "jaw_n": U(2.0, 2.9), "taper": U(0.05, 0.25),
        "forehead": eye_y - U(0.27, 0.31),
        "eye_dx": U(0.100, 0.122), "eye_w": U(0.043, 0.054), "eye_h": U(0.017, 0.024),
        "brow_dy": U(0.05, 0.068), "brow_arch": U(0.006, 0.016), "brow_th": U(0.011, 0.018),
        "nose_y": nose_y, "nose_w": U(0.032, 0.045), "mouth_y": mouth_y, "mouth_w": U(0.068, 0.088),
        "lip_up": U(0.009, 0.014), "lip_lo": U(0.012, 0.019),
        "hairline": U(0.035, 0.09), "hair_dip": U(-0.01, 0.02), "hair_vol": U(0.008, 0.05),
        "hair_long": U(0.0, 0.3) if rng.random() < 0.35 else 0.0,
        "gain": U(0.75, 1.3), "asym": U(-0.004, 0.004),
        "skin": skin, "hair": hair, "brow": hair * 0.6 + skin * 0.1,
        "lip": np.clip(skin * np.array([0.72, 0.66, 0.95]), 0, 255),
        "iris": (np.array([U(20, 60), U(30, 70), U(35, 80)]) if rng.random() < 0.8  # brown / dark
                 else np.array([U(90, 130), U(80, 110), U(40, 70)])),  # blue-grey
        "pain_severity": U(0.8, 1.25),
    }


def _session(rng: np.random.Generator, size: int) -> dict:
    U = rng.uniform
    phi = U(0, 2 * np.pi)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / max(size - 1, 1) - 0.5
    light = 1.0 + U(0.0, 0.5) * (xx * math.cos(phi) + yy * math.sin(phi)) - U(0.0, 0.35) * (xx**2 + yy**2)
    return {
        "scale": U(0.9, 1.07), "rot": U(-6, 6), "tx": U(-0.035, 0.035), "ty": U(-0.03, 0.035), "yaw": U(-0.5, 0.5),
        "light": light[..., None].astype(np.float32),
        "cast": np.array([U(0.88, 1.1), U(0.93, 1.07), U(0.88, 1.1)], dtype=np.float32),
        "gain": U(0.72, 1.18), "contrast": U(0.75, 1.15), "noise": U(1.5, 5.5),
        "blur": U(0.0, 0.7) * size / 64.0,
        "bg": np.clip(rng.uniform(50, 210) * rng.uniform(0.85, 1.15, size=3), 0, 255),
        "clothes": rng.uniform(30, 220, size=3),
    }


def _ellipse(cx, cy, ax, ay, a0: float, a1: float, n: int) -> np.ndarray:
    """(F, n, 2) points on ellipses with per-frame centres/axes, angles a0..a1 (y down)."""
    t = np.linspace(a0, a1, n)
    cx, cy, ax, ay = (np.asarray(v, dtype=float).reshape(-1, 1) for v in (cx, cy, ax, ay))
    return np.stack([cx + ax * np.cos(t), cy + ay * np.sin(t)], axis=-1)


def _geometry(idn: dict, au: np.ndarray, jit: np.ndarray, sess: dict) -> tuple[np.ndarray, dict, dict]:
    """Landmarks (F, 66, 2), extra drawing polylines and per-frame wrinkle strengths, all in
    image-fraction coordinates after the head pose."""
    F = au.shape[0]
    g = idn["gain"]
    k = au.astype(float)
    fk = g * k ** 1.4
    a4, a6, a7, a9, a10, a12, a25, a26, a43 = (k[:, i] for i in range(9))
    f4, f6, f7, f9, f10, f12, _, f26 = (fk[:, i] for i in range(8))
    closed = a43 > 0
    u = _UNIT
    cx = 0.5
    # jitter columns: brow, eye opening (log), mouth corners, gaze, rot, tx, ty, scale, yaw, flicker
    j_brow, j_eye, j_mouth, j_gaze = jit[:, 0] * 0.8 * u, jit[:, 1] * 0.07, jit[:, 2] * 0.7 * u, jit[:, 3] * 0.35
    yaw = sess["yaw"] + 0.12 * jit[:, 8]
    fdx = yaw[:, None] * 0.022  # internal features shift with yaw (cheap 3-D look)

    lm = np.zeros((F, 66, 2))
    # --- jaw 0..16 (AU26 drops the chin)
    phi = np.linspace(0, np.pi, 17)
    c, s = np.cos(phi), np.sin(phi)
    n = idn["jaw_n"]
    jx = cx - idn["fw"] * np.sign(c) * np.abs(c) ** (2 / n) * (1 - idn["taper"] * s**6)
    jy = idn["jaw_top"] + (idn["chin"] - idn["jaw_top"]) * np.abs(s) ** (2 / n)
    drop = 1.8 * u * f26
    lm[:, 0:17, 0] = jx + 0.3 * fdx * s
    lm[:, 0:17, 1] = jy + drop[:, None] * s**2

    # --- brows 17..21 (image left, outer->inner), 22..26 (inner->outer)
    ew, eh, edx, ey = idn["eye_w"], idn["eye_h"], idn["eye_dx"], idn["eye_y"]
    sidx = np.linspace(0, 1, 5)  # 0 outer, 1 inner
    bx = -(edx + 1.15 * ew) + sidx * 2.05 * ew  # offset from cx for the left-image brow
    by = ey - idn["brow_dy"] - idn["brow_arch"] * np.sin(np.pi * (0.15 + 0.75 * (1 - sidx)))
    inner_w = 0.35 + 0.65 * sidx
    down = (1.3 * u * f4)[:, None] * inner_w + (0.45 * u * f9)[:, None] * sidx + (0.35 * u * f6)[:, None] * (1 - sidx)
    inward = (0.9 * u * f4)[:, None] * inner_w
    brow_y = by + down + j_brow[:, None]
    lm[:, 17:22, 0] = cx + bx + inward + fdx
    lm[:, 17:22, 1] = brow_y + idn["asym"]
    lm[:, 22:27, 0] = cx - (bx + inward)[:, ::-1] + fdx
    lm[:, 22:27, 1] = brow_y[:, ::-1] - idn["asym"]

    # --- eyes: lids as curves y = centre -/+ h * (1 - q^2)^0.8, q in [-1, 1]
    h_lo_f = 1 - np.minimum(0.85, 0.085 * f6 + 0.11 * f7)
    h_up_f = (1 - np.minimum(0.5, 0.02 * f6 + 0.05 * f7)) * np.exp(j_eye)
    h_up = np.where(closed, 0.05 * eh, 1.05 * eh * h_up_f)
    h_lo = np.where(closed, 0.05 * eh, 0.85 * eh * h_lo_f)
    ecy = ey - (0.5 * u * f6 + 0.6 * u * f7) * 0.5 + np.where(closed, 0.35 * eh, 0.0)
    eyes = {}
    for side, sign in (("r", -1), ("l", 1)):
        ex = cx + sign * edx + fdx[:, 0]
        q = np.linspace(-1, 1, 9)
        shape = (1 - q**2) ** 0.8
        xs = ex[:, None] + q * ew
        upper = ecy[:, None] - h_up[:, None] * shape
        lower = ecy[:, None] + h_lo[:, None] * shape
        eyes[side] = (ex, xs, upper, lower)
        # iris clipped to the lids (analytically, so it works for all frames at once)
        ang = np.linspace(0, 2 * np.pi, 14, endpoint=False)
        r = 0.95 * eh
        ix = ex[:, None] + j_gaze[:, None] * ew * 0.5 + r * np.cos(ang)
        iy = (ecy - 0.1 * eh)[:, None] + r * np.sin(ang)
        qi = np.clip((ix - ex[:, None]) / ew, -0.97, 0.97)
        sh = (1 - qi**2) ** 0.8
        iy = np.clip(iy, ecy[:, None] - h_up[:, None] * sh, ecy[:, None] + h_lo[:, None] * sh)
        ix = ex[:, None] + qi * ew
        eyes[side + "_iris"] = np.stack([ix, iy], -1)
        eyes[side + "_poly"] = np.concatenate(
            [np.stack([xs, upper], -1), np.stack([xs[:, ::-1], lower[:, ::-1]], -1)[:, 1:-1]], axis=1
        )
    # landmark order per eye: outer corner, upper x2, inner corner, lower x2 (clockwise)
    ex_r, xs_r, up_r, lo_r = eyes["r"]
    ex_l, xs_l, up_l, lo_l = eyes["l"]
    # right (image left) eye: 36 outer(q=-1), 37 (q=-.35), 38 (q=.35), 39 inner(q=1), 40, 41
    qi_sel = [0, 3, 5, 8]  # indices into q = linspace(-1, 1, 9): -1, -0.25, 0.25, 1
    lm[:, 36:40, 0], lm[:, 36:40, 1] = xs_r[:, qi_sel], up_r[:, qi_sel]
    lm[:, 40, :] = np.stack([xs_r[:, 5], lo_r[:, 5]], -1)
    lm[:, 41, :] = np.stack([xs_r[:, 3], lo_r[:, 3]], -1)
    # left eye: 42 inner (q=-1), 43, 44 upper, 45 outer (q=1), 46, 47 lower
    lm[:, 42:46, 0], lm[:, 42:46, 1] = xs_l[:, qi_sel], up_l[:, qi_sel]
    lm[:, 46, :] = np.stack([xs_l[:, 5], lo_l[:, 5]], -1)
    lm[:, 47, :] = np.stack([xs_l[:, 3], lo_l[:, 3]], -1)

    # --- nose 27..30 bridge, 31..35 base (AU9 lifts and flares the wings, AU10 a little)
    ny, nw = idn["nose_y"], idn["nose_w"]
    ndx = yaw[:, None] * 0.035
    lm[:, 27:31, 0] = cx + fdx + np.linspace(0, 1, 4) * (ndx - fdx)
    lm[:, 27:31, 1] = np.linspace(ey - 0.004, ny, 4)
    wing_up = 1.2 * u * f9 + 0.45 * u * f10
    base_x = np.array([-1.0, -0.5, 0.0, 0.5, 1.0]) * nw
    base_y = ny + np.array([0.004, 0.016, 0.021, 0.016, 0.004])
    flare = (0.25 * u * f9)[:, None] * np.sign(base_x)
    lm[:, 31:36, 0] = cx + base_x + flare + ndx
    lm[:, 31:36, 1] = base_y - (wing_up[:, None] * np.array([1, 0.8, 0.45, 0.8, 1]))

    # --- mouth 48..59 outer lip, 60..65 inner lip
    my, mw = idn["mouth_y"], idn["mouth_w"]
    corner_up = 1.6 * u * f12 + j_mouth + 0.2 * u * f10
    corner_out = 0.8 * u * f12
    lip_raise = 1.3 * u * f10  # AU10 lifts the upper lip, most at the centre
    gap = np.where(a25 > 0, 0.003 + 0.0035 * a25, 0.0) + 1.6 * u * f26 + np.where(a10 >= 3, 0.6 * u * f10, 0.0)
    lower_drop = gap * 0.75 + drop * 0.9
    upper_lift = gap * 0.25
    ox = np.array([-1, -0.62, -0.28, 0, 0.28, 0.62, 1, 0.6, 0.3, 0, -0.3, -0.6])
    oy_closed = np.array([0, -0.8, -1.1, -0.9, -1.1, -0.8, 0, 0.85, 1.0, 1.05, 1.0, 0.85])
    centre_w = 1 - np.abs(ox)  # 1 at the centre, 0 at the corners
    is_upper = np.array([0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0], bool)
    is_lower = np.array([0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1], bool)
    outer_x = cx + ox * mw + np.sign(ox) * corner_out[:, None] * np.abs(ox) ** 2 + fdx
    outer_y = my + np.where(is_upper, oy_closed * idn["lip_up"], oy_closed * idn["lip_lo"])[None, :].repeat(F, 0)
    outer_y = outer_y - corner_up[:, None] * (1 - centre_w) ** 2
    outer_y = outer_y - np.where(is_upper, (lip_raise + upper_lift)[:, None] * (0.5 + 0.5 * centre_w), 0.0)
    outer_y = outer_y + np.where(is_lower, lower_drop[:, None] * (0.4 + 0.6 * centre_w), 0.0)
    lm[:, 48:60, 0], lm[:, 48:60, 1] = outer_x, outer_y
    ix_ = np.array([-0.45, 0, 0.45, 0.45, 0, -0.45])
    iw = 1 - np.abs(ix_)
    inner_up = np.array([1, 1, 1, 0, 0, 0], bool)
    inner_x = cx + ix_ * mw + np.sign(ix_) * corner_out[:, None] * 0.4 + fdx
    inner_y = my - corner_up[:, None] * 0.3 + np.zeros(6)  # (F, 6)
    inner_y = inner_y + np.where(inner_up, -(upper_lift + 0.8 * lip_raise * (a10 >= 3))[:, None] * (0.5 + 0.5 * iw),
                                 lower_drop[:, None] * (0.4 + 0.6 * iw))
    lm[:, 60:66, 0], lm[:, 60:66, 1] = inner_x, inner_y

    # --- extra polylines/polygons for drawing
    H = idn["jaw_top"] - idn["forehead"]
    fw = idn["fw"]
    extra: dict[str, np.ndarray] = {}
    ones = np.ones(F)
    # face outline: jaw + forehead arc
    arc = _ellipse(cx * ones, idn["jaw_top"] * ones, fw * ones, H * ones, np.pi * 1.0, np.pi * 2.0, 11)[:, 1:-1]
    extra["face"] = np.concatenate([lm[:, 0:17], arc[:, ::-1]], axis=1)
    hv = idn["hair_vol"]
    extra["hair_back"] = _ellipse(cx * ones, (idn["forehead"] + 0.17 + idn["hair_long"] * 0.5) * ones,
                                  (fw + hv) * ones, (0.17 + hv + idn["hair_long"] * 0.5) * ones, 0, 2 * np.pi, 20)
    cap = _ellipse(cx * ones, idn["jaw_top"] * ones, (fw + 0.012) * ones, (H + 0.012) * ones,
                   np.pi + 0.18, 2 * np.pi - 0.18, 13)
    hl = idn["forehead"] + idn["hairline"]
    line_x = cx + fw * np.array([0.93, 0.75, 0.35, 0.0, -0.35, -0.75, -0.93])
    line_y = hl + np.array([0.09, 0.035, idn["hair_dip"] * 0.5, idn["hair_dip"], idn["hair_dip"] * 0.5, 0.035, 0.09])
    extra["hair_cap"] = np.concatenate([cap, np.broadcast_to(np.stack([line_x, line_y], -1), (F, 7, 2))], axis=1)
    extra["ears"] = np.concatenate([
        _ellipse((cx - fw + 0.005) * ones, (ey + 0.045) * ones, 0.028 * ones, 0.055 * ones, 0, 2 * np.pi, 10),
        _ellipse((cx + fw - 0.005) * ones, (ey + 0.045) * ones, 0.028 * ones, 0.055 * ones, 0, 2 * np.pi, 10),
    ], axis=1)
    neck_top = idn["chin"] - 0.08
    neck = [[cx - 0.55 * fw, neck_top], [cx + 0.55 * fw, neck_top], [cx + 0.62 * fw, 1.1], [cx - 0.62 * fw, 1.1]]
    extra["neck"] = np.broadcast_to(np.array(neck), (F, 4, 2))
    extra["shoulders"] = _ellipse(cx * ones, (idn["chin"] + 0.33) * ones, 0.55 * ones, 0.26 * ones,
                                  np.pi, 2 * np.pi, 13)
    # cheek highlights, raised by AU6 (and a little by AU12)
    cheek_up = 1.6 * u * f6 + 0.5 * u * f12 + 0.4 * u * f7
    cheeks = []
    for sign in (-1, 1):
        cheeks.append(_ellipse(cx + sign * (edx + 0.01) + fdx[:, 0], ey + 0.075 - cheek_up,
                               0.045 * ones, 0.026 * ones, 0, 2 * np.pi, 10))
    extra["cheeks"] = np.concatenate(cheeks, axis=1)
    # lower-lid bags: a line under each eye that follows the lower lid
    bag = []
    for side in ("r", "l"):
        ex, xs, up, lo = eyes[side]
        bag.append(np.stack([xs[:, 1:8], lo[:, 1:8] + 0.011 * (1 - 0.25 * np.minimum(f6, 4))[:, None]], -1))
    extra["bags"] = np.stack(bag, 1)  # (F, 2, 7, 2)
    # nasolabial folds: nose wing -> past the mouth corner, pulled up by AU10/AU12/AU9
    fold_up = 1.0 * u * f10 + 1.0 * u * f12 + 0.5 * u * f9
    folds = []
    for sign in (-1, 1):
        p0 = np.stack([cx + sign * (nw + 0.01) + ndx[:, 0], ny - 0.004 - wing_up], -1)
        p1 = np.stack([cx + sign * (nw + 0.03) + fdx[:, 0], my - 0.02 - 0.5 * fold_up], -1)
        p2 = np.stack([cx + sign * (mw + 0.018) + fdx[:, 0], my + 0.03 - 0.7 * fold_up], -1)
        folds.append(np.stack([p0, p1, p2], 1))
    extra["folds"] = np.stack(folds, 1)  # (F, 2, 3, 2)
    # glabella furrows (AU4): two short vertical lines between the inner brows
    gl = []
    top = (lm[:, 21, 1] + lm[:, 22, 1]) / 2 - 0.004
    for sign in (-1, 1):
        x = cx + sign * 0.011 + fdx[:, 0]
        gl.append(np.stack([np.stack([x, top], -1), np.stack([x - sign * 0.002, top + 0.032], -1)], 1))
    extra["glabella"] = np.stack(gl, 1)  # (F, 2, 2, 2)
    # nose-bridge wrinkles (AU9): three short horizontal lines across the bridge
    nz = []
    for i, dy in enumerate((0.015, 0.027, 0.039)):
        y = ey + dy - 0.3 * u * f9
        half = nw * (0.45 + 0.1 * i)
        x0 = cx + fdx[:, 0] + (ndx[:, 0] - fdx[:, 0]) * (dy / (ny - ey))
        xs3, ys3 = (x0 - half, x0, x0 + half), (y + 0.002, y - 0.002, y + 0.002)  # a flat "^"
        nz.append(np.stack([np.stack([a, b], -1) for a, b in zip(xs3, ys3)], 1))
    extra["nose_wrinkles"] = np.stack(nz, 1)  # (F, 3, 3, 2)
    # crow's feet (AU6/AU7): three short lines fanning out from each outer eye corner
    cf = []
    for corner, sign in ((36, -1), (45, 1)):
        base = lm[:, corner]
        for dy in (-0.012, 0.0, 0.012):
            p0 = base + np.array([sign * 0.008, dy * 0.5])
            p1 = base + np.array([sign * 0.024, dy * 1.3])
            cf.append(np.stack([p0, p1], 1))
    extra["crows"] = np.stack(cf, 1)  # (F, 6, 2, 2)
    extra["eye_r"], extra["eye_l"] = eyes["r_poly"], eyes["l_poly"]
    extra["iris_r"], extra["iris_l"] = eyes["r_iris"], eyes["l_iris"]
    extra["lid_r"] = np.stack([xs_r, up_r], -1)
    extra["lid_l"] = np.stack([xs_l, up_l], -1)
    extra["lower_r"] = np.stack([xs_r, lo_r], -1)
    extra["lower_l"] = np.stack([xs_l, lo_l], -1)

    # wrinkle and fold darkness: none added at intensity 1, clearly visible from 2-3 on
    strength = {
        "glabella": np.clip(0.16 * np.maximum(a4 - 1, 0), 0, 0.6) * min(g, 1.2),
        "nose_wrinkles": np.clip(0.16 * np.maximum(a9 - 1, 0), 0, 0.6),
        "crows": np.clip(0.13 * np.maximum(a6 - 1, 0) + 0.08 * np.maximum(a7 - 1, 0), 0, 0.6),
        "folds": np.clip(0.05 + 0.07 * np.maximum(a10 - 1, 0) + 0.05 * np.maximum(a12 - 1, 0)
                         + 0.03 * np.maximum(a9 - 1, 0), 0, 0.5),
        "bags": np.clip(0.07 + 0.06 * np.maximum(np.maximum(a6, a7) - 1, 0), 0, 0.45),
        "teeth": (gap > 0.009) & ((a10 >= 3) | (a25 >= 2) | (a26 >= 1)),
        "open": gap > 0.0025,
        "closed": closed,
    }

    # --- head pose (session + per-frame jitter): similarity about the face centre
    pivot = np.array([0.5, 0.55])
    scale = sess["scale"] * (1 + 0.012 * jit[:, 7])
    rot = np.deg2rad(sess["rot"] + 1.3 * jit[:, 4])
    tx = sess["tx"] + 0.006 * jit[:, 5]
    ty = sess["ty"] + 0.006 * jit[:, 6]
    cr, sr = np.cos(rot) * scale, np.sin(rot) * scale
    M = np.stack([np.stack([cr, -sr], -1), np.stack([sr, cr], -1)], 1)  # (F, 2, 2)
    shift = pivot + np.stack([tx, ty], -1)

    # one transform for every point of every frame
    parts = [lm] + list(extra.values())
    flat = np.concatenate([p.reshape(F, -1, 2) for p in parts], axis=1) - pivot
    moved = np.einsum("fij,fnj->fni", M, flat) + shift[:, None, :]
    out, start = [], 0
    for p in parts:
        n = p[0].size // 2
        out.append(moved[:, start : start + n].reshape(p.shape))
        start += n
    return out[0], dict(zip(extra.keys(), out[1:])), strength


# --------------------------------------------------------------------------------------
# Drawing


def _mix(a: np.ndarray, b: np.ndarray, t: float) -> tuple[float, float, float]:
    """The colour a*(1-t) + b*t as an OpenCV colour tuple (blending over flat skin = alpha)."""
    c = a * (1 - t) + b * t
    return (float(c[0]), float(c[1]), float(c[2]))


def _colour(a: np.ndarray) -> tuple[float, float, float]:
    return (float(a[0]), float(a[1]), float(a[2]))


def _render_sequence(idn: dict, sess: dict, lm: np.ndarray, extra: dict, st: dict, size: int,
                     flicker: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    F = lm.shape[0]
    k16 = size * 16.0
    P = {k_: np.round(v * k16).astype(np.int32) for k_, v in extra.items()}
    L = np.round(lm * k16).astype(np.int32)
    AA, SH = cv2.LINE_AA, 4
    skin, hair, brow, lip = idn["skin"], idn["hair"], idn["brow"], idn["lip"]
    shadow = skin * 0.42
    bg = np.empty((size, size, 3), np.uint8)
    bg[:] = np.clip(sess["bg"], 0, 255).astype(np.uint8)
    skin_c = _colour(skin)
    ear_c = _mix(skin, shadow, 0.12)
    neck_c = _mix(skin, shadow, 0.22)
    hair_c, brow_c, lip_c = _colour(hair), _colour(brow), _colour(lip)
    cheek_c = _mix(skin, np.minimum(skin * 1.12 + 8, 255), 0.35)
    sclera_c = _mix(np.array([215.0, 222, 228]), skin, 0.35)
    iris_c = _colour(idn["iris"])
    lash_c = _mix(brow, np.zeros(3), 0.5)
    mouth_c = (35.0, 30.0, 45.0)
    teeth_c = (200.0, 215.0, 225.0)
    clothes_c = _colour(sess["clothes"])
    shade = {key: (skin[None, :] * (1 - st[key][:, None]) + shadow[None, :] * st[key][:, None]).tolist()
             for key in ("bags", "folds", "nose_wrinkles", "glabella", "crows")}
    shade = {key: [tuple(c) for c in v] for key, v in shade.items()}
    nose_c, nostril_c, lower_c = _mix(skin, shadow, 0.12), _mix(skin, shadow, 0.45), _mix(skin, shadow, 0.35)
    lipline_c = _mix(lip, np.zeros(3), 0.45)
    th = idn["brow_th"] * k16
    taper = np.array([0.55, 0.8, 1.0, 1.0, 0.9])
    brow_off = {17: np.stack([np.zeros(5), th * 0.5 * taper], -1),  # half-thickness per brow point
                22: np.stack([np.zeros(5), th * 0.5 * taper[::-1]], -1)}
    frames = np.empty((F, size, size, 3), np.uint8)
    for f in range(F):
        img = bg.copy()
        cv2.fillPoly(img, [P["hair_back"][f]], hair_c, AA, SH)
        cv2.fillPoly(img, [P["shoulders"][f]], clothes_c, AA, SH)
        cv2.fillPoly(img, [P["neck"][f]], neck_c, AA, SH)
        ears = P["ears"][f]
        cv2.fillPoly(img, [ears[:10], ears[10:]], ear_c, AA, SH)
        cv2.fillPoly(img, [P["face"][f]], skin_c, AA, SH)
        cv2.fillPoly(img, [P["hair_cap"][f]], hair_c, AA, SH)
        ch = P["cheeks"][f]
        cv2.fillPoly(img, [ch[:10], ch[10:]], cheek_c, AA, SH)
        cv2.polylines(img, list(P["bags"][f]), False, shade["bags"][f], 1, AA, SH)
        cv2.polylines(img, list(P["folds"][f]), False, shade["folds"][f], 1, AA, SH)
        if st["nose_wrinkles"][f] > 0:
            cv2.polylines(img, list(P["nose_wrinkles"][f]), False, shade["nose_wrinkles"][f], 1, AA, SH)
        if st["glabella"][f] > 0:
            cv2.polylines(img, list(P["glabella"][f]), False, shade["glabella"][f], 1, AA, SH)
        # nose: side shadow and nostrils
        cv2.polylines(img, [L[f, 27:31]], False, nose_c, 1, AA, SH)
        cv2.polylines(img, [L[f, 31:36]], False, nostril_c, 1, AA, SH)
        # brows as filled tapered polygons
        brows = []
        for i0, off in brow_off.items():
            b = L[f, i0 : i0 + 5]
            brows.append(np.round(np.concatenate([b - off, (b + off)[::-1]])).astype(np.int32))
        cv2.fillPoly(img, brows, brow_c, AA, SH)
        # eyes
        if st["closed"][f]:
            cv2.polylines(img, [P["lid_r"][f], P["lid_l"][f]], False, lash_c, 1, AA, SH)
        else:
            cv2.fillPoly(img, [P["eye_r"][f], P["eye_l"][f]], sclera_c, AA, SH)
            cv2.fillPoly(img, [P["iris_r"][f], P["iris_l"][f]], iris_c, AA, SH)
            cv2.polylines(img, [P["lid_r"][f], P["lid_l"][f]], False, lash_c, 1, AA, SH)
            cv2.polylines(img, [P["lower_r"][f], P["lower_l"][f]], False, lower_c, 1, AA, SH)
        if st["crows"][f] > 0:
            cv2.polylines(img, list(P["crows"][f]), False, shade["crows"][f], 1, AA, SH)
        # mouth
        cv2.fillPoly(img, [L[f, 48:60]], lip_c, AA, SH)
        if st["open"][f]:
            inner = np.concatenate([L[f, 48:49], L[f, 60:63], L[f, 54:55], L[f, 63:66]])
            cv2.fillPoly(img, [inner], mouth_c, AA, SH)
            if st["teeth"][f]:
                upper = L[f, 60:63].astype(np.float64)
                drop = (L[f, 64] - L[f, 61]) * 0.45
                tooth = np.concatenate([upper, (upper + drop)[::-1]])
                cv2.fillPoly(img, [np.round(tooth).astype(np.int32)], teeth_c, AA, SH)
        else:
            line = np.concatenate([L[f, 48:49], L[f, 60:63], L[f, 54:55]])
            cv2.polylines(img, [line], False, lipline_c, 1, AA, SH)
        frames[f] = img
    # photometry, all frames at once: light gradient, colour cast, gain, contrast, noise, blur
    x = frames.astype(np.float32)
    x *= sess["light"][None] * sess["cast"][None, None, None, :]
    x *= (sess["gain"] * (1 + 0.015 * flicker)).astype(np.float32)[:, None, None, None]
    x = (x - 128.0) * sess["contrast"] + 128.0
    # sensor noise: triangular (sum of two uniform bytes), sd = sess["noise"]; bytes are fast
    raw = np.frombuffer(rng.bytes(2 * x.size), np.uint8).reshape((2,) + x.shape)
    x += (raw[0].astype(np.float32) + raw[1] - 255.0) * np.float32(sess["noise"] / 104.1)
    out = np.clip(np.round(x), 0, 255).astype(np.uint8)
    if sess["blur"] > 0.25:
        for f in range(F):
            out[f] = cv2.GaussianBlur(out[f], (0, 0), sess["blur"])
    return out


# --------------------------------------------------------------------------------------
# Writing


def _fmt(v: float) -> str:
    return f"{v:15.7e}\n"


def _write(path: str | Path, text: str) -> None:
    with open(path, "wb") as fh:
        fh.write(text.encode("ascii"))


def _write_png(path: str | Path, image: np.ndarray) -> None:
    ok, buf = cv2.imencode(".png", image)
    if not ok:  # pragma: no cover - cv2 failure
        raise OSError(f"{path}: PNG encoding failed")
    with open(path, "wb") as fh:
        fh.write(buf.tobytes())


def _sequence_labels(pspi: np.ndarray, name: str, subject_bias: float, rng: np.random.Generator) -> dict[str, int]:
    """Whole-number sequence ratings that follow the sequence's pain (VAS 0-10, OPR 0-5, SEN/AFF 0-15)."""
    frac = float((pspi >= 1).mean()) if len(pspi) else 0.0
    peak = float(pspi.max()) if len(pspi) else 0.0
    pain = min(1.0, 0.55 * frac / 0.5 + 0.45 * min(peak, 8) / 8)  # 0..1
    limb = 0.0 if name.endswith("unaff") else 0.08
    base = np.clip(pain + limb + subject_bias + rng.normal(0, 0.06, size=4), 0, 1)
    return {
        "VAS": int(round(base[0] * 10)),
        "OPR": int(round(np.clip(pain + rng.normal(0, 0.08), 0, 1) * 5)),
        "SEN": int(round(base[2] * 15)),
        "AFF": int(round(base[3] * 15 * 0.85)),
    }


def _check_subjects(subjects: Sequence[int] | None) -> list[int]:
    if subjects is None:
        return list(DEFAULT_SUBJECTS)
    if isinstance(subjects, (str, bytes)) or not isinstance(subjects, Sequence):
        raise ValueError(f"subjects must be a sequence of subject numbers, got {subjects!r}")
    out = []
    for s in subjects:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise ValueError(f"subject {s!r} is not a subject number (known: {sorted(SUBJECT_FOLDERS)})")
        if int(s) not in SUBJECT_FOLDERS:
            raise ValueError(f"unknown UNBC-McMaster subject {s} (known: {sorted(SUBJECT_FOLDERS)})")
        out.append(int(s))
    if not out:
        raise ValueError("subjects is empty: give at least one subject number")
    return sorted(set(out))


def _plan(subjects: list[int], seed: int, frame_scale: float, min_frames: int, quirks: bool) -> list[_SubjectPlan]:
    plans = [_plan_subject(s, seed, frame_scale, min_frames) for s in subjects]
    if quirks:
        target = next((p for p in plans if p.subject == BLACK_FRAMES_SUBJECT), plans[0])
        last = target.sequences[-1]
        last.black = BLACK_FRAMES
        last.frames = max(last.frames, BLACK_FRAMES + last.pain + (2 if last.pain else 1))
    return plans


def _generate_subject(root: Path, plan: _SubjectPlan, seed: int, size: int, submit: Callable[..., None],
                      pspi_counts: dict[int, int]) -> None:
    """Draw the subject's sequences and write their sequence labels; hands each sequence's
    frames to `submit(_write_frames, ...)`."""
    idn = _identity(plan.subject, seed)
    folder = plan.folder
    bias_rng = np.random.default_rng([seed, plan.subject, 2])
    subject_bias = bias_rng.uniform(-0.08, 0.12)
    for sp in plan.sequences:
        rng = np.random.default_rng([seed, plan.subject, 100 + sp.session])
        sess = _session(rng, size)
        severity = idn["pain_severity"] * rng.uniform(0.85, 1.15)
        au = np.zeros((sp.frames, len(AU_CODES)), dtype=np.int64)
        au[sp.black :] = _pain_aus(sp.frames - sp.black, sp.pain, sp.mild, severity, rng,
                                   SUBJECT_PSPI_RANGE.get(plan.subject, (1, 16)))
        _distractor_aus(au, rng)
        if sp.black:
            au[: sp.black] = 0  # the black frames carry no expression
        jit = _ar1(sp.frames, 10, 0.85, rng)
        lm, extra, st = _geometry(idn, au, jit, sess)
        images = _render_sequence(idn, sess, lm, extra, st, size, jit[:, 9], rng)
        if sp.black:
            images[: sp.black] = 0
        pspi = au[:, _I4] + np.maximum(au[:, _I6], au[:, _I7]) + np.maximum(au[:, _I9], au[:, _I10]) + au[:, _I43]

        seq = sp.name
        dirs = {
            "img": root / "Images" / folder / seq,
            "pspi": root / "Frame_Labels" / "PSPI" / folder / seq,
            "facs": root / "Frame_Labels" / "FACS" / folder / seq,
            "aam": root / "AAM_landmarks" / folder / seq,
        }
        for d in dirs.values():
            d.mkdir(parents=True)
        for p, n in zip(*np.unique(pspi, return_counts=True)):
            pspi_counts[int(p)] = pspi_counts.get(int(p), 0) + int(n)
        labels_dir = {key: root / "Sequence_Labels" / key / folder for key in _SEQ_LABEL_RANGES}
        for key, value in _sequence_labels(pspi, seq, subject_bias, rng).items():
            labels_dir[key].mkdir(parents=True, exist_ok=True)
            _write(labels_dir[key] / f"{seq}.txt", _fmt(float(value)))
        submit(_write_frames, seq, [str(d) + os.sep for d in dirs.values()], images, pspi, au, lm * size)


def _write_frames(seq: str, dirs: list[str], images: np.ndarray, pspi: np.ndarray, au: np.ndarray,
                  lm_px: np.ndarray) -> int:
    """Write one sequence's PNGs and frame label files; returns the number of frames."""
    img_dir, pspi_dir, facs_dir, aam_dir = dirs
    aam_fmt = "%15.7e%15.7e\n" * N_LANDMARKS
    lm_list = lm_px.reshape(len(images), -1).tolist()
    au_list = au.tolist()
    for f in range(len(images)):
        stem = f"{seq}{f + 1:03d}"
        _write_png(img_dir + stem + ".png", images[f])
        _write(pspi_dir + stem + "_facs.txt", _fmt(float(pspi[f])))
        _write(facs_dir + stem + "_facs.txt",
               "".join(f"{code:15.7e}{float(v):15.7e}\n" for code, v in zip(AU_CODES, au_list[f]) if v > 0))
        _write(aam_dir + stem + "_aam.txt", aam_fmt % tuple(lm_list[f]))
    return len(images)


def generate_pain_cohort(
    out: Path,
    *,
    seed: int = 0,
    subjects: Sequence[int] | None = None,
    frame_scale: float = 0.05,
    image_size: int = 64,
    min_frames_per_sequence: int = 8,
    quirks: bool = False,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Write a synthetic cohort in the UNBC-McMaster layout into `out` and return a summary
    {"root", "subjects", "sequences", "frames", "pain_frames" (PSPI >= 1), "pspi_histogram"}.

    The default cohort is the thesis's 24 subjects (all but 101) with Table 3.1 pain
    prevalence and, for Group 2, Table 6.3 sessions; `frame_scale` scales the real frame
    counts (each sequence keeps at least `min_frames_per_sequence` frames). `quirks` also
    writes the archive's pure-black frames (first 7 frames of subject 95's last sequence,
    or of the first subject's if 95 is not generated). The cohort is built in a temporary
    sibling directory and renamed into place, so a failure leaves nothing at `out`.
    Raises FileExistsError if `out` exists and is not empty (unless `overwrite`)."""
    out = Path(out)
    subj = _check_subjects(subjects)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if not (isinstance(frame_scale, (int, float)) and math.isfinite(frame_scale) and frame_scale > 0):
        raise ValueError(f"frame_scale must be a positive number, got {frame_scale!r}")
    if isinstance(image_size, bool) or not isinstance(image_size, (int, np.integer)) or image_size < 16:
        raise ValueError(f"image_size must be an integer >= 16, got {image_size!r}")
    if isinstance(min_frames_per_sequence, bool) or not isinstance(min_frames_per_sequence, (int, np.integer)) \
            or min_frames_per_sequence < 1:
        raise ValueError(f"min_frames_per_sequence must be an integer >= 1, got {min_frames_per_sequence!r}")
    seed, image_size, min_frames_per_sequence = int(seed), int(image_size), int(min_frames_per_sequence)
    check_output_dir(out, overwrite)

    plans = _plan(subj, seed, float(frame_scale), min_frames_per_sequence, bool(quirks))
    total = sum(p.frames for p in plans)
    done = 0
    pending: deque[Future] = deque()

    def collect(block: bool) -> None:
        nonlocal done
        while pending and (block or pending[0].done() or len(pending) > _MAX_PENDING):
            done += pending.popleft().result()
            if progress is not None:
                progress(done, total)

    pspi_counts: dict[int, int] = {}
    with atomic_directory(out, overwrite) as tmp:
        pool = ThreadPoolExecutor(max_workers=_WRITERS, thread_name_prefix="fedcare-synth")

        def submit(fn: Callable[..., int], *args) -> None:
            pending.append(pool.submit(fn, *args))
            collect(block=False)

        try:
            if progress is not None:
                progress(0, total)
            for plan in plans:
                _generate_subject(tmp, plan, seed, image_size, submit, pspi_counts)
            collect(block=True)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # no writer may still touch tmp
        options = {"subjects": subj, "frame_scale": float(frame_scale), "image_size": image_size,
                   "min_frames_per_sequence": min_frames_per_sequence, "quirks": bool(quirks)}
        marker = {"generator": GENERATOR, "seed": seed, "options": options, "note": NOTE}
        _write(tmp / MARKER_FILE, json.dumps(marker, indent=2, sort_keys=True) + "\n")
    pain_frames = sum(n for p, n in pspi_counts.items() if p >= 1)
    return {
        "root": str(out),
        "subjects": len(plans),
        "sequences": sum(len(p.sequences) for p in plans),
        "frames": total,
        "pain_frames": pain_frames,
        "pspi_histogram": {str(p): pspi_counts[p] for p in sorted(pspi_counts)},
    }



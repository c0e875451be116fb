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
  expressiveness. Recording conditions belong to what they belong to in the archive
  (see "Recording conditions" below): the backdrop to the lab, the light, camera
  settings and clothes to the occasion, the head pose to the sequence.
* Pain comes in smooth episodes (rise and fall over several frames) inside mostly neutral
  sequences; per-subject pain prevalence follows Tobis Table 3.1 and the Group 2 sessions
  follow Table 6.3 (session counts and the number of sessions with pain).

Recording conditions. A sequence name ``<ii><NNN>t<S>a<X><aff|unaff>`` carries the test
occasion ``t1``/``t2``: the archive's data were "captured on two separate occasions", and one
occasion holds several range-of-motion tests (``a`` + a/e/f/i) of the affected and unaffected
limb (reference/dataset-formats.md §1.4). The sequences of one occasion are the same person
filmed in one sitting, in the same room, by the same camera, in the same clothes, so:

* per cohort (the lab): the backdrop. The archive is one study recorded by one team
  (UNBC and McMaster); one lab with one backdrop is our assumption (the references do not
  describe the recording room), and the conservative one: a backdrop that changes
  with the occasion, the subject or the sequence is information about the recording, not
  about pain, that a model can learn. The backdrop still looks different on each occasion,
  because the occasion's light, colour cast, gain and contrast are applied to it.
* per (subject, occasion): the light field (direction and fall-off), colour cast, gain,
  contrast, sensor-noise level, blur (focus) and the clothes colour. No per-sequence
  jitter is added on top: the tests of one sitting are minutes apart with the same lamps
  and camera settings, and the frame-to-frame changes a real camera has are already
  drawn per frame (gain flicker, sensor noise).
* per sequence: the head pose (scale, rotation, translation, yaw) the subject takes for
  that test, and the expression and its timing.

Before, every sequence drew all of these independently, so each sequence looked like a
separate recording; sequences differ in how much pain they hold, so a model could score a
sequence by its look (issue 9). The frames' labels are unchanged by this: the per-sequence
stream still draws the same numbers in the same order, only the appearance changes.

Everything is drawn from ``np.random.default_rng([seed, subject, stream])`` (the lab from
``[seed, stream]``): the same seed gives byte-identical files, and a subject's frames do not
depend on which other subjects are generated.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from fedcare.data.synthetic.face import UNIT as _UNIT  # noqa: F401 - re-exported under the old names
from fedcare.data.synthetic.face import ar1 as _ar1
from fedcare.data.synthetic.face import face_geometry as _geometry
from fedcare.data.synthetic.face import identity as _identity
from fedcare.data.synthetic.face import render_faces as _render_sequence
from fedcare.data.synthetic.face import session_conditions as _session
from fedcare.data.synthetic.output import atomic_directory, check_output_dir
from fedcare.data.common import MAX_IMAGE_SIZE, MAX_SCALE, SYNTHETIC_MARKER
from fedcare.data.unbc.groups import THESIS_GROUP1, THESIS_GROUP2
from fedcare.errors import InputError

GENERATOR = "fedcare.data.synthetic.pain"  # the marker keeps the name from before the dataset packages (same bytes)
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
_SEQ_LABEL_RANGES = {"VAS": 10, "OPR": 5, "SEN": 15, "AFF": 15}

# Which recording conditions (keys of face.session_conditions) belong to what (module docstring).
LAB_CONDITIONS: tuple[str, ...] = ("bg",)
OCCASION_CONDITIONS: tuple[str, ...] = ("light", "cast", "gain", "contrast", "noise", "blur", "clothes")
SEQUENCE_CONDITIONS: tuple[str, ...] = ("scale", "rot", "tx", "ty", "yaw")
_LAB_STREAM = 300  # default_rng([seed, 300]); subjects use [seed, subject, stream]
_OCCASION_STREAM = 200  # default_rng([seed, subject, 200 + occasion]); sequences use 100 + session
_OCCASION_RE = re.compile(r"t([12])a[aefi](?:aff|unaff)$")


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
        raise InputError(f"subject {subject}: {n} sessions, but only {len(pool)} sequence names exist")
    known = list(KNOWN_SEQUENCES.get(subject, ()))[:n]
    if subject == BLACK_FRAMES_SUBJECT and known:
        pool = [p for p in pool if p <= known[-1]]  # keep the real black-frame sequence last
    rest = [p for p in pool if p not in known]
    chosen = known + [rest[i] for i in rng.choice(len(rest), size=n - len(known), replace=False)]
    return sorted(chosen)


def occasion_of(name: str) -> int:
    """The test occasion (1 or 2) of a sequence name: the digit after ``t`` (§1.4)."""
    m = _OCCASION_RE.search(name)
    if m is None:
        raise ValueError(f"{name!r} is not a UNBC-McMaster sequence name")
    return int(m.group(1))


def _lab_conditions(seed: int, size: int) -> dict:
    """The lab's conditions, the same for every subject and occasion: the backdrop."""
    lab = _session(np.random.default_rng([seed, _LAB_STREAM]), size)
    return {key: lab[key] for key in LAB_CONDITIONS}


def _occasion_conditions(seed: int, subject: int, occasion: int, size: int) -> dict:
    """One sitting's conditions: light field, colour cast, gain, contrast, noise, blur, clothes."""
    occ = _session(np.random.default_rng([seed, subject, _OCCASION_STREAM + occasion]), size)
    return {key: occ[key] for key in OCCASION_CONDITIONS}


def recording_conditions(sequence_rng: np.random.Generator, name: str, subject: int, seed: int, size: int,
                         cache: dict | None = None) -> dict:
    """A sequence's recording conditions (the dict ``face.render_faces`` takes): the head pose
    drawn from the sequence's own stream, the rest from its occasion and the lab.

    ``face.session_conditions`` is still called on the sequence's stream, so the stream is
    advanced exactly as before and every later draw (the expression, the labels) is unchanged;
    its occasion and lab values are then replaced. Pass one ``cache`` dict for all of a
    subject's sequences to draw each occasion once."""
    sess = _session(sequence_rng, size)
    cache = {} if cache is None else cache  # the lab's and the occasions' conditions, drawn once
    occasion = occasion_of(name)
    if "lab" not in cache:
        cache["lab"] = _lab_conditions(seed, size)
    if occasion not in cache:
        cache[occasion] = _occasion_conditions(seed, subject, occasion, size)
    sess.update(cache["lab"])
    sess.update(cache[occasion])
    return sess


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
        raise InputError(f"subjects must be a sequence of subject numbers, got {subjects!r}")
    out = []
    for s in subjects:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise InputError(f"subject {s!r} is not a subject number (known: {sorted(SUBJECT_FOLDERS)})")
        if int(s) not in SUBJECT_FOLDERS:
            raise InputError(f"unknown UNBC-McMaster subject {s} (known: {sorted(SUBJECT_FOLDERS)})")
        out.append(int(s))
    if not out:
        raise InputError("subjects is empty: give at least one subject number")
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
    conditions: dict = {}  # the lab's and each occasion's, drawn once
    for sp in plan.sequences:
        rng = np.random.default_rng([seed, plan.subject, 100 + sp.session])
        sess = recording_conditions(rng, sp.name, plan.subject, seed, size, conditions)
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


def _check_options(seed, frame_scale, image_size, min_frames_per_sequence) -> tuple[int, int, int]:
    """(seed, image_size, min_frames_per_sequence) as ints; ValueError naming a bad option."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")
    if not (isinstance(frame_scale, (int, float)) and math.isfinite(frame_scale) and 0 < frame_scale <= MAX_SCALE):
        raise InputError(f"frame_scale must be a number above 0 and at most {MAX_SCALE:g} (times the real frame "
                         f"counts), got {frame_scale!r}")
    if isinstance(image_size, bool) or not isinstance(image_size, (int, np.integer)) \
            or not 16 <= image_size <= MAX_IMAGE_SIZE:
        raise InputError(f"image_size must be an integer from 16 to {MAX_IMAGE_SIZE}, got {image_size!r}")
    if isinstance(min_frames_per_sequence, bool) or not isinstance(min_frames_per_sequence, (int, np.integer)) \
            or min_frames_per_sequence < 1:
        raise InputError(f"min_frames_per_sequence must be an integer >= 1, got {min_frames_per_sequence!r}")
    return int(seed), int(image_size), int(min_frames_per_sequence)


class _Writers:
    """A few threads write the files while the next frames are drawn; at most _MAX_PENDING
    writes wait, and progress counts the frames written."""

    def __init__(self, total: int, progress: Callable[[int, int], None] | None) -> None:
        self.total, self.progress, self.done = total, progress, 0
        self.pending: deque[Future] = deque()
        self.pool = ThreadPoolExecutor(max_workers=_WRITERS, thread_name_prefix="fedcare-synth")

    def collect(self, block: bool) -> None:
        while self.pending and (block or self.pending[0].done() or len(self.pending) > _MAX_PENDING):
            self.done += self.pending.popleft().result()
            if self.progress is not None:
                self.progress(self.done, self.total)

    def submit(self, fn: Callable[..., int], *args) -> None:
        self.pending.append(self.pool.submit(fn, *args))
        self.collect(block=False)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


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
    seed, image_size, min_frames_per_sequence = _check_options(seed, frame_scale, image_size, min_frames_per_sequence)
    check_output_dir(out, overwrite, GENERATOR)

    plans = _plan(subj, seed, float(frame_scale), min_frames_per_sequence, bool(quirks))
    total = sum(p.frames for p in plans)
    pspi_counts: dict[int, int] = {}
    with atomic_directory(out, overwrite, GENERATOR) as tmp:
        writers = _Writers(total, progress)
        try:
            if progress is not None:
                progress(0, total)
            for plan in plans:
                _generate_subject(tmp, plan, seed, image_size, writers.submit, pspi_counts)
            writers.collect(block=True)
        finally:
            writers.shutdown()  # no writer may still touch tmp
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



"""Synthetic laparoscopic videos in the Cholec80 AND HeiChole layouts, for tests and the
surgical demo: real mp4 files (OpenCV ``VideoWriter``, fourcc ``mp4v``, the FFmpeg backend)
plus annotation files, so that ``load_cholec80``, ``load_heichole`` and ``thesis_clients``
read them unchanged.

``generate_surgical(out)`` writes::

    <out>/fedcare-synthetic.json
    <out>/cholec80/fedcare-synthetic.json
    <out>/cholec80/videos/videoNN.mp4                          25 fps
    <out>/cholec80/tool_annotations/videoNN-tool.txt           header + 1 row per second
    <out>/cholec80/phase_annotations/videoNN-phase.txt         header + 1 row per frame
    <out>/heichole/fedcare-synthetic.json
    <out>/heichole/Videos/Full/Hei-Chole<N>.mp4                25 fps; 50 fps for 16-20, 23, 24
    <out>/heichole/Annotations/Instrument/Hei-Chole<N>_Annotation_Instrument.csv   1 row per frame
    <out>/heichole/Annotations/Phase/Hei-Chole<N>_Annotation_Phase.csv             1 row per frame

The scene
---------
Reddish-pink tissue (multi-scale noise, yellow fat, dark vessels, wet specular highlights
that slide against the tissue as the camera moves), an endoscope vignette, sensor noise,
and six drawable tools, each a shaft entering from a trocar port outside the picture with
a distinct tip: **grasper** (grey opening jaws), **clip applier** (silver parallel jaws
holding a gold clip), **coagulation** (Cholec80 draws either the *hook*, a black shaft with
a white insulated L-tip and smoke, or the *bipolar*, a blue shaft with two thin prongs; both
map to Coagulation Instrument), **scissors** (crossed bright blades), **suction-irrigation**
(a long pale tube with a rounded, holed tip) and the **specimen bag** (a translucent beige
bag). HeiChole also gets a **stapler** (thick shaft, long blue-grey jaw; dropped by the loader).
Shafts share one grey-black palette and tips are 10-20 px at 240 px width, so a model has
to look at the tips: learnable, not trivial.

Tools come and go in episodes following a surgical timeline (preparation, Calot triangle
dissection, clipping and cutting, gallbladder dissection, packaging, cleaning and
coagulation, retraction), with per-phase tool rates shaped after HeiChole's phase/instrument
co-occurrence (rare tools made a little more common so that a small demo has positives).
Labels are computed from the drawing: Cholec80 marks a tool at a sampled frame when its
tip is inside the picture; HeiChole marks it from the first frame its tip is visible until
its shaft has left (HeiChole's rule), and sets category 20 (undefined shaft) while a shaft
is visible before its tip.

The clients (the thesis's heterogeneity)
----------------------------------------
* **CHO1 / CHO2 / CHO3** (Cholec80, Strasbourg colours: darker, less saturated): black
  left/right borders of about 13%, 5.5% and 0-1% of the width per side, each video with one
  stretch (20-35% of its length) at another width, so the *most frequent* width decides;
  **CHO2 has twice the videos of CHO1 and CHO3** with the same length distribution, hence
  about twice the frames (quantity skew). Video numbers follow the thesis split (1-60 train,
  61-80 test); about a quarter of each class is test.
* **HEI1** (Heidelberg, Hei-Chole1..): brighter, warmer, intermediate border (4-6%);
  **label skew**: Coagulation Instrument at 0.35x the rate, the rare tools (clipper,
  scissors, suction, bag) twice as often (capped at 95%).
* **HEI2** (Salem, Hei-Chole13..): brighter, yellower, no border, an **information bar**
  (black strip with a white clock and icon) at the bottom; **its test set has no
  Suction-Irrigation at all** (its test videos are those ``heichole.test_videos`` draws with
  ``split_seed``, as ``thesis_clients(seed=split_seed)`` will; with another seed the gap is
  not guaranteed). One HEI2 training video holds the only stapler.
* HeiChole videos start with 1-2 s of white (censored) frames and often have another white
  stretch; they are shorter (``heichole_seconds``, default ``default_heichole_seconds``:
  each HeiChole client gets about 3/4 of CHO1's frames), so the HeiChole clients hold less
  data than the Cholec80 ones, as in the thesis (not guaranteed for tiny videos, which are
  at least 8 s long).
* Every client's train and test split shows every tool at least once (except HEI2's test
  Suction-Irrigation), so positive weights are finite.

Determinism
-----------
Everything is drawn from ``np.random.default_rng([seed, dataset, number, stream])``: the
same seed gives byte-identical annotation files, and a video does not depend on which other
videos are generated. The mp4 bytes are identical too with the same OpenCV/FFmpeg build
(checked on OpenCV 5.0.0 / libavcodec 62); another build may encode differently, so tests
compare annotation files and decoded frames only approximately. Frame sizes must be even
(mp4v drops an odd row or column).
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from fedcare.data.common import SYNTHETIC_MARKER
from fedcare.data.surgical.heichole import test_videos
from fedcare.data.synthetic.output import atomic_directory, check_output_dir
from fedcare.data.video import decoder_id

__all__ = ["GENERATOR", "PHASES", "default_heichole_seconds", "generate_surgical", "plan_videos"]

GENERATOR = "fedcare.data.synthetic.surgical"  # the marker keeps the name from before the dataset packages (same bytes)
NOTE = "SYNTHETIC data, not Cholec80 / HeiChole: no patient, no surgery"
FOURCC = "mp4v"

# tool slots, thesis order (common.TOOLS) plus the HeiChole-only stapler
GRASPER, CLIPPER, COAG, SCISSORS, SUCTION, BAG, STAPLER = range(7)
N_TOOLS = 6

PHASES = ("Preparation", "CalotTriangleDissection", "ClippingCutting", "GallbladderDissection",
          "GallbladderPackaging", "CleaningCoagulation", "GallbladderRetraction")
HEICHOLE_PHASE_ID = {name: i for i, name in enumerate(PHASES)}  # HeiChole ids (TMRNet order)
PHASE_SHARE = np.array([0.08, 0.34, 0.12, 0.20, 0.09, 0.10, 0.07])
# P(tool present) during each phase: Grasper, Clipper, Coag, Scissors, Suction, Bag
PHASE_RATES = np.array([
    [0.35, 0.00, 0.10, 0.00, 0.06, 0.00],  # preparation
    [0.80, 0.03, 0.88, 0.02, 0.05, 0.00],  # Calot triangle dissection
    [0.75, 0.55, 0.05, 0.40, 0.04, 0.00],  # clipping and cutting
    [0.55, 0.03, 0.90, 0.06, 0.12, 0.02],  # gallbladder dissection
    [0.90, 0.00, 0.03, 0.00, 0.08, 0.90],  # packaging
    [0.70, 0.04, 0.30, 0.05, 0.60, 0.35],  # cleaning and coagulation
    [0.20, 0.00, 0.02, 0.00, 0.03, 0.65],  # retraction
])
EPISODE_SECONDS = np.array([6.0, 2.0, 5.0, 1.8, 3.0, 4.0])  # mean on-duration per tool

# client -> centre, dataset, colour profile
CLIENT_CENTRE = {"CHO1": "Strasbourg", "CHO2": "Strasbourg", "CHO3": "Strasbourg",
                 "HEI1": "Heidelberg", "HEI2": "Salem"}
# (R, G, B gains, gamma) of the camera chain; gamma < 1 brightens
PROFILES = {
    "Strasbourg": ((0.97, 0.92, 0.95), 1.12, 0.92),  # gains, gamma, saturation
    "Heidelberg": ((1.08, 0.98, 0.95), 0.90, 1.15),
    "Salem": ((1.10, 1.04, 0.86), 0.85, 1.20),
}
HEI1_RARE_FACTOR = 2.0
HEI1_COAG_FACTOR = 0.35
HEICHOLE_FIFTY_FPS = frozenset({16, 17, 18, 19, 20, 23, 24})  # as in the real HeiChole
HEIDELBERG_FIRST, SALEM_FIRST = 1, 13
CHOLEC_TEST_SHARE = 0.25


@dataclass
class VideoPlan:
    dataset: str  # "cholec80" / "heichole"
    number: int
    client: str
    split: str  # "train" / "test" (thesis split; HeiChole via test_videos(split_seed))
    seconds: int
    fps: int
    border: float  # main border fraction per side
    border_alt: float  # the other width, for [alt_start, alt_end) seconds
    alt_start: float
    alt_end: float
    info_bar: bool
    white: list[tuple[float, float]]  # censored stretches [start, end) in seconds
    rates: np.ndarray  # (7 phases, 6 tools)
    forbid: frozenset[int] = frozenset()
    stapler: bool = False
    presence: np.ndarray | None = None  # (seconds, 6) bool, set by _simulate
    phases: np.ndarray | None = None  # (seconds,) phase index
    coag_kind: np.ndarray | None = None  # (seconds,) 0 hook / 1 bipolar
    stapler_run: tuple[int, int] | None = None

    @property
    def id(self) -> str:
        return f"video{self.number:02d}" if self.dataset == "cholec80" else f"Hei-Chole{self.number}"

    @property
    def frames(self) -> int:
        return self.seconds * self.fps

    @property
    def dataset_index(self) -> int:
        return 1 if self.dataset == "cholec80" else 2


def _rng(seed: int, plan: VideoPlan, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, plan.dataset_index, plan.number, stream])


def _lengths(n: int, seconds: int, rng: np.random.Generator) -> list[int]:
    if n == 1:
        return [seconds]
    base = np.round(seconds * np.linspace(0.8, 1.2, n)).astype(int)
    return [max(8, int(v)) for v in rng.permutation(base)]


def default_heichole_seconds(videos: int, heichole_videos: int, seconds: int) -> int:
    """Mean HeiChole video length such that each HeiChole client holds about 3/4 of CHO1's
    labelled frames (the thesis: HeiChole clients hold less data than the Cholec80 ones);
    2.5 s are added for the censored frames the loader drops. At least 8 s."""
    return max(8, round(0.75 * videos * seconds / heichole_videos + 2.5))


def plan_videos(*, seed: int = 0, videos: int = 4, heichole_videos: int = 6, seconds: int = 30,
                heichole_seconds: int | None = None, split_seed: int = 0) -> list[VideoPlan]:
    """What ``generate_surgical`` will write (numbers, clients, lengths, borders, timelines)."""
    rng = np.random.default_rng([seed, 0, 0])
    hs = heichole_seconds if heichole_seconds is not None else default_heichole_seconds(videos, heichole_videos, seconds)
    plans: list[VideoPlan] = []
    # ---- Cholec80: CHO1 n, CHO2 2n, CHO3 n videos; numbers follow the thesis split
    classes = {"CHO1": videos, "CHO2": 2 * videos, "CHO3": videos}
    train_slots: list[tuple[str, int]] = []
    test_slots: list[tuple[str, int]] = []
    lengths: dict[str, list[int]] = {}
    for client, n in classes.items():
        lengths[client] = _lengths(n, seconds, rng)
        n_test = min(n - 1, max(1, round(CHOLEC_TEST_SHARE * n)))
        test_slots += [(client, k) for k in range(n_test)]
        train_slots += [(client, k) for k in range(n_test, n)]
    if len(train_slots) > 60 or len(test_slots) > 20:
        raise ValueError(f"videos={videos} needs {len(train_slots)} train and {len(test_slots)} test Cholec80 "
                         f"videos; the thesis split has 60 and 20 (use videos <= 16)")
    for first, slots, split in ((1, train_slots, "train"), (61, test_slots, "test")):
        order = rng.permutation(len(slots))
        for number, i in enumerate(order, start=first):
            client, k = slots[i]
            main, alt = _cholec_border(client, rng)
            length = lengths[client][k]
            alt_len = length * rng.uniform(0.2, 0.35)
            alt_start = rng.uniform(0, length - alt_len)
            plans.append(VideoPlan("cholec80", number, client, split, length, 25, main, alt, alt_start,
                                   alt_start + alt_len, False, [], PHASE_RATES.copy()))
    # ---- HeiChole: Heidelberg 1.., Salem 13..
    if not 4 <= heichole_videos <= 12:
        raise ValueError(f"heichole_videos must be 4..12 (3 test videos per centre plus training), got {heichole_videos}")
    for client, first, centre in (("HEI1", HEIDELBERG_FIRST, "Heidelberg"), ("HEI2", SALEM_FIRST, "Salem")):
        numbers = list(range(first, first + heichole_videos))
        test = set(test_videos(numbers, centre, n_test=3, seed=split_seed))
        for number, length in zip(numbers, _lengths(heichole_videos, hs, rng)):
            rates = PHASE_RATES.copy()
            if client == "HEI1":
                rates[:, COAG] *= HEI1_COAG_FACTOR
                for t in (CLIPPER, SCISSORS, SUCTION, BAG):
                    rates[:, t] = np.minimum(0.95, rates[:, t] * HEI1_RARE_FACTOR)
            border = rng.uniform(0.04, 0.06) if client == "HEI1" else 0.0
            white = [(0.0, float(rng.uniform(1.0, 2.0)))]
            if rng.random() < 0.6 and length >= 12:
                start = rng.uniform(0.3 * length, 0.8 * length)
                white.append((start, start + rng.uniform(1.0, 2.0)))
            split = "test" if number in test else "train"
            forbid = frozenset({SUCTION}) if client == "HEI2" and split == "test" else frozenset()
            fps = 50 if number in HEICHOLE_FIFTY_FPS else 25
            plans.append(VideoPlan("heichole", number, client, split, length, fps, border, border, 0.0, 0.0,
                                   client == "HEI2", white, rates, forbid))
        if client == "HEI2":
            first_train = next(p for p in plans if p.client == "HEI2" and p.split == "train")
            first_train.stapler = True
    for plan in plans:
        _simulate(plan, seed)
    _ensure_coverage(plans, seed)
    return plans


def _cholec_border(client: str, rng: np.random.Generator) -> tuple[float, float]:
    if client == "CHO1":
        return rng.uniform(0.115, 0.145), rng.uniform(0.04, 0.065)
    if client == "CHO2":
        return rng.uniform(0.045, 0.065), (rng.uniform(0.11, 0.14) if rng.random() < 0.5 else 0.0)
    return (0.0 if rng.random() < 0.6 else rng.uniform(0.004, 0.012)), rng.uniform(0.04, 0.06)


# --------------------------------------------------------------------------- timelines


def _phase_timeline(seconds: int, rng: np.random.Generator) -> np.ndarray:
    share = PHASE_SHARE * rng.uniform(0.7, 1.3, len(PHASE_SHARE))
    share = share / share.sum()
    bounds = np.round(np.cumsum(share) * seconds).astype(int)
    phases = np.zeros(seconds, np.int64)
    start = 0
    for i, end in enumerate(bounds):
        phases[start:max(start, end)] = i
        start = max(start, end)
    return phases


def _partition(total: int, parts: int, rng: np.random.Generator) -> np.ndarray:
    """`total` split into `parts` non-negative integers (uniformly random composition)."""
    if parts <= 1:
        return np.array([total])
    cuts = np.sort(rng.integers(0, total + 1, parts - 1))
    return np.diff(np.concatenate([[0], cuts, [total]]))


def _simulate(plan: VideoPlan, seed: int) -> None:
    """Per-second tool presence. In every phase segment of L seconds a tool with rate f is
    present for round(f*L + N(0, 0.5)) seconds, in episodes of about EPISODE_SECONDS placed
    at random inside the segment: shares follow the rates closely even in short videos."""
    rng = _rng(seed, plan, 1)
    phases = _phase_timeline(plan.seconds, rng)
    presence = np.zeros((plan.seconds, N_TOOLS), bool)
    bounds = np.flatnonzero(np.diff(np.concatenate([[-1], phases, [-1]])))
    for a, b in itertools.pairwise(bounds):
        length = int(b - a)
        for tool in range(N_TOOLS):
            f = plan.rates[phases[a], tool]
            if tool in plan.forbid or f <= 0:
                continue
            k = int(np.clip(round(f * length + rng.normal(0, 0.5)), 0, length))
            if k == 0:
                continue
            episodes = max(1, min(k, round(k / EPISODE_SECONDS[tool])))
            lengths = _partition(k - episodes, episodes, rng) + 1
            gaps = _partition(length - k, episodes + 1, rng)
            pos = a + int(gaps[0])
            for run, gap in zip(lengths, gaps[1:]):
                presence[pos:pos + int(run), tool] = True
                pos += int(run) + int(gap)
    for start, end in plan.white:  # nothing is annotated while the picture is censored
        presence[math.floor(start):math.ceil(end)] = False
    plan.presence, plan.phases = presence, phases
    plan.coag_kind = (rng.random(plan.seconds) < 0.25).astype(np.int64)
    kinds = plan.coag_kind
    for s in range(1, plan.seconds):  # one coagulation instrument per episode
        if presence[s, COAG] and presence[s - 1, COAG]:
            kinds[s] = kinds[s - 1]
    if plan.stapler:  # 2 s in the clipping phase, where the picture is not censored
        free = [s for s in range(plan.seconds - 1) if not _censored(plan, s) and not _censored(plan, s + 1)]
        clip = [s for s in free if phases[s] == PHASES.index("ClippingCutting")]
        start = (clip or free or [0])[0]
        plan.stapler_run = (start, min(plan.seconds, start + 2))


def _censored(plan: VideoPlan, s: int) -> bool:
    return any(start - 1 < s < end + 1 for start, end in plan.white)


def _ensure_coverage(plans: list[VideoPlan], seed: int) -> None:
    """Every tool appears in every (client, split) at least once, unless forbidden there."""
    groups: dict[tuple[str, str], list[VideoPlan]] = {}
    for p in plans:
        groups.setdefault((p.client, p.split), []).append(p)
    for (client, split), group in sorted(groups.items()):
        for tool in range(N_TOOLS):
            if any(tool in p.forbid for p in group) or any(p.presence[:, tool].any() for p in group):
                continue
            plan = max(group, key=lambda p: (p.seconds, -p.number))
            rng = _rng(seed, plan, 10 + tool)
            best = int(np.argmax(plan.rates[:, tool]))
            where = [s for s in np.flatnonzero(plan.phases == best) if not _censored(plan, s)]
            if not where:
                where = [s for s in range(plan.seconds - 1) if not _censored(plan, s)]
            start = int(rng.choice(where))
            plan.presence[start:min(plan.seconds, start + 2), tool] = True


# --------------------------------------------------------------------------- scene


def _smooth_noise(shape: tuple[int, int], scale: float, rng: np.random.Generator) -> np.ndarray:
    h, w = shape
    small = rng.standard_normal((max(2, int(h / scale)) + 2, max(2, int(w / scale)) + 2)).astype(np.float32)
    big = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)
    return (big - big.mean()) / (big.std() + 1e-6)


class _Scene:
    """Everything of one video that does not depend on the tools."""

    def __init__(self, plan: VideoPlan, width: int, height: int, rng: np.random.Generator) -> None:
        self.w, self.h = width, height
        s = width / 240.0
        self.s = s
        tw, th = int(width * 1.5), int(height * 1.5)  # the camera moves over a larger texture
        gains, gamma, saturation = PROFILES[CLIENT_CENTRE[plan.client]]
        # drawn from `rng` in this order: tissue, highlights, optics
        noise = self._tissue(tw, th, saturation, rng)
        self._highlights(noise, tw, th, rng)
        self._optics(gains, gamma, tw, th, rng)
        smoke = np.zeros((int(60 * s), int(60 * s)), np.float32)
        cv2.circle(smoke, (smoke.shape[1] // 2, smoke.shape[0] // 2), int(18 * s), 1.0, -1)
        self.smoke = cv2.GaussianBlur(smoke, (0, 0), 9 * s)

    def _tissue(self, tw: int, th: int, saturation: float, rng: np.random.Generator) -> np.ndarray:
        """`texture`: red tissue with fat and vessels, in the camera's saturation; returns its
        relief (the noise that shaped it)."""
        s = self.s
        n = (0.55 * _smooth_noise((th, tw), 40 * s, rng) + 0.3 * _smooth_noise((th, tw), 12 * s, rng)
             + 0.15 * _smooth_noise((th, tw), 4 * s, rng))
        base = np.array([182, 78, 72], np.float32) * rng.uniform(0.92, 1.08, 3).astype(np.float32)
        tex = base[None, None, :] * (1.0 + 0.22 * n[..., None])
        fat = np.clip((_smooth_noise((th, tw), 30 * s, rng) - 1.0) * 1.2, 0, 0.85)
        fat = cv2.GaussianBlur(fat, (0, 0), 2.5 * s)[..., None]
        tex = tex * (1 - fat) + np.array([205, 170, 100], np.float32) * fat
        vessels = np.zeros((th, tw), np.float32)
        for _ in range(int(rng.integers(4, 9))):
            pts = [rng.uniform((0, 0), (tw, th))]
            direction = rng.uniform(0, 2 * math.pi)
            for _ in range(int(rng.integers(5, 12))):
                direction += rng.normal(0, 0.5)
                pts.append(pts[-1] + 14 * s * np.array([math.cos(direction), math.sin(direction)]))
            cv2.polylines(vessels, [np.round(np.array(pts)).astype(np.int32)], False, 1.0,
                          max(1, round(rng.uniform(1, 2.5) * s)), cv2.LINE_AA)
        vessels = cv2.GaussianBlur(vessels, (0, 0), 1.0 * s)[..., None]
        tex = tex * (1 - 0.55 * vessels) + np.array([110, 20, 28], np.float32) * 0.55 * vessels
        grey = tex.mean(axis=2, keepdims=True)
        tex = grey + (tex - grey) * saturation  # the camera's saturation, baked into the tissue
        self.texture = np.clip(tex, 0, 255).astype(np.uint8)
        return n

    def _highlights(self, n: np.ndarray, tw: int, th: int, rng: np.random.Generator) -> None:
        """`specular`: wet highlights, clusters of small glints on the bulging (bright) parts of the tissue."""
        s = self.s
        spec = np.zeros((th, tw), np.float32)
        bulge = n > np.quantile(n, 0.8)
        ys, xs = np.nonzero(bulge)
        for _ in range(int(rng.integers(5, 9))):
            i = int(rng.integers(len(xs)))
            cx, cy = xs[i], ys[i]
            angle = float(rng.uniform(0, 180))
            for _ in range(int(rng.integers(2, 6))):
                c = (int(cx + rng.normal(0, 6 * s)), int(cy + rng.normal(0, 4 * s)))
                axes = (max(1, int(rng.uniform(1.5, 5) * s)), max(1, int(rng.uniform(0.6, 1.6) * s)))
                cv2.ellipse(spec, c, axes, angle + float(rng.normal(0, 20)), 0, 360, float(rng.uniform(0.5, 1.0)), -1,
                            cv2.LINE_AA)
        spec = spec + 0.35 * cv2.GaussianBlur(spec, (0, 0), 4 * s)  # soft glow around the glints
        spec = np.clip(cv2.GaussianBlur(spec, (0, 0), 0.6 * s) * 255, 0, 255).astype(np.uint8)
        self.specular = np.repeat(spec[..., None], 3, axis=2)

    def _optics(self, gains, gamma: float, tw: int, th: int, rng: np.random.Generator) -> None:
        """The camera: `vignette`, its path over the texture (`cam`, `margin`), its colour
        response (`lut`), sensor noise and light flicker."""
        width, height = self.w, self.h
        yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
        r = np.sqrt(((xx - width / 2) / (width / 2)) ** 2 + ((yy - height / 2) / (height / 2)) ** 2)
        strength = rng.uniform(0.35, 0.5)
        vignette = np.clip(1.0 - strength * r ** 2.2, 0.25, 1.0)
        self.vignette = np.repeat(np.round(vignette * 255)[..., None], 3, axis=2).astype(np.uint8)
        # camera path: slow sums of sinusoids, in texture pixels
        self.cam = [(rng.uniform(0.05, 0.25), rng.uniform(0, 2 * math.pi), rng.uniform(0.3, 1.0)) for _ in range(4)]
        self.margin = ((tw - width) / 2, (th - height) / 2)
        gains = np.array(gains) * rng.uniform(0.96, 1.04, 3)
        gamma = gamma * rng.uniform(0.95, 1.05)
        x = np.arange(256, dtype=np.float64) / 255.0
        lut = np.stack([np.clip(255.0 * (x ** gamma) * g, 0, 255) for g in gains], axis=-1).astype(np.uint8)
        self.lut = lut.reshape(1, 256, 3).copy()
        noise = [np.round(rng.normal(0, 3.0, (height, width, 3))).astype(np.int16) for _ in range(6)]
        self.noise_up = [np.clip(n, 0, 255).astype(np.uint8) for n in noise]
        self.noise_down = [np.clip(-n, 0, 255).astype(np.uint8) for n in noise]
        self.flicker = (rng.uniform(0.03, 0.06), rng.uniform(0.2, 0.5), rng.uniform(0, 2 * math.pi))

    def camera(self, t: float) -> tuple[float, float]:
        mx, my = self.margin
        dx = sum(a * math.sin(2 * math.pi * f * t / 10 + p) for a, p, f in self.cam[:2]) / 0.5
        dy = sum(a * math.sin(2 * math.pi * f * t / 10 + p) for a, p, f in self.cam[2:]) / 0.5
        return mx * (1 + 0.8 * math.tanh(dx)), my * (1 + 0.8 * math.tanh(dy))

    def background(self, t: float) -> np.ndarray:
        ox, oy = self.camera(t)
        ix, iy = int(ox), int(oy)
        frame = self.texture[iy:iy + self.h, ix:ix + self.w]
        sx = int(self.margin[0] + (ox - self.margin[0]) * 0.4)  # highlights slide against the tissue
        sy = int(self.margin[1] + (oy - self.margin[1]) * 0.4)
        a, f, p = self.flicker
        light = 1.0 + a * math.sin(2 * math.pi * f * t + p)
        frame = cv2.multiply(frame, self.vignette, scale=light / 255.0)
        return cv2.add(frame, self.specular[sy:sy + self.h, sx:sx + self.w])

    def finish(self, frame: np.ndarray, k: int) -> np.ndarray:
        i = k % len(self.noise_up)
        frame = cv2.subtract(cv2.add(frame, self.noise_up[i]), self.noise_down[i])
        return cv2.LUT(frame, self.lut)


# --------------------------------------------------------------------------- tools


@dataclass
class _Episode:
    t_on: float
    t_off: float
    kind: int  # coagulation: 0 hook, 1 bipolar
    port: np.ndarray
    centre: np.ndarray
    wobble: list = field(default_factory=list)  # (ax, ay, freq, phase)
    jaw: tuple[float, float] = (0.5, 0.0)

    RAMP = 0.35

    def depth(self, t: float) -> float:
        if t < self.t_on - self.RAMP or t > self.t_off + self.RAMP:
            return 0.0
        if t < self.t_on:
            x = (t - self.t_on + self.RAMP) / self.RAMP
        elif t > self.t_off:
            x = 1.0 - (t - self.t_off) / self.RAMP
        else:
            return 1.0
        return x * x * (3 - 2 * x)

    def tip(self, t: float) -> np.ndarray:
        target = self.centre + sum(np.array([ax * math.sin(f * t + p), ay * math.cos(0.7 * f * t + p)])
                                   for ax, ay, f, p in self.wobble)
        return self.port + self.depth(t) * (target - self.port)


# port sides per tool: (left, right, top) weights
PORT_SIDES = {GRASPER: (0.6, 0.1, 0.3), CLIPPER: (0.1, 0.7, 0.2), COAG: (0.1, 0.7, 0.2), SCISSORS: (0.15, 0.65, 0.2),
              SUCTION: (0.45, 0.45, 0.1), BAG: (0.5, 0.2, 0.3), STAPLER: (0.2, 0.6, 0.2)}


def _episodes(plan: VideoPlan, tool: int, runs: list[tuple[int, int]], active: tuple[float, float, float, float],
              rng: np.random.Generator, s: float) -> list[_Episode]:
    x0, y0, x1, y1 = active
    w, h = x1 - x0, y1 - y0
    side = int(rng.choice(3, p=np.array(PORT_SIDES[tool]) / sum(PORT_SIDES[tool])))
    out = []
    for a, b in runs:
        t_on = a - rng.uniform(0.0, 0.4)
        t_off = b - 1 + rng.uniform(0.3, 0.5)
        if side == 0:
            port = np.array([x0 - 0.35 * w, rng.uniform(y0 + 0.1 * h, y1 - 0.1 * h)])
        elif side == 1:
            port = np.array([x1 + 0.35 * w, rng.uniform(y0 + 0.1 * h, y1 - 0.1 * h)])
        else:
            port = np.array([rng.uniform(x0 + 0.15 * w, x1 - 0.15 * w), y0 - 0.45 * h])
        margin = 0.2 if tool != BAG else 0.28
        centre = np.array([rng.uniform(x0 + margin * w, x1 - margin * w), rng.uniform(y0 + margin * h, y1 - margin * h)])
        wobble = [(rng.uniform(0.02, 0.07) * w, rng.uniform(0.02, 0.07) * h, rng.uniform(0.8, 2.5),
                   rng.uniform(0, 2 * math.pi)) for _ in range(2)]
        kind = int(plan.coag_kind[a]) if tool == COAG else 0
        out.append(_Episode(t_on, t_off, kind, port, centre, wobble, (rng.uniform(0.3, 0.6), rng.uniform(0, 6.28))))
    return out


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    runs, start = [], None
    for s, on in enumerate(mask):
        if on and start is None:
            start = s
        elif not on and start is not None:
            runs.append((start, s))
            start = None
    if start is not None:
        runs.append((start, len(mask)))
    return runs


def _pt(p: np.ndarray) -> tuple[int, int]:
    return round(p[0] * 16), round(p[1] * 16)  # 4 fractional bits (cv2 shift=4)


def _line(img, a, b, colour, thickness):
    cv2.line(img, _pt(a), _pt(b), colour, max(1, round(thickness)), cv2.LINE_AA, 4)


def _shaft(img, port, joint, width_tip, colour, highlight):
    d = joint - port
    length = float(np.hypot(*d)) or 1.0
    u = d / length
    n = np.array([-u[1], u[0]])
    wp = width_tip * 2.2
    poly = np.array([port + n * wp / 2, joint + n * width_tip / 2, joint - n * width_tip / 2, port - n * wp / 2])
    cv2.fillConvexPoly(img, np.round(poly * 16).astype(np.int32), colour, cv2.LINE_AA, 4)
    _line(img, port + n * wp * 0.2, joint + n * width_tip * 0.2, highlight, max(1.0, width_tip * 0.25))
    return u, n


def _draw_grasper(img: np.ndarray, tip: np.ndarray, port: np.ndarray, u: np.ndarray, n: np.ndarray, ep: _Episode,
                  t: float, s: float) -> None:
    """Grasper: two jaws opening and closing."""
    jl = 12 * s
    joint = tip - u * jl
    _shaft(img, port, joint, 6 * s, (48, 48, 52), (110, 110, 118))
    opening = 0.15 + 0.3 * (0.5 + 0.5 * math.sin(2.0 * t + ep.jaw[1]))
    for sign in (1, -1):
        end = joint + jl * (u * math.cos(opening) + sign * n * math.sin(opening))
        _line(img, joint, end, (60, 60, 66), 4.2 * s)
        _line(img, joint, end, (165, 165, 175), 2.2 * s)


def _draw_clipper(img: np.ndarray, tip: np.ndarray, port: np.ndarray, u: np.ndarray, n: np.ndarray, ep: _Episode,
                  t: float, s: float) -> None:
    """Clipper: two silver jaws holding a gold clip."""
    jl = 11 * s
    joint = tip - u * jl
    _shaft(img, port, joint, 6.5 * s, (150, 150, 155), (215, 215, 220))
    for sign in (1, -1):
        _line(img, joint + sign * n * 3 * s, tip + sign * n * 3 * s, (190, 190, 198), 2.4 * s)
    clip = np.array([tip - u * 5 * s + n * 2.5 * s, tip + n * 2.5 * s, tip - n * 2.5 * s, tip - u * 5 * s - n * 2.5 * s])
    cv2.polylines(img, [np.round(clip * 16).astype(np.int32)], False, (235, 190, 50), max(1, round(2 * s)),
                  cv2.LINE_AA, 4)


def _draw_hook(img: np.ndarray, tip: np.ndarray, port: np.ndarray, u: np.ndarray, n: np.ndarray, ep: _Episode,
               t: float, s: float) -> None:
    """Monopolar hook (one kind of Coagulation Instrument)."""
    joint = tip - u * 9 * s
    _shaft(img, port, joint, 4.5 * s, (22, 22, 24), (75, 75, 80))
    _line(img, joint, tip, (215, 215, 208), 3.2 * s)
    _line(img, tip, tip + n * 5 * s, (200, 200, 205), 1.8 * s)


def _draw_bipolar(img: np.ndarray, tip: np.ndarray, port: np.ndarray, u: np.ndarray, n: np.ndarray, ep: _Episode,
                  t: float, s: float) -> None:
    """Bipolar forceps (the other kind of Coagulation Instrument)."""
    jl = 10 * s
    joint = tip - u * jl
    _shaft(img, port, joint, 5 * s, (62, 72, 150), (120, 130, 200))
    for sign in (1, -1):
        _line(img, joint + sign * n * 1.6 * s, tip + sign * n * 2.4 * s, (205, 205, 215), 1.4 * s)
        cv2.circle(img, _pt(tip + sign * n * 2.4 * s), max(1, round(1.2 * s)) * 16, (80, 110, 220), -1,
                   cv2.LINE_AA, 4)


def _draw_scissors(img: np.ndarray, tip: np.ndarray, port: np.ndarray, u: np.ndarray, n: np.ndarray, ep: _Episode,
                   t: float, s: float) -> None:
    """Scissors: two curved blades opening a little."""
    bl = 14 * s
    joint = tip - u * bl
    _shaft(img, port, joint, 5.5 * s, (40, 40, 44), (100, 100, 108))
    spread = 0.25 + 0.15 * math.sin(3.0 * t + ep.jaw[1])
    for sign in (1, -1):
        a = joint + sign * n * 2 * s
        b = tip - sign * n * bl * math.sin(spread) * 0.5
        mid = (a + b) / 2 + sign * n * 1.5 * s
        cv2.polylines(img, [np.round(np.array([a, mid, b]) * 16).astype(np.int32)], False, (215, 215, 228),
                      max(1, round(2.2 * s)), cv2.LINE_AA, 4)


def _draw_suction(img: np.ndarray, tip: np.ndarray, port: np.ndarray, u: np.ndarray, n: np.ndarray, ep: _Episode,
                  t: float, s: float) -> None:
    """Suction-Irrigation: a pale tube with holes near its tip."""
    _shaft(img, port, tip, 5 * s, (200, 202, 196), (245, 245, 240))
    cv2.circle(img, _pt(tip), round(2.6 * s * 16), (205, 207, 200), -1, cv2.LINE_AA, 4)
    for k in (3.5, 6.5):
        cv2.circle(img, _pt(tip - u * k * s), max(1, round(0.9 * s * 16)), (50, 50, 50), -1, cv2.LINE_AA, 4)


def _draw_bag(img: np.ndarray, tip: np.ndarray, port: np.ndarray, u: np.ndarray, n: np.ndarray, ep: _Episode,
              t: float, s: float) -> None:
    """Specimen Bag: a translucent wobbling sack on a string to its port."""
    centre = tip
    angles = np.linspace(0, 2 * math.pi, 18, endpoint=False)
    rng = np.random.default_rng(int(ep.jaw[1] * 1000))
    radius = (1 + 0.18 * rng.standard_normal(len(angles))) * (0.75 + 0.35 * (0.5 + 0.5 * math.sin(ep.jaw[1])))
    rx, ry = 20 * s, 14 * s
    pts = np.stack([centre[0] + rx * radius * np.cos(angles + 0.05 * t),
                    centre[1] + ry * radius * np.sin(angles + 0.05 * t)], axis=1)
    overlay = img.copy()
    poly = np.round(pts * 16).astype(np.int32)
    cv2.fillPoly(overlay, [poly], (226, 212, 190), cv2.LINE_AA, 4)
    cv2.addWeighted(overlay, 0.62, img, 0.38, 0, dst=img)
    cv2.polylines(img, [poly], True, (175, 160, 140), max(1, round(1.0 * s)), cv2.LINE_AA, 4)
    _line(img, centre - np.array([rx, 0]) * 0.2, port, (200, 195, 170), 1.0 * s)


def _draw_stapler(img: np.ndarray, tip: np.ndarray, port: np.ndarray, u: np.ndarray, n: np.ndarray, ep: _Episode,
                  t: float, s: float) -> None:
    """Stapler (HeiChole only): a wide jaw."""
    jl = 22 * s
    joint = tip - u * jl
    _shaft(img, port, joint, 9 * s, (55, 58, 62), (120, 120, 130))
    jaw = np.array([joint + n * 4 * s, tip + n * 4 * s, tip - n * 4 * s, joint - n * 4 * s])
    cv2.fillConvexPoly(img, np.round(jaw * 16).astype(np.int32), (75, 85, 115), cv2.LINE_AA, 4)
    _line(img, joint, tip, (140, 150, 180), 1.5 * s)


def _draw_coagulation(img: np.ndarray, tip: np.ndarray, port: np.ndarray, u: np.ndarray, n: np.ndarray, ep: _Episode,
                      t: float, s: float) -> None:
    """A hook or a bipolar forceps, by the episode's kind."""
    (_draw_hook if ep.kind == 0 else _draw_bipolar)(img, tip, port, u, n, ep, t, s)


_DRAW = {GRASPER: _draw_grasper, CLIPPER: _draw_clipper, COAG: _draw_coagulation, SCISSORS: _draw_scissors,
         SUCTION: _draw_suction, BAG: _draw_bag, STAPLER: _draw_stapler}


def _draw_tool(img: np.ndarray, tool: int, ep: _Episode, t: float, s: float) -> np.ndarray:
    """Draw `tool` at time `t` of its episode (scale `s`), from its port to its tip; returns the tip."""
    tip = ep.tip(t)
    port = ep.port
    d = tip - port
    u = d / (float(np.hypot(*d)) or 1.0)
    n = np.array([-u[1], u[0]])
    if tool in _DRAW:
        _DRAW[tool](img, tip, port, u, n, ep, t, s)
    return tip


def _inside(p: np.ndarray, rect: tuple[float, float, float, float], margin: float) -> bool:
    x0, y0, x1, y1 = rect
    return x0 + margin <= p[0] <= x1 - margin and y0 + margin <= p[1] <= y1 - margin


def _segment_visible(a: np.ndarray, b: np.ndarray, rect: tuple[float, float, float, float]) -> bool:
    """Liang-Barsky: does segment a-b cross the rectangle?"""
    x0, y0, x1, y1 = rect
    d = b - a
    t0, t1 = 0.0, 1.0
    for p, q in ((-d[0], a[0] - x0), (d[0], x1 - a[0]), (-d[1], a[1] - y0), (d[1], y1 - a[1])):
        if p == 0:
            if q < 0:
                return False
        else:
            r = q / p
            if p < 0:
                t0 = max(t0, r)
            else:
                t1 = min(t1, r)
            if t0 > t1:
                return False
    return True


# --------------------------------------------------------------------------- one video


def _border_px(plan: VideoPlan, t: float, width: int) -> int:
    fraction = plan.border_alt if plan.alt_start <= t < plan.alt_end else plan.border
    return round(fraction * width)


def _info_bar(frame: np.ndarray, t: float, s: float) -> int:
    h, w = frame.shape[:2]
    bar = max(6, round(0.075 * h))
    frame[h - bar:] = (8, 8, 8)
    clock = int(t) + 9 * 3600 + 41 * 60
    text = f"{clock // 3600:02d}:{clock // 60 % 60:02d}:{clock % 60:02d}"
    cv2.putText(frame, text, (int(4 * s), h - int(bar * 0.25)), cv2.FONT_HERSHEY_PLAIN, 0.6 * s * (bar / (0.075 * 136)),
                (245, 245, 245), 1, cv2.LINE_AA)
    cv2.rectangle(frame, (w - int(30 * s), h - bar + 2), (w - int(6 * s), h - 3), (240, 240, 240), -1)
    return bar


def _render(plan: VideoPlan, path: Path, width: int, height: int, seed: int,
            tick: Callable[[int], None]) -> np.ndarray:
    """Write the video; returns per-frame labels (frames, 7) for HeiChole's rule plus a shaft
    column, and for Cholec80 (frames, 8): tip-visible per slot (hook and bipolar apart)."""
    rng = _rng(seed, plan, 2)
    scene = _Scene(plan, width, height, rng)
    s = scene.s
    bar = max(6, round(0.075 * height)) if plan.info_bar else 0
    widest = round(max(plan.border, plan.border_alt) * width)
    active = (float(widest), 0.0, float(width - widest), float(height - bar))
    tracks: list[tuple[int, list[_Episode]]] = []
    for tool in range(N_TOOLS):
        tracks.append((tool, _episodes(plan, tool, _runs(plan.presence[:, tool]), active, _rng(seed, plan, 20 + tool), s)))
    if plan.stapler_run is not None:
        tracks.append((STAPLER, _episodes(plan, STAPLER, [plan.stapler_run], active, _rng(seed, plan, 30), s)))
    order = [BAG, SUCTION, STAPLER, CLIPPER, SCISSORS, COAG, GRASPER]  # back to front
    tracks.sort(key=lambda tr: order.index(tr[0]))

    writer = cv2.VideoWriter(os.fspath(path), cv2.VideoWriter_fourcc(*FOURCC), float(plan.fps), (width, height))
    if not writer.isOpened():
        raise RuntimeError(f"{path}: this OpenCV build cannot write '{FOURCC}' mp4 files "
                           f"({decoder_id()['backend']} backend)")
    n = plan.frames
    # per frame: tip visible (8: 6 slots with coag split into hook/bipolar at 6/7... see below)
    tip_seen = np.zeros((n, 8), bool)  # 0..5 slots (coag=hook), 6 stapler, 7 bipolar
    shaft_seen = np.zeros((n, 8), bool)
    try:
        for k in range(n):
            t = k / plan.fps
            white = any(start <= t < end for start, end in plan.white)
            frame = scene.background(t)
            b = _border_px(plan, t, width)
            rect = (float(b), 0.0, float(width - b), float(height - bar))
            smoke = None
            for tool, episodes in tracks:
                for ep in episodes:
                    if ep.depth(t) <= 0.0:
                        continue
                    tip = _draw_tool(frame, tool, ep, t, s)
                    slot = 7 if (tool == COAG and ep.kind == 1) else tool
                    tip_seen[k, slot] = _inside(tip, rect, 3 * s)
                    shaft_seen[k, slot] = _segment_visible(ep.port, tip, rect)
                    if tool == COAG and ep.kind == 0 and tip_seen[k, slot]:
                        smoke = tip
            if smoke is not None and math.sin(3.1 * t) > -0.2:
                _blend_smoke(frame, scene.smoke, smoke, 0.45 * (0.5 + 0.5 * math.sin(3.1 * t)))
            frame = scene.finish(frame, k)
            if b > 0:
                frame[:, :b] = 3
                frame[:, width - b:] = 3
            if white:
                frame[:] = 255
                tip_seen[k] = shaft_seen[k] = False
            if bar:
                _info_bar(frame, t, s)
            writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
            tick(1)
    finally:
        writer.release()
    return np.concatenate([tip_seen, shaft_seen], axis=1)


def _blend_smoke(frame: np.ndarray, sprite: np.ndarray, at: np.ndarray, strength: float) -> None:
    h, w = frame.shape[:2]
    sh, sw = sprite.shape
    x0, y0 = int(at[0]) - sw // 2, int(at[1]) - sh // 2 - sh // 4
    fx0, fy0, fx1, fy1 = max(0, x0), max(0, y0), min(w, x0 + sw), min(h, y0 + sh)
    if fx0 >= fx1 or fy0 >= fy1:
        return
    a = sprite[fy0 - y0:fy1 - y0, fx0 - x0:fx1 - x0, None] * strength
    roi = frame[fy0:fy1, fx0:fx1].astype(np.float32)
    frame[fy0:fy1, fx0:fx1] = (roi * (1 - a) + 225.0 * a).astype(np.uint8)


# --------------------------------------------------------------------------- annotation files


def _heichole_labels(seen: np.ndarray) -> np.ndarray:
    """HeiChole's rule per frame: a tool is present from the first frame its tip is visible
    until its shaft leaves. Returns (frames, 21) category columns c0..c20."""
    tip, shaft = seen[:, :8], seen[:, 8:]
    n = tip.shape[0]
    cats = np.zeros((n, 21), np.uint8)
    slots = {GRASPER: [GRASPER], CLIPPER: [CLIPPER], COAG: [COAG, 7], SCISSORS: [SCISSORS], SUCTION: [SUCTION],
             BAG: [BAG], STAPLER: [STAPLER]}
    undefined = np.zeros(n, bool)
    for category, columns in slots.items():
        for col in columns:
            present = np.zeros(n, bool)
            state = False
            for k in range(n):
                if not shaft[k, col] and not tip[k, col]:
                    state = False
                elif tip[k, col]:
                    state = True
                present[k] = state
            cats[:, category] |= present
            undefined |= shaft[:, col] & ~present
    cats[:, 20] = undefined
    return cats


def _write_text(path: Path, text: str) -> None:
    with open(path, "w", newline="\n") as fh:
        fh.write(text)


def _write_cholec80(root: Path, plan: VideoPlan, seen: np.ndarray) -> dict[str, int]:
    tip = seen[:, :8]
    rows = ["Frame\tGrasper\tBipolar\tHook\tScissors\tClipper\tIrrigator\tSpecimenBag"]
    counts = np.zeros(N_TOOLS, np.int64)
    for sec in range(plan.seconds):
        k = sec * 25 if plan.fps == 25 else round(sec * plan.fps)
        v = tip[k]
        cols = [v[GRASPER], v[7], v[COAG], v[SCISSORS], v[CLIPPER], v[SUCTION], v[BAG]]
        rows.append("\t".join([str(25 * sec)] + [str(int(c)) for c in cols]))
        counts += np.array([v[GRASPER], v[CLIPPER], v[COAG] or v[7], v[SCISSORS], v[SUCTION], v[BAG]], np.int64)
    _write_text(root / "tool_annotations" / f"{plan.id}-tool.txt", "\n".join(rows) + "\n")
    phase_rows = ["Frame\tPhase"] + [f"{k}\t{PHASES[plan.phases[min(plan.seconds - 1, k // plan.fps)]]}"
                                      for k in range(plan.frames)]
    _write_text(root / "phase_annotations" / f"{plan.id}-phase.txt", "\n".join(phase_rows) + "\n")
    return {"frames_1fps": plan.seconds, **{str(i): int(c) for i, c in enumerate(counts)}}


def _write_heichole(root: Path, plan: VideoPlan, seen: np.ndarray) -> dict[str, int]:
    cats = _heichole_labels(seen)
    lines = [f"{k}," + ",".join(str(int(v)) for v in cats[k]) for k in range(plan.frames)]
    ann = root / "Annotations"
    _write_text(ann / "Instrument" / f"{plan.id}_Annotation_Instrument.csv", "\n".join(lines) + "\n")
    phase = [f"{k},{HEICHOLE_PHASE_ID[PHASES[plan.phases[min(plan.seconds - 1, k // plan.fps)]]]}"
             for k in range(plan.frames)]
    _write_text(ann / "Phase" / f"{plan.id}_Annotation_Phase.csv", "\n".join(phase) + "\n")
    step = plan.fps
    sampled = cats[::step][:, :N_TOOLS]
    white = np.array([any(a <= sec < b for a, b in plan.white) for sec in range(len(sampled))])
    counts = sampled[~white].sum(axis=0, dtype=np.int64)
    return {"frames_1fps": int((~white).sum()), **{str(i): int(c) for i, c in enumerate(counts)}}


# --------------------------------------------------------------------------- entry point


def _check_int(name: str, value, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be a whole number {bound}, got {value!r}")
    return int(value)


def _check_options(**options: int | None) -> dict[str, int | None]:
    """The generator's size options, checked (ValueError naming the option), in their order."""
    checked = {
        "videos": _check_int("videos", options["videos"], 2, 16),
        "heichole_videos": _check_int("heichole_videos", options["heichole_videos"], 4, 12),
        "seconds": _check_int("seconds", options["seconds"], 8, 3600),
        "heichole_seconds": (None if options["heichole_seconds"] is None
                             else _check_int("heichole_seconds", options["heichole_seconds"], 8, 3600)),
        "width": _check_int("width", options["width"], 64, 1920),
        "height": _check_int("height", options["height"], 36, 1080),
    }
    if checked["width"] % 2 or checked["height"] % 2:
        raise ValueError(f"width and height must be even (mp4v drops an odd row or column), "
                         f"got {checked['width']}x{checked['height']}")
    checked["split_seed"] = _check_int("split_seed", options["split_seed"], 0)
    return checked


def _frame_counter(total: int, progress: Callable[[int, int], None] | None) -> Callable[[int], None]:
    """`tick(k)`: k more frames written (by any thread); reports every 200 frames and the last."""
    import threading

    done = [0]
    lock = threading.Lock()

    def tick(k: int) -> None:
        with lock:
            done[0] += k
            value = done[0]
        if progress is not None and (value % 200 == 0 or value == total):
            progress(value, total)

    return tick


def _client_counts(plans: list[VideoPlan], results: list[dict]) -> dict[str, dict[str, dict]]:
    """client -> split -> its videos, labelled frames at 1 fps and frames per tool."""
    clients: dict[str, dict[str, dict]] = {}
    for plan, res in zip(plans, results):
        entry = clients.setdefault(plan.client, {}).setdefault(plan.split, {"videos": [], "frames": 0,
                                                                          "tool_frames": [0] * N_TOOLS})
        entry["videos"].append(plan.id)
        entry["frames"] += res["frames_1fps"]
        for i in range(N_TOOLS):
            entry["tool_frames"][i] += res[str(i)]
    return clients


def generate_surgical(
    out: Path | str,
    *,
    seed: int = 0,
    videos: int = 4,
    heichole_videos: int = 6,
    seconds: int = 30,
    heichole_seconds: int | None = None,
    width: int = 240,
    height: int = 136,
    split_seed: int = 0,
    workers: int | None = None,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Write synthetic Cholec80-layout and HeiChole-layout copies into `out` (see the module
    docstring) and return a summary {"root", "cholec80", "heichole", "videos", "frames",
    "clients": {client: {split: {"videos", "frames", "tool_frames"}}}, "seconds_taken"}.

    videos: Cholec80 videos of CHO1 and of CHO3, 2..16 (CHO2 gets twice as many); heichole_videos:
    videos per HeiChole centre (4..12; 3 of them are test videos); seconds: mean Cholec80
    video length (each client's videos span 0.8-1.2x); heichole_seconds: mean HeiChole
    length (default: ``default_heichole_seconds``, about 3/4 of CHO1's frames per HeiChole
    client); width, height: even frame size of the mp4 files;
    split_seed: the seed ``thesis_clients`` will draw the HeiChole test videos with (HEI2's
    test set is generated without Suction-Irrigation); workers: videos written in parallel
    (default 2). Written into a temporary sibling and renamed: nothing half-written.
    Raises ValueError for a bad option, FileExistsError if `out` is not empty (unless
    `overwrite`)."""
    import time

    seed = _check_int("seed", seed, 0)
    options = _check_options(videos=videos, heichole_videos=heichole_videos, seconds=seconds,
                             heichole_seconds=heichole_seconds, width=width, height=height, split_seed=split_seed)
    videos, heichole_videos, seconds, heichole_seconds, width, height, split_seed = options.values()
    out = Path(out)
    check_output_dir(out, overwrite)
    start_time = time.perf_counter()
    plans = plan_videos(seed=seed, videos=videos, heichole_videos=heichole_videos, seconds=seconds,
                        heichole_seconds=heichole_seconds, split_seed=split_seed)
    total = sum(p.frames for p in plans)
    tick = _frame_counter(total, progress)
    with atomic_directory(out, overwrite) as tmp:
        cho, hei = tmp / "cholec80", tmp / "heichole"
        for folder in (cho / "videos", cho / "tool_annotations", cho / "phase_annotations", hei / "Videos" / "Full",
                       hei / "Annotations" / "Instrument", hei / "Annotations" / "Phase"):
            folder.mkdir(parents=True)
        if progress is not None:
            progress(0, total)

        def one(plan: VideoPlan) -> dict:
            if plan.dataset == "cholec80":
                seen = _render(plan, cho / "videos" / f"{plan.id}.mp4", width, height, seed, tick)
                return _write_cholec80(cho, plan, seen)
            seen = _render(plan, hei / "Videos" / "Full" / f"{plan.id}.mp4", width, height, seed, tick)
            return _write_heichole(hei, plan, seen)

        n_workers = workers if workers is not None else min(2, os.cpu_count() or 1)
        with ThreadPoolExecutor(max_workers=max(1, n_workers), thread_name_prefix="fedcare-synth") as pool:
            results = list(pool.map(one, plans))
        clients = _client_counts(plans, results)
        marker = {"generator": GENERATOR, "seed": seed, "options": options, "note": NOTE,
                  "encoder": {"fourcc": FOURCC, **decoder_id()},
                  "clients": {c: {s: {"videos": v["videos"]} for s, v in sp.items()} for c, sp in clients.items()}}
        text = json.dumps(marker, indent=2, sort_keys=True) + "\n"
        for folder in (tmp, cho, hei):
            _write_text(folder / SYNTHETIC_MARKER, text)
    ordered = {c: clients[c] for c in ("HEI1", "HEI2", "CHO1", "CHO2", "CHO3") if c in clients}
    return {
        "root": str(out), "cholec80": str(out / "cholec80"), "heichole": str(out / "heichole"),
        "videos": len(plans), "frames": total, "clients": ordered,
        "seconds_taken": round(time.perf_counter() - start_time, 2),
    }

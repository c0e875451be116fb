"""What a synthetic surgical video shows over time (`fedcare.data.surgical.synthetic`): the
tool slots, the surgical phases and their tool rates, the five clients' colour profiles and
borders, and `plan_videos`, which draws every video's plan (length, fps, border, phases,
which tool is present each second) before anything is drawn."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from fedcare.data.surgical.heichole import test_videos
from fedcare.errors import InputError


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



def plan_rng(seed: int, plan: VideoPlan, stream: int) -> np.random.Generator:
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
        raise InputError(f"videos={videos} needs {len(train_slots)} train and {len(test_slots)} test Cholec80 "
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
        raise InputError(f"heichole_videos must be 4..12 (3 test videos per centre plus training), got {heichole_videos}")
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
    rng = plan_rng(seed, plan, 1)
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
            rng = plan_rng(seed, plan, 10 + tool)
            best = int(np.argmax(plan.rates[:, tool]))
            where = [s for s in np.flatnonzero(plan.phases == best) if not _censored(plan, s)]
            if not where:
                where = [s for s in range(plan.seconds - 1) if not _censored(plan, s)]
            start = int(rng.choice(where))
            plan.presence[start:min(plan.seconds, start + 2), tool] = True

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

import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from fedcare.data.common import SYNTHETIC_MARKER
from fedcare.data.surgical.drawing import FOURCC, render_video
from fedcare.data.surgical.timeline import (BAG, CLIPPER, COAG, GRASPER, HEICHOLE_PHASE_ID, N_TOOLS, PHASES, SCISSORS,
                                            STAPLER, SUCTION, VideoPlan, default_heichole_seconds, plan_videos)
from fedcare.data.synthetic.output import atomic_directory, check_output_dir
from fedcare.data.video import decoder_id
from fedcare.errors import InputError

__all__ = ["GENERATOR", "PHASES", "default_heichole_seconds", "generate_surgical", "plan_videos"]


GENERATOR = "fedcare.data.synthetic.surgical"  # the marker keeps the name from before the dataset packages (same bytes)

NOTE = "SYNTHETIC data, not Cholec80 / HeiChole: no patient, no surgery"



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



def _check_int(name: str, value, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise InputError(f"{name} must be a whole number {bound}, got {value!r}")
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
        raise InputError(f"width and height must be even (mp4v drops an odd row or column), "
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
    check_output_dir(out, overwrite, GENERATOR)
    start_time = time.perf_counter()
    plans = plan_videos(seed=seed, videos=videos, heichole_videos=heichole_videos, seconds=seconds,
                        heichole_seconds=heichole_seconds, split_seed=split_seed)
    total = sum(p.frames for p in plans)
    tick = _frame_counter(total, progress)
    with atomic_directory(out, overwrite, GENERATOR) as tmp:
        cho, hei = tmp / "cholec80", tmp / "heichole"
        for folder in (cho / "videos", cho / "tool_annotations", cho / "phase_annotations", hei / "Videos" / "Full",
                       hei / "Annotations" / "Instrument", hei / "Annotations" / "Phase"):
            folder.mkdir(parents=True)
        if progress is not None:
            progress(0, total)

        def one(plan: VideoPlan) -> dict:
            if plan.dataset == "cholec80":
                seen = render_video(plan, cho / "videos" / f"{plan.id}.mp4", width, height, seed, tick)
                return _write_cholec80(cho, plan, seen)
            seen = render_video(plan, hei / "Videos" / "Full" / f"{plan.id}.mp4", width, height, seed, tick)
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

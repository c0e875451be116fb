"""Synthetic chest X-rays in the Sait et al. layout, for tests and the FedHealth 2 demo.

Each image is a drawn chest: a bright body, two dark lung fields, spine and ribs, plus a
class-dependent finding — Normal: clear lungs; COVID-19: bilateral, peripheral, patchy
ground-glass haze in the lower lungs; Pneumonia-Bacterial: one dense lobar consolidation;
Pneumonia-Viral: diffuse interstitial streaks in both lungs. Like the real collection (15
sources), images vary in size, mode (greyscale or RGB JPEG), brightness, contrast and noise,
and each image draws its own "source". Findings vary in extent, so some cases are subtle.
Deterministic from the seed. Written atomically with a `fedcare-synthetic.json` marker.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np

from fedcare.data.synthetic.output import atomic_directory
from fedcare.data.common import MAX_IMAGE_SIZE, MAX_SCALE, SYNTHETIC_MARKER
from fedcare.data.xray.reader import CLASSES
from fedcare.errors import InputError

ROOT_NAME = "Curated X-Ray Dataset"
REAL_COUNTS = {"COVID-19": 1281, "Normal": 3270, "Pneumonia-Bacterial": 3001, "Pneumonia-Viral": 1656}
N_SOURCES = 15
GENERATOR = "fedcare.data.synthetic.xray"  # in the marker; --overwrite replaces only a copy it names


def _chest(rng: np.random.Generator, size: int, label: str) -> np.ndarray:
    img = np.full((size, size), 40.0)
    c = size / 2
    cv2.ellipse(img, (int(c), int(size * 0.55)), (int(size * 0.42), int(size * 0.5)), 0, 0, 360, 150, -1)
    lungs = np.zeros((size, size), np.uint8)
    for side in (-1, 1):
        centre = (int(c + side * size * 0.19 * rng.uniform(0.9, 1.1)), int(size * 0.5))
        axes = (int(size * 0.14 * rng.uniform(0.9, 1.1)), int(size * 0.3 * rng.uniform(0.9, 1.1)))
        cv2.ellipse(lungs, centre, axes, 0, 0, 360, 255, -1)
    img[lungs > 0] = 60
    for k in range(6):  # ribs
        y = int(size * (0.28 + 0.09 * k))
        cv2.ellipse(img, (int(c), y), (int(size * 0.36), int(size * 0.05)), 0, 180, 360, 95, max(1, size // 64))
    cv2.rectangle(img, (int(c - size * 0.03), int(size * 0.1)), (int(c + size * 0.03), size), 175, -1)  # spine
    finding = np.zeros((size, size))
    severity = rng.uniform(0.35, 1.0)
    if label == "COVID-19":
        for side in (-1, 1):
            for _ in range(rng.integers(2, 5)):
                x = c + side * size * rng.uniform(0.24, 0.31)
                y = size * rng.uniform(0.5, 0.75)
                cv2.circle(finding, (int(x), int(y)), int(size * rng.uniform(0.04, 0.08)), 1.0, -1)
        finding = cv2.GaussianBlur(finding, (0, 0), size / 25) * 45
    elif label == "Pneumonia-Bacterial":
        side = rng.choice([-1, 1])
        centre = (int(c + side * size * 0.19), int(size * rng.uniform(0.45, 0.7)))
        cv2.ellipse(finding, centre, (int(size * 0.1), int(size * 0.09)), rng.uniform(0, 180), 0, 360, 1.0, -1)
        finding = cv2.GaussianBlur(finding, (0, 0), size / 60) * 70
    elif label == "Pneumonia-Viral":
        for _ in range(rng.integers(10, 18)):
            side = rng.choice([-1, 1])
            x0 = c + side * size * rng.uniform(0.1, 0.28)
            y0 = size * rng.uniform(0.3, 0.75)
            angle = rng.uniform(0, np.pi)
            length = size * rng.uniform(0.05, 0.12)
            p1 = (int(x0), int(y0))
            p2 = (int(x0 + length * np.cos(angle)), int(y0 + length * np.sin(angle)))
            cv2.line(finding, p1, p2, 1.0, max(1, size // 80))
        finding = cv2.GaussianBlur(finding, (0, 0), size / 120) * 40
    img += finding * severity * (lungs > 0)
    return img


def _source_look(img: np.ndarray, rng: np.random.Generator, source: int, seed: int) -> np.ndarray:
    look = np.random.default_rng([seed, 1000 + source])  # each source: its own exposure and contrast
    gain, offset, noise = look.uniform(0.7, 1.3), look.uniform(-25, 25), look.uniform(2, 9)
    img = (img - 100) * gain + 100 + offset + rng.normal(0, noise, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def generate_xray(
    out: Path,
    *,
    seed: int = 0,
    scale: float = 0.02,
    image_size: int = 64,
    sites: int | None = None,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Write `scale` times the real class counts (at least 4 each) into
    `out/Curated X-Ray Dataset/<Class>/<Class> (<n>).jpg`. With `sites`, write one copy per
    site instead, `out/site-<k>/Curated X-Ray Dataset/...` (k = 1..sites), each holding every
    `sites`-th image of each class in its own source look (exposure, contrast, noise): the
    natural split of a multi-hospital collection. Returns {"root", "images", "classes"}."""
    if not (math.isfinite(scale) and 0 < scale <= MAX_SCALE):  # nan passed `scale <= 0`
        raise InputError(f"scale must be a number above 0 and at most {MAX_SCALE:g} (times the real class counts), "
                         f"got {scale}")
    if not 16 <= image_size <= MAX_IMAGE_SIZE:
        raise InputError(f"image_size must be from 16 to {MAX_IMAGE_SIZE} pixels, got {image_size}")
    if sites is not None and sites < 2:
        raise InputError(f"sites must be at least 2, got {sites}")
    counts = {name: max(4, round(REAL_COUNTS[name] * scale)) for name in CLASSES}
    total, done = sum(counts.values()), 0
    note = {"generator": GENERATOR, "seed": seed, "note": "SYNTHETIC chest X-rays, not patients",
            "options": {"scale": scale, "image_size": image_size, "sites": sites}}
    marker = json.dumps(note, indent=2, sort_keys=True) + "\n"
    with atomic_directory(Path(out), overwrite, GENERATOR) as tmp:
        folders = [tmp] if sites is None else [tmp / f"site-{k}" for k in range(1, sites + 1)]
        for index, name in enumerate(CLASSES):
            for folder in folders:
                (folder / ROOT_NAME / name).mkdir(parents=True)
            written = [0] * len(folders)
            for n in range(1, counts[name] + 1):
                rng = np.random.default_rng([seed, index, n])
                size = int(image_size * rng.uniform(1.0, 1.5))  # sizes vary, as in the collated sources
                chest = _chest(rng, size, name)
                site = 0 if sites is None else (n - 1) % sites
                source = int(rng.integers(N_SOURCES)) if sites is None else site  # a site is one source
                img = _source_look(chest, rng, source, seed)
                if rng.random() < 0.5:
                    img = cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
                folder = folders[site] / ROOT_NAME / name
                written[site] += 1
                cv2.imwrite(str(folder / f"{name} ({written[site]}).jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 90])
                done += 1
                if progress:
                    progress(done, total)
        for folder in {tmp, *folders}:  # every copy says it is synthetic, also read on its own
            (folder / SYNTHETIC_MARKER).write_text(marker)
    return {"root": str(out), "images": total, "classes": counts}

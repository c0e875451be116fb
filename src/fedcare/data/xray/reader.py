"""Loader for the curated COVID-19 chest X-ray dataset of Sait et al. 2020 (Mendeley
9xkhgts2s6), as the FedHealth 2 study uses it (reference/dataset-formats.md §5).

Layout: a folder holding exactly the four class folders ``COVID-19/``, ``Normal/``,
``Pneumonia-Bacterial/``, ``Pneumonia-Viral/`` with ``<Class> (<n>).jpg`` files (spaces and
parentheses in the names). Copies nest it at different depths (``Curated X-Ray Dataset/``,
doubled, or under the long Mendeley folder name), so the loader searches below the given
path for the folder that contains the four class folders. Class = folder; there is no split.
Images vary in size and mode; `read_xray` returns greyscale resized to a square.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from fedcare.data.common import SYNTHETIC_MARKER, DataError

CLASSES = ("COVID-19", "Normal", "Pneumonia-Bacterial", "Pneumonia-Viral")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
MAX_SEARCH_DEPTH = 4


class XrayLayoutError(DataError):
    """The path does not hold the dataset's layout; the message names the path."""


class XrayImageError(DataError):
    """An image that cannot be read; the message names the file."""


@dataclass
class XrayDataset:
    root: Path  # the folder holding the four class folders
    paths: list[Path]  # sorted by class, then file name
    labels: np.ndarray  # int64 index into CLASSES
    synthetic: bool

    def class_counts(self) -> dict[str, int]:
        return {name: int((self.labels == i).sum()) for i, name in enumerate(CLASSES)}


def find_class_root(path: Path) -> Path:
    """The folder at or below `path` (breadth-first, a few levels) holding the four class folders."""
    path = Path(path)
    if not path.is_dir():
        raise XrayLayoutError(f"{path}: no such folder")
    level = [path]
    for _ in range(MAX_SEARCH_DEPTH + 1):
        for folder in level:
            if all((folder / c).is_dir() for c in CLASSES):
                return folder
        level = sorted(p for folder in level for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    raise XrayLayoutError(
        f"{path}: no folder with the four class folders {', '.join(CLASSES)} found "
        f"(expected the Sait et al. 'Curated X-Ray Dataset' layout)"
    )


def _is_synthetic(root: Path, start: Path) -> bool:
    """A fedcare marker in the class root or any folder between it and the path given."""
    folder = root
    while True:
        if (folder / SYNTHETIC_MARKER).is_file():
            return True
        if folder == start or folder == folder.parent:
            return False
        folder = folder.parent


def load_xray(path: Path | str) -> XrayDataset:
    start = Path(path)
    root = find_class_root(start)
    paths, labels = [], []
    for index, name in enumerate(CLASSES):
        files = sorted(
            (Path(e.path) for e in os.scandir(root / name) if e.is_file() and e.name.lower().endswith(IMAGE_SUFFIXES)),
            key=lambda p: p.name,
        )
        paths += files
        labels += [index] * len(files)
    if not paths:
        raise XrayLayoutError(f"{root}: the class folders hold no .jpg images")
    return XrayDataset(root, paths, np.array(labels, dtype=np.int64), _is_synthetic(root, start))


def read_xray(path: Path, size: int) -> np.ndarray:
    """Greyscale uint8 (size, size); any colour mode is converted, any size resized."""
    image = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE)
    if image is None:
        raise XrayImageError(f"{path}: cannot read image (missing or corrupt)")
    return cv2.resize(image, (size, size), interpolation=cv2.INTER_AREA)

"""One UNBC-McMaster file each: a PSPI label, a FACS file, landmarks, a sequence label, a
greyscale image. Errors name the file (`fedcare.data.unbc.reader` reads the whole layout)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import cv2
import numpy as np

from fedcare.data.common import DataError
from fedcare.data.video import quiet_opencv

PSPI_MAX = 16.0
N_LANDMARKS = 66


class UnbcFileError(DataError):
    """A label, landmark or sequence file that cannot be read; the message names the path."""


class UnbcImageError(DataError):
    """A frame image is missing or cannot be decoded; the message names the path."""


def _read_text(path: Path | str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError as e:
        raise UnbcFileError(f"{path}: cannot read file ({e.strerror or e})") from None


def _number(token: str, path: Path | str, what: str) -> float:
    try:
        value = float(token)
    except ValueError:
        raise UnbcFileError(f"{path}: {what} {token[:40]!r} is not a number") from None
    if not math.isfinite(value):
        raise UnbcFileError(f"{path}: {what} {token!r} is not finite")
    return value


def read_pspi(path: Path | str) -> float:
    """The PSPI value of a ``Frame_Labels/PSPI/.../<frame>_facs.txt`` file (MATLAB ``e+00`` text,
    leading spaces allowed; the first whitespace-separated token is read). Raises ValueError
    naming the path if the file is empty, not a number, not finite or outside 0..16."""
    tokens = _read_text(path).split()
    if not tokens:
        raise UnbcFileError(f"{path}: empty PSPI file (expected one number like '   2.0000000e+00')")
    value = _number(tokens[0], path, "PSPI value")
    if not 0.0 <= value <= PSPI_MAX:
        raise UnbcFileError(f"{path}: PSPI value {value:g} outside 0..{PSPI_MAX:g}")
    return value


def read_facs(path: Path | str) -> dict[int, float]:
    """AU -> intensity from a ``Frame_Labels/FACS/.../<frame>_facs.txt`` file: one line per AU,
    the first two fields (AU number, intensity) read, further fields ignored. An empty file gives
    {}. Stored values are returned as they are (AU43 may be 0; see ``pspi_from_facs``). A
    repeated AU keeps its highest intensity. Raises ValueError naming the path on a bad line."""
    facs: dict[int, float] = {}
    for lineno, line in enumerate(_read_text(path).splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 2:
            raise UnbcFileError(f"{path}: line {lineno}: expected 'AU intensity', got {line.strip()[:60]!r}")
        au_value = _number(fields[0], path, f"line {lineno}: AU")
        if au_value != int(au_value) or au_value < 0:
            raise UnbcFileError(f"{path}: line {lineno}: AU {fields[0]!r} is not a non-negative whole number")
        intensity = _number(fields[1], path, f"line {lineno}: intensity")
        au = int(au_value)
        facs[au] = max(intensity, facs.get(au, intensity))
    return facs


def pspi_from_facs(facs: dict[int, float]) -> float:
    """PSPI = AU4 + max(AU6, AU7) + max(AU9, AU10) + AU43, with AU43 counted as 1 when present
    (it has no intensity grade and may be stored as 0)."""
    g = facs.get
    return g(4, 0.0) + max(g(6, 0.0), g(7, 0.0)) + max(g(9, 0.0), g(10, 0.0)) + (1.0 if 43 in facs else 0.0)


def read_landmarks(path: Path | str) -> np.ndarray:
    """The 66 AAM points of an ``AAM_landmarks/.../<frame>_aam.txt`` file as a (66, 2) float
    array (x, y). Blank lines are skipped; each line's first two fields are read. Raises
    ValueError naming the path otherwise."""
    rows = [line.split() for line in _read_text(path).splitlines()]
    rows = [r for r in rows if r]
    if len(rows) != N_LANDMARKS:
        raise UnbcFileError(f"{path}: expected {N_LANDMARKS} lines of 'x y' landmarks, found {len(rows)}")
    out = np.empty((N_LANDMARKS, 2), dtype=np.float64)
    for i, r in enumerate(rows):
        if len(r) < 2:
            raise UnbcFileError(f"{path}: line {i + 1}: expected 'x y', got {' '.join(r)[:60]!r}")
        out[i, 0] = _number(r[0], path, f"line {i + 1}: x")
        out[i, 1] = _number(r[1], path, f"line {i + 1}: y")
    return out


def read_sequence_label(path: Path | str) -> float:
    """The number in a ``Sequence_Labels/<M>/<subj>/<seq>.txt`` file. ValueError naming the path
    otherwise."""
    tokens = _read_text(path).split()
    if not tokens:
        raise UnbcFileError(f"{path}: empty sequence-label file (expected one number)")
    return _number(tokens[0], path, "value")


def imread_grey(path: Path | str) -> np.ndarray:
    img = cv2.imread(os.fspath(path), cv2.IMREAD_GRAYSCALE)
    if img is None or img.size == 0:
        raise UnbcImageError(f"{path}: cannot read image (missing or corrupt)")
    return img


def read_grey(path: Path | str) -> np.ndarray:
    """The frame as a uint8 greyscale HxW array (``cv2.imread(path, cv2.IMREAD_GRAYSCALE)``).
    Raises UnbcImageError("<path>: cannot read image (missing or corrupt)")."""
    with quiet_opencv():
        return imread_grey(path)

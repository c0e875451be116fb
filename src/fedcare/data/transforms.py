"""Face-frame preprocessing and the thesis's 4-variant augmentation (Tobis §3.3–3.4).

greyscale -> resize to the pre-crop size -> histogram equalization -> {original, flipped} x
{straight, rotated ±10°} -> centre crop -> [0, 1]. The thesis crops 250 -> 215; we keep the
ratio so other image sizes crop alike. 215/250 is also just below 1/(cos10° + sin10°) = 0.863,
the largest centred square that a 10° rotation leaves free of fill, so one crop serves both.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

CROP_RATIO = 215 / 250
ROTATION_DEGREES = 10.0
VARIANTS = ("original", "flipped", "rotated", "flipped+rotated")


def precrop_size(image_size: int, crop_ratio: float = CROP_RATIO) -> int:
    return int(math.ceil(image_size / crop_ratio))


def preprocess(grey: np.ndarray, image_size: int, crop_ratio: float = CROP_RATIO) -> np.ndarray:
    """Resize a greyscale uint8 frame to the pre-crop size and equalize its histogram."""
    if grey.ndim != 2 or grey.dtype != np.uint8:
        raise ValueError(f"expected a 2-D uint8 greyscale image, got {grey.dtype} {grey.shape}")
    side = precrop_size(image_size, crop_ratio)
    resized = cv2.resize(grey, (side, side), interpolation=cv2.INTER_AREA)
    return cv2.equalizeHist(resized)


def centre_crop(image: np.ndarray, size: int) -> np.ndarray:
    top = (image.shape[0] - size) // 2
    left = (image.shape[1] - size) // 2
    return image[top : top + size, left : left + size]


def rotate(image: np.ndarray, degrees: float) -> np.ndarray:
    h, w = image.shape
    matrix = cv2.getRotationMatrix2D(((w - 1) / 2, (h - 1) / 2), degrees, 1.0)
    return cv2.warpAffine(image, matrix, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)


def variant(image: np.ndarray, which: int, image_size: int, rotation_sign: int) -> np.ndarray:
    """Variant `which` of a pre-crop image (an index into VARIANTS), centre-cropped to
    (image_size, image_size) uint8. The rotated ones turn 10° in the direction
    `rotation_sign` (drawn per frame). Cheap enough to cut on demand from the one stored copy."""
    if which not in (0, 1, 2, 3):
        raise ValueError(f"variant {which} is not one of 0..3 {VARIANTS}")
    out = image[:, ::-1] if which in (1, 3) else image
    if which >= 2:
        out = rotate(np.ascontiguousarray(out), ROTATION_DEGREES * (1 if rotation_sign >= 0 else -1))
    return centre_crop(out, image_size)


def four_variants(image: np.ndarray, image_size: int, rotation_sign: int) -> np.ndarray:
    """(4, image_size, image_size) uint8: original, flipped, rotated, flipped+rotated."""
    return np.stack([variant(image, v, image_size, rotation_sign) for v in range(4)])

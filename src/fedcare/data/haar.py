"""Viola-Jones Haar-cascade face detection, as OpenCV's ``CascadeClassifier.detectMultiScale``.

Why this module exists: OpenCV 5 removed ``cv2.CascadeClassifier`` and no longer ships the
``cv2.data.haarcascades`` XML files (they moved to opencv_contrib); the OpenCV 4.x wheels have
both. The Hess thesis crops CelebA faces with the Haar frontal-face cascade, so fedcare needs it
on either version:

* ``backend="opencv"``: ``cv2.CascadeClassifier`` (OpenCV 4.x only).
* ``backend="numpy"``: a NumPy port of OpenCV 4.x's stump-based Haar evaluator and
  ``groupRectangles`` (below), on the same cascade file. On the synthetic faces and on
  CelebA-sized test images it returns the same boxes as OpenCV 4.14 (tests/data/test_haar.py
  compares them when OpenCV 4 is importable).
* ``backend="auto"`` (default): "opencv" when ``cv2.CascadeClassifier`` exists, else "numpy".

The cascade file: ``cv2.data.haarcascades + "haarcascade_frontalface_default.xml"`` when that
file exists, else the copy shipped in ``fedcare/data/cascades/`` (taken unchanged from the
OpenCV 4.14 wheel; Intel License Agreement kept in its header).

The port follows OpenCV 4.x ``cascadedetect.cpp``:

* scales ``1, f, f**2, ...``; window side ``round(24 * s)``; scales whose window is smaller than
  ``min_size`` are skipped, the loop stops when the window exceeds ``max_size`` or the image;
* the image is resized to ``round(W / s) x round(H / s)`` (bilinear, ``INTER_LINEAR_EXACT``) and
  24x24 windows slide with step 2 (step 1 from scale 2 on); a window rejected by the first stage
  makes the next x position be skipped;
* each window is normalised by ``sqrt(area * sum(x^2) - sum(x)^2)`` over its inner 22x22 pixels;
  windows whose standard deviation is <= 10 grey levels are rejected (flat regions);
* a stump adds ``left`` if ``feature * norm < threshold`` else ``right``; a stage rejects when its
  sum is below the stage threshold;
* hits are grouped like ``groupRectangles(rects, min_neighbors, 0.2)``: clusters of similar boxes
  (corners within 0.2 x mean side), averaged, kept when they hold more than ``min_neighbors``
  boxes, minus small boxes inside bigger stronger ones.
"""

from __future__ import annotations

import functools
import hashlib
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from fedcare.data.common import DataError

__all__ = ["CASCADE_NAME", "Cascade", "HaarCascade", "cascade_path", "group_rectangles", "opencv_has_cascade"]

CASCADE_NAME = "haarcascade_frontalface_default.xml"
_BUNDLED = Path(__file__).parent / "cascades" / CASCADE_NAME
GROUP_EPS = 0.2


@functools.lru_cache(maxsize=1)
def _blas_controller():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def single_blas_thread():
    """Context manager: BLAS runs single-threaded inside (threadpoolctl)."""
    return _blas_controller().limit(limits=1, user_api="blas")


def opencv_has_cascade() -> bool:
    """True when the installed OpenCV has ``cv2.CascadeClassifier`` (OpenCV 4.x)."""
    return hasattr(cv2, "CascadeClassifier")


def cascade_path(path: Path | str | None = None) -> Path:
    """The cascade XML to use: `path` if given, else OpenCV's own copy
    (``cv2.data.haarcascades``) when it exists, else the copy shipped with fedcare."""
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise DataError(f"{p}: cascade file not found")
        return p
    folder = getattr(getattr(cv2, "data", None), "haarcascades", None)
    if folder and (Path(folder) / CASCADE_NAME).is_file():
        return Path(folder) / CASCADE_NAME
    return _BUNDLED


@dataclass(frozen=True)
class Cascade:
    """A parsed stump-based Haar cascade (OpenCV's 'new' XML format)."""

    width: int
    height: int
    stage_sizes: tuple[int, ...]
    stage_thresholds: np.ndarray  # (stages,)
    feature: np.ndarray  # (stumps,) feature index of each stump
    threshold: np.ndarray  # (stumps,)
    left: np.ndarray  # (stumps,)
    right: np.ndarray  # (stumps,)
    rects: np.ndarray  # (features, 3, 4) x, y, w, h (unused third rect: zeros)
    weights: np.ndarray  # (features, 3)
    sha256: str


@functools.lru_cache(maxsize=4)
def _parse(path: str) -> Cascade:
    data = Path(path).read_bytes()
    try:
        root = ET.fromstring(data)
    except ET.ParseError as e:
        raise DataError(f"{path}: not a cascade XML file ({e})") from None
    node = root.find("cascade")
    if node is None or (node.findtext("featureType") or "").strip() != "HAAR" \
            or (node.findtext("stageType") or "").strip() != "BOOST":
        raise DataError(f"{path}: not an OpenCV HAAR/BOOST cascade in the new XML format")
    width, height = int(node.findtext("width")), int(node.findtext("height"))
    sizes, stage_thr, feat, thr, left, right = [], [], [], [], [], []
    for stage in node.find("stages"):
        weak = stage.find("weakClassifiers")
        sizes.append(len(weak))
        stage_thr.append(float(stage.findtext("stageThreshold")))
        for w in weak:
            nodes = w.findtext("internalNodes").split()
            leaves = w.findtext("leafValues").split()
            if len(nodes) != 4 or len(leaves) != 2:
                raise DataError(f"{path}: only stump-based cascades are supported")
            feat.append(int(nodes[2]))
            thr.append(float(nodes[3]))
            left.append(float(leaves[0]))
            right.append(float(leaves[1]))
    features = list(node.find("features"))
    rects = np.zeros((len(features), 3, 4), np.int64)
    weights = np.zeros((len(features), 3), np.float64)
    for i, f in enumerate(features):
        if int(f.findtext("tilted") or 0):
            raise DataError(f"{path}: tilted Haar features are not supported")
        for j, r in enumerate(f.find("rects")):
            x, y, w, h, wt = r.text.split()
            rects[i, j] = (int(x), int(y), int(w), int(h))
            weights[i, j] = float(wt)
    return Cascade(width, height, tuple(sizes), np.array(stage_thr, np.float32).astype(np.float64), np.array(feat, np.int64),
                   np.array(thr, np.float32).astype(np.float64), np.array(left, np.float32).astype(np.float64),
                   np.array(right, np.float32).astype(np.float64), rects, weights,
                   hashlib.sha256(data).hexdigest())


def _similar(rects: np.ndarray, eps: float) -> np.ndarray:
    """OpenCV's SimilarRects predicate for every pair, (n, n) bool."""
    x, y, w, h = (rects[:, i].astype(np.float64) for i in range(4))
    delta = eps * (np.minimum(w[:, None], w[None]) + np.minimum(h[:, None], h[None])) * 0.5
    return ((np.abs(x[:, None] - x[None]) <= delta) & (np.abs(y[:, None] - y[None]) <= delta)
            & (np.abs(x[:, None] + w[:, None] - x[None] - w[None]) <= delta)
            & (np.abs(y[:, None] + h[:, None] - y[None] - h[None]) <= delta))


def group_rectangles(rects: np.ndarray, group_threshold: int, eps: float = GROUP_EPS) -> np.ndarray:
    """``cv2.groupRectangles(rects, group_threshold, eps)``: (n, 4) int boxes -> grouped boxes."""
    rects = np.asarray(rects, np.int64).reshape(-1, 4)
    if group_threshold <= 0 or len(rects) == 0:
        return rects
    n = len(rects)
    parent = np.arange(n)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    sim = _similar(rects, eps)
    for i, j in zip(*np.nonzero(np.triu(sim, 1))):
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[rj] = ri
    roots = np.array([find(i) for i in range(n)])
    _, labels = np.unique(roots, return_inverse=True)
    # class numbers in order of first appearance, as cv::partition numbers them
    order = {}
    labels = np.array([order.setdefault(int(lab), len(order)) for lab in labels])
    k = len(order)
    counts = np.bincount(labels, minlength=k)
    sums = np.zeros((k, 4), np.int64)
    np.add.at(sums, labels, rects)
    s = (np.float32(1.0) / counts.astype(np.float32))[:, None]
    avg = np.rint(sums.astype(np.float32) * s).astype(np.int64)
    out = []
    for i in range(k):
        n1 = counts[i]
        if n1 <= group_threshold:
            continue
        r1 = avg[i]
        inside = False
        for j in range(k):
            n2 = counts[j]
            if j == i or n2 <= group_threshold:
                continue
            r2 = avg[j]
            dx, dy = int(np.rint(r2[2] * eps)), int(np.rint(r2[3] * eps))
            if (r1[0] >= r2[0] - dx and r1[1] >= r2[1] - dy and r1[0] + r1[2] <= r2[0] + r2[2] + dx
                    and r1[1] + r1[3] <= r2[1] + r2[3] + dy and (n2 > max(3, n1) or n1 < 3)):
                inside = True
                break
        if not inside:
            out.append(r1)
    return np.array(out, np.int64).reshape(-1, 4)


def _visited(reject0: np.ndarray) -> np.ndarray:
    """Which windows of each row OpenCV visits: a window rejected by stage 0 makes the scan skip
    the next one. Inside a run of stage-0 rejections starting at a, positions a, a+2, ... are
    visited; the position right after the run is skipped when the run's last visited window is
    its last element."""
    rows, cols = reject0.shape
    idx = np.broadcast_to(np.arange(cols), (rows, cols))
    prev = np.zeros_like(reject0)
    prev[:, 1:] = reject0[:, :-1]
    start = np.where(reject0 & ~prev, idx, 0)
    run_start = np.maximum.accumulate(start, axis=1)
    in_run_visited = reject0 & ((idx - run_start) % 2 == 0)
    skipped_after = np.zeros_like(reject0)
    skipped_after[:, 1:] = in_run_visited[:, :-1]
    return np.where(reject0, in_run_visited, ~skipped_after)


class HaarCascade:
    """Detect faces with a Haar cascade: ``detect(grey) -> (n, 4) int boxes (x, y, w, h)``.

    backend: "auto" (OpenCV's CascadeClassifier when the installed OpenCV has it, else the NumPy
    port), "opencv" or "numpy". ``name`` says which one runs and which file it reads."""

    def __init__(self, path: Path | str | None = None, backend: str = "auto") -> None:
        if backend not in ("auto", "opencv", "numpy"):
            raise ValueError(f"backend must be 'auto', 'opencv' or 'numpy', got {backend!r}")
        self.path = cascade_path(path)
        if backend == "auto":
            backend = "opencv" if opencv_has_cascade() else "numpy"
        if backend == "opencv" and not opencv_has_cascade():
            raise DataError(f"OpenCV {cv2.__version__} has no CascadeClassifier (removed in OpenCV 5); "
                            f"use backend='numpy'")
        self.backend = backend
        self.sha256 = hashlib.sha256(self.path.read_bytes()).hexdigest()
        if backend == "opencv":
            self._cv = cv2.CascadeClassifier(str(self.path))
            if self._cv.empty():
                raise DataError(f"{self.path}: OpenCV could not load the cascade")
        else:
            self._cascade = _parse(str(self.path))
            self._offsets_cache: dict[int, list[tuple[np.ndarray, ...]]] = {}

    @property
    def name(self) -> str:
        return f"{self.backend}:{self.path.name}:{self.sha256[:12]}"

    def detect(self, grey: np.ndarray, scale_factor: float = 1.1, min_neighbors: int = 3,
               min_size: int = 0, max_size: int = 0) -> np.ndarray:
        """Boxes (x, y, w, h) of the faces in a uint8 greyscale image, like
        ``detectMultiScale(grey, scale_factor, min_neighbors, minSize=(min_size,)*2, maxSize=...)``."""
        if grey.ndim != 2 or grey.dtype != np.uint8:
            raise ValueError("detect() needs a 2-D uint8 greyscale image")
        if self.backend == "opencv":
            found = self._cv.detectMultiScale(grey, scaleFactor=scale_factor, minNeighbors=min_neighbors,
                                              minSize=(min_size, min_size), maxSize=(max_size, max_size))
            return np.asarray(found, np.int64).reshape(-1, 4)
        # one BLAS thread: the matrices are small, and threads fighting over 2 cores made a
        # detection 50x slower on a busy machine
        with single_blas_thread():
            hits = self._candidates(grey, scale_factor, min_size, max_size)
        return group_rectangles(hits, min_neighbors)

    # ------------------------------------------------------------------ NumPy port

    def _stage_offsets(self, stride: int) -> list[tuple[np.ndarray, ...]]:
        """Per stage, for images whose integral has row length `stride`: the distinct corner
        offsets its features read (U,), the matrix (U, stumps) that turns those corner values
        into feature values (+-rect weight per corner), the stumps' thresholds, and their leaves as
        (left - right, sum of right): a stage's score is ``(value < threshold) @ (left - right) + sum(right)``."""
        cached = self._offsets_cache.get(stride)
        if cached is not None:
            return cached
        c = self._cascade
        x, y, w, h = (c.rects[..., i] for i in range(4))
        corners = np.stack([y * stride + x, y * stride + x + w, (y + h) * stride + x, (y + h) * stride + x + w], -1)
        sign = np.array([1.0, -1.0, -1.0, 1.0])
        out, start = [], 0
        for size in c.stage_sizes:
            f = c.feature[start : start + size]
            used = c.weights[f] != 0  # (stumps, 3)
            offs = corners[f][used]  # (m, 4)
            uniq, inverse = np.unique(offs.ravel(), return_inverse=True)
            matrix = np.zeros((len(uniq), size), np.float32)
            stump = np.broadcast_to(np.arange(size)[:, None], used.shape)[used]  # (m,)
            coef = (c.weights[f][used][:, None] * sign[None]).ravel()  # (m*4,)
            np.add.at(matrix, (inverse, np.repeat(stump, 4)), coef)
            left, right = c.left[start : start + size], c.right[start : start + size]
            out.append((uniq.astype(np.intp), matrix, c.threshold[start : start + size], left - right, right.sum()))
            start += size
        self._offsets_cache[stride] = out
        return out

    def _candidates(self, grey: np.ndarray, scale_factor: float, min_size: int, max_size: int) -> np.ndarray:
        c = self._cascade
        H, W = grey.shape
        max_w = max_size if max_size > 0 else W
        max_h = max_size if max_size > 0 else H
        scales: list[np.float32] = []
        factor = 1.0
        while True:
            win_w, win_h = int(np.rint(c.width * factor)), int(np.rint(c.height * factor))
            if win_w > max_w or win_h > max_h or win_w > W or win_h > H:
                break
            if win_w >= min_size and win_h >= min_size:
                scales.append(np.float32(factor))
            factor *= scale_factor
        found = []
        for s in scales:
            sw, sh = int(np.rint(np.float32(W) / s)), int(np.rint(np.float32(H) / s))
            if sw < c.width or sh < c.height:
                break
            small = cv2.resize(grey, (sw, sh), interpolation=cv2.INTER_LINEAR_EXACT)
            hits = self._scan(small, 1 if s >= 2 else 2)
            if len(hits):
                xy = np.rint(hits.astype(np.float32) * s).astype(np.int64)
                win = int(np.rint(np.float32(c.width) * s)), int(np.rint(np.float32(c.height) * s))
                found.append(np.column_stack([xy, np.full(len(xy), win[0]), np.full(len(xy), win[1])]))
        return np.concatenate(found) if found else np.zeros((0, 4), np.int64)

    def _scan(self, img: np.ndarray, step: int) -> np.ndarray:
        """(x, y) of the windows of one scaled image that pass every stage."""
        c = self._cascade
        sh, sw = img.shape
        total, squares = cv2.integral2(img, sdepth=cv2.CV_64F, sqdepth=cv2.CV_64F)
        stride = sw + 1
        flat, flat_sq = total.ravel(), squares.ravel()
        flat32 = flat.astype(np.float32)  # sums of <= 2**24 / 255 pixels are exact in float32
        ys = np.arange(0, sh - c.height + 1, step)
        xs = np.arange(0, sw - c.width + 1, step)
        if len(ys) == 0 or len(xs) == 0:
            return np.zeros((0, 2), np.int64)
        base = (ys[:, None] * stride + xs[None, :])  # (rows, cols)
        # normalisation over the inner (w-2) x (h-2) rectangle
        area = float((c.width - 2) * (c.height - 2))
        n0 = stride + 1
        n1, n2, n3 = n0 + c.width - 2, n0 + (c.height - 2) * stride, n0 + (c.height - 2) * stride + c.width - 2
        s1 = flat[base + n0] - flat[base + n1] - flat[base + n2] + flat[base + n3]
        s2 = flat_sq[base + n0] - flat_sq[base + n1] - flat_sq[base + n2] + flat_sq[base + n3]
        nf = area * s2 - s1 * s1
        ok = nf > 0
        inv = np.where(ok, 1.0 / np.sqrt(np.where(ok, nf, 1.0)), 1.0).astype(np.float32).astype(np.float64)
        ok &= area * inv < 0.1
        stages = self._stage_offsets(stride)

        def stage_pass(k: int, b: np.ndarray, norm: np.ndarray) -> np.ndarray:
            offsets, matrix, thr, left_minus_right, right_sum = stages[k]
            value = (np.take(flat32, b[:, None] + offsets[None]) @ matrix) * norm[:, None]
            score = (value < thr[None]).astype(np.float64) @ left_minus_right + right_sum
            return score >= c.stage_thresholds[k]

        # stage 0 on every valid window, then OpenCV's skip-after-reject scan order
        flat_ok = ok.ravel()
        first = np.zeros(base.size, bool)
        first[flat_ok] = stage_pass(0, base.ravel()[flat_ok], inv.ravel()[flat_ok])
        reject0 = (flat_ok & ~first).reshape(base.shape)
        alive = (_visited(reject0) & first.reshape(base.shape)).ravel()
        b, norm = base.ravel()[alive], inv.ravel()[alive]
        pos = np.nonzero(alive)[0]
        for k in range(1, len(stages)):
            if len(b) == 0:
                break
            keep = stage_pass(k, b, norm)
            b, norm, pos = b[keep], norm[keep], pos[keep]
        cols = len(xs)
        return np.column_stack([xs[pos % cols], ys[pos // cols]]).astype(np.int64)

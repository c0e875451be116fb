"""Haar-cascade face crops of a CelebA copy (`fedcare.data.celeba.reader` reads the layout),
detected once and cached.

Face crops (``FaceCropper``): the image is converted to grey, histogram-equalised, and searched
with the Haar frontal-face cascade (``fedcare.data.haar``: OpenCV's CascadeClassifier on OpenCV
4.x, a NumPy port of it on OpenCV 5, which dropped it) with ``DetectorParams`` (scale factor
1.1, 5 neighbours, faces >= 48 px). Images without a detected face are dropped and counted. The
largest face (by area) is kept; the crop is the square around the box's centre whose side is
the box side x (1 + 2 x margin) (margin 0.15: the Haar box spans brows to mouth, the margin adds
forehead and chin), padded by replicating the border where it leaves the image, resized to
128 x 128 (area interpolation when shrinking, bilinear when enlarging), RGB uint8.

The crop cache: crops are made once and kept on disk, one entry per identity (all its listed
images): ``<cache>/celeba-faces-v1/<key[:2]>/<key>.npy`` (the crops of the images with a face,
(n, 128, 128, 3) uint8, read memory-mapped) and ``<key>.json`` (file names, which had a face,
the boxes, undecodable files), each written to a temporary file and renamed, the .json last. The
key hashes the detector (backend and cascade file hash), ``DetectorParams`` and, for each image,
its absolute path, size and modification time: a changed image or parameter makes a new entry;
stale entries are never read (delete the folder to reclaim the space; 48 KiB per face).
``<cache>`` is ``cache_dir`` if given, else ``$FEDCARE_CACHE/faces``, else
``~/.cache/fedcare/faces``. ``FaceCropper.stats`` counts hits, misses and decoded images.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import cv2
import numpy as np

from fedcare.data.common import DataError
from fedcare.data.video import quiet_opencv

from fedcare.data.celeba.reader import CACHE_ENV, CACHE_VERSION, CelebaDataset, Problems, imread, worker_count


@dataclass(frozen=True)
class DetectorParams:
    """How faces are found and cropped (all part of the cache key).

    scale_factor, min_neighbors, min_size: ``detectMultiScale`` arguments (pyramid step 1.1; a
        face needs more than 5 overlapping hits; faces smaller than 48 px, about a quarter of
        CelebA's 178 px width, are ignored: an aligned CelebA face is 90-130 px).
    equalize: histogram-equalise the grey image before detection (as in OpenCV's face-detection
        tutorial; +3-4 points of detection rate on the synthetic faces).
    margin: the crop side is the box side x (1 + 2 x margin).
    size: the crops are size x size RGB.
    backend: "auto", "opencv" or "numpy" (``fedcare.data.haar``)."""

    scale_factor: float = 1.1
    min_neighbors: int = 5
    min_size: int = 48
    equalize: bool = True
    margin: float = 0.15
    size: int = 128
    backend: str = "auto"


@dataclass
class CacheStats:
    hits: int = 0  # identities whose crops came from the cache
    misses: int = 0  # identities cropped now (and stored)
    decoded: int = 0  # images decoded
    images: int = 0  # images looked at (cached or not)
    faces: int = 0  # of those, with a detected face
    no_face: int = 0  # of those, without
    unreadable: int = 0  # of those, undecodable

    def as_dict(self) -> dict:
        return asdict(self)


def default_cache_dir() -> Path:
    """``$FEDCARE_CACHE/faces`` when FEDCARE_CACHE is set, else ``~/.cache/fedcare/faces``."""
    base = os.environ.get(CACHE_ENV)
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "fedcare") / "faces"


def crop_face(bgr: np.ndarray, box: Sequence[int], margin: float, size: int) -> np.ndarray:
    """The size x size RGB crop around a detection box (x, y, w, h): a square of side
    ``max(w, h) * (1 + 2 * margin)`` centred on the box, border-replicated where it leaves the image."""
    x, y, w, h = (int(v) for v in box)
    side = max(1, int(round(max(w, h) * (1 + 2 * margin))))
    x0 = int(round(x + w / 2 - side / 2))
    y0 = int(round(y + h / 2 - side / 2))
    H, W = bgr.shape[:2]
    pad = max(0, -x0, -y0, x0 + side - W, y0 + side - H)
    if pad:
        bgr = cv2.copyMakeBorder(bgr, pad, pad, pad, pad, cv2.BORDER_REPLICATE)
    patch = bgr[y0 + pad : y0 + pad + side, x0 + pad : x0 + pad + side]
    interp = cv2.INTER_AREA if side > size else cv2.INTER_LINEAR
    return cv2.cvtColor(cv2.resize(patch, (size, size), interpolation=interp), cv2.COLOR_BGR2RGB)


@dataclass
class _Entry:
    files: list[str]
    found: np.ndarray  # (n,) bool
    boxes: np.ndarray  # (n, 4) int, -1 where no face
    unreadable: list[str]
    crops: np.ndarray  # (found.sum(), S, S, 3) uint8 (memory-mapped when read from the cache)


@dataclass
class FaceSet:
    """The result of a cropping pass over some identities of a dataset.

    ``rows``: dataset rows with a face (sorted); ``no_face`` and ``unreadable``: rows dropped.
    ``identities`` are the CelebA ids of ``rows``. ``images(rows)`` returns the crops."""

    dataset: CelebaDataset
    params: DetectorParams
    detector: str
    rows: np.ndarray
    no_face: np.ndarray
    unreadable: np.ndarray
    boxes: dict[int, tuple[int, int, int, int]]  # row -> box in the source image
    _entries: dict[int, _Entry] = field(repr=False, default_factory=dict)

    @property
    def identities(self) -> np.ndarray:
        return self.dataset.identities[self.rows]

    @property
    def detection_rate(self) -> float:
        """Faces found / images decoded."""
        total = len(self.rows) + len(self.no_face)
        return len(self.rows) / total if total else 0.0

    def images(self, rows: Iterable[int] | np.ndarray | None = None) -> np.ndarray:
        """(n, size, size, 3) uint8 RGB crops of these dataset rows (all of ``self.rows`` by default);
        KeyError naming a row without a face."""
        rows = self.rows if rows is None else np.asarray(list(rows) if not isinstance(rows, np.ndarray) else rows)
        out = np.empty((len(rows), self.params.size, self.params.size, 3), np.uint8)
        ds = self.dataset
        position: dict[int, dict[str, int]] = {}
        for k, row in enumerate(rows.tolist()):
            person = int(ds.identities[row])
            entry = self._entries.get(person)
            if entry is None:
                raise KeyError(f"row {row} ({ds.filenames[row]}): identity {person} was not cropped")
            pos = position.get(person)
            if pos is None:
                slots = np.cumsum(entry.found) - 1
                pos = position[person] = {f: int(slots[i]) for i, f in enumerate(entry.files) if entry.found[i]}
            slot = pos.get(ds.filenames[row])
            if slot is None:
                raise KeyError(f"row {row} ({ds.filenames[row]}): no face was detected in it")
            out[k] = entry.crops[slot]
        return out


class FaceCropper:
    """Haar-cascade face crops with an on-disk cache (see the module docstring).

    ``faces(dataset, identities)`` crops every listed image of those identities (all by default)
    once; later passes with the same files and parameters read the cache and decode nothing."""

    def __init__(self, cache_dir: Path | str | None = None, params: DetectorParams | None = None,
                 workers: int | None = None, use_cache: bool = True) -> None:
        from fedcare.data.haar import HaarCascade

        self.params = params or DetectorParams()
        if not 0 <= self.params.margin <= 2 or self.params.size < 8:
            raise ValueError(f"bad detector parameters {self.params}")
        self.cascade = HaarCascade(backend=self.params.backend)
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.use_cache = use_cache
        self.workers = worker_count(workers)
        self.stats = CacheStats()
        self._lock = threading.Lock()
        p = asdict(self.params)
        p.pop("backend")
        self._fingerprint = json.dumps({"version": CACHE_VERSION, "detector": self.cascade.name, "params": p},
                                       sort_keys=True)

    @property
    def folder(self) -> Path:
        return self.cache_dir / CACHE_VERSION

    # --- one identity

    def _key(self, paths: list[Path]) -> str:
        h = hashlib.sha256(self._fingerprint.encode())
        for p in paths:
            try:
                st = os.stat(p)
                stamp = f"{st.st_size}:{st.st_mtime_ns}"
            except OSError:
                stamp = "missing"
            h.update(f"\n{os.path.abspath(p)}\t{stamp}".encode())
        return h.hexdigest()

    def _read(self, key: str) -> _Entry | None:
        base = self.folder / key[:2] / key
        try:
            meta = json.loads(base.with_suffix(".json").read_text())
            crops = np.load(base.with_suffix(".npy"), mmap_mode="r")
        except (OSError, ValueError):
            return None
        found = np.array(meta["found"], bool)
        if crops.shape != (int(found.sum()), self.params.size, self.params.size, 3):
            return None
        boxes = np.array(meta["boxes"], np.int64).reshape(-1, 4)
        return _Entry(meta["files"], found, boxes, meta["unreadable"], crops)

    def _write(self, key: str, entry: _Entry) -> None:
        folder = self.folder / key[:2]
        folder.mkdir(parents=True, exist_ok=True)
        base = folder / key

        def atomic(suffix: str, write: Callable[[object], None]) -> None:
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=suffix + ".tmp", dir=folder)
            try:
                with os.fdopen(fd, "wb") as fh:
                    write(fh)
                os.replace(tmp, base.with_suffix(suffix))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise

        atomic(".npy", lambda fh: np.save(fh, np.ascontiguousarray(entry.crops)))
        meta = {"files": entry.files, "found": entry.found.tolist(), "boxes": entry.boxes.tolist(),
                "unreadable": entry.unreadable, "params": json.loads(self._fingerprint)}
        atomic(".json", lambda fh: fh.write(json.dumps(meta).encode()))

    def _crop(self, paths: list[Path]) -> _Entry:
        p = self.params
        found, boxes, crops, unreadable = [], [], [], []
        for path in paths:
            bgr = imread(path)
            with self._lock:
                self.stats.decoded += 1
            if bgr is None:
                unreadable.append(path.name)
                found.append(False)
                boxes.append((-1, -1, -1, -1))
                continue
            grey = cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY)
            if p.equalize:
                grey = cv2.equalizeHist(grey)
            faces = self.cascade.detect(grey, p.scale_factor, p.min_neighbors, p.min_size)
            if len(faces) == 0:
                found.append(False)
                boxes.append((-1, -1, -1, -1))
                continue
            box = faces[int(np.argmax(faces[:, 2] * faces[:, 3]))]
            found.append(True)
            boxes.append(tuple(int(v) for v in box))
            crops.append(crop_face(bgr, box, p.margin, p.size))
        crop_arr = np.stack(crops) if crops else np.zeros((0, p.size, p.size, 3), np.uint8)
        return _Entry([q.name for q in paths], np.array(found, bool), np.array(boxes, np.int64).reshape(-1, 4),
                      unreadable, crop_arr)

    def _identity(self, ds: CelebaDataset, person: int) -> tuple[_Entry, bool]:
        rows = ds.rows_by_identity[person]
        paths = [ds.path(int(r)) for r in rows]
        key = self._key(paths)
        if self.use_cache:
            entry = self._read(key)
            if entry is not None and entry.files == [q.name for q in paths]:
                return entry, True
        entry = self._crop(paths)
        if self.use_cache:
            self._write(key, entry)
        return entry, False

    # --- many identities

    def faces(self, ds: CelebaDataset, identities: Iterable[int] | None = None, *, strict: bool = True,
              progress: Callable[[int, int], None] | None = None) -> FaceSet:
        """Crop (or read from the cache) every listed image of `identities` (all by default).
        strict: an undecodable image raises CelebaImageError naming it; otherwise it is dropped
        and listed in ``FaceSet.unreadable`` (and ``dataset.problems``)."""
        people = ds.identity_ids() if identities is None else np.unique(np.asarray(list(identities), np.int64))
        unknown = [int(i) for i in people if int(i) not in ds.rows_by_identity]
        if unknown:
            raise DataError(f"{ds.files.identity}: identity {unknown[0]} has no images in this copy")
        total = int(sum(len(ds.rows_by_identity[int(i)]) for i in people))
        entries: dict[int, _Entry] = {}
        done = 0
        from fedcare.data.haar import single_blas_thread

        # one BLAS thread for the whole pass (set once: the detector threads then never fight over it)
        with quiet_opencv(), single_blas_thread(), \
                ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="fedcare-faces") as pool:
            if progress is not None:
                progress(0, total)
            for person, (entry, hit) in zip(people.tolist(),
                                            pool.map(lambda i: self._identity(ds, int(i)), people.tolist())):
                entries[person] = entry
                self.stats.hits += hit
                self.stats.misses += not hit
                done += len(entry.files)
                if progress is not None:
                    progress(done, total)
        index = {name: i for i, name in enumerate(ds.filenames)} if entries else {}
        rows, no_face, unreadable, boxes = [], [], [], {}
        for person, entry in entries.items():
            bad = set(entry.unreadable)
            for i, name in enumerate(entry.files):
                row = index[name]
                if name in bad:
                    unreadable.append(row)
                elif entry.found[i]:
                    rows.append(row)
                    boxes[row] = tuple(int(v) for v in entry.boxes[i])
                else:
                    no_face.append(row)
        self.stats.images += done
        self.stats.faces += len(rows)
        self.stats.no_face += len(no_face)
        self.stats.unreadable += len(unreadable)
        if unreadable:
            problems = Problems(strict)
            for row in sorted(unreadable):
                problems.add("unreadable_image", ds.path(row), None, "cannot decode image (corrupt or not an image)")
            known = {(p.kind, p.path) for p in ds.problems}
            ds.problems += [p for p in problems.found if (p.kind, p.path) not in known]
        return FaceSet(ds, self.params, self.cascade.name, np.array(sorted(rows), np.int64),
                       np.array(sorted(no_face), np.int64), np.array(sorted(unreadable), np.int64), boxes, entries)

"""CelebA (aligned and cropped), read in its real on-disk layout, and Haar-cascade face crops.

Layout (reference/dataset-formats.md §2)::

    <root>/img_align_celeba/000001.jpg ...   178 x 218 JPEGs
    <root>/identity_CelebA.txt               "000001.jpg 2880" (no header)         required
    <root>/list_attr_celeba.txt              count line, 40 names, "file v1..v40"  required
    <root>/list_eval_partition.txt           "000001.jpg 0" (0 train, 1 valid, 2 test) optional

Folder detection: `root` may be that folder, the folder above it holding ``celeba/`` or
``CelebA/`` (torchvision's root), or the official Google-Drive tree (``Img/img_align_celeba/``,
``Anno/*.txt``, ``Eval/list_eval_partition.txt``); a doubled ``img_align_celeba/img_align_celeba``
(Kaggle) is accepted. The Kaggle CSV variant (no identity file) is not supported.

Text files are split on whitespace (the real files pad columns with extra spaces). Problems,
each naming the file and line (``CelebaProblem``; ``PROBLEM_KINDS``):

* a missing identity or attribute file, or no ``img_align_celeba/`` folder: ``CelebaLayoutError``
  (always raised);
* a line that is not "file id" (identity, partition), an attribute row without exactly 41 fields,
  a value other than -1/1, a bad count line or header, a duplicate file name, a file listed in one
  file but not the other, a count line that disagrees with the rows: ``CelebaFormatError``;
* an image listed but missing on disk: ``CelebaImageError``; an image that cannot be decoded:
  ``CelebaImageError`` when the crops are made (or with ``check_images=True``).

``load_celeba(root)`` (``strict=True``) raises the first of these; ``strict=False`` records them in
``dataset.problems`` and drops the affected images (what ``fedcare data summary celeba`` does).

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
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path

import cv2
import numpy as np

from fedcare.data.common import SYNTHETIC_MARKER, DataError
from fedcare.data.video import quiet_opencv

__all__ = [
    "ATTRIBUTES", "CACHE_ENV", "PROBLEM_KINDS", "CacheStats", "CelebaDataset", "CelebaFiles", "CelebaFormatError",
    "CelebaImageError", "CelebaLayoutError", "CelebaProblem", "DetectorParams", "FaceCropper", "FaceSet",
    "crop_face", "default_cache_dir", "find_celeba", "load_celeba", "summarize",
]

# The 40 attributes of list_attr_celeba.txt, in file order (dataset-formats.md §2.2).
ATTRIBUTES: tuple[str, ...] = (
    "5_o_Clock_Shadow", "Arched_Eyebrows", "Attractive", "Bags_Under_Eyes", "Bald", "Bangs",
    "Big_Lips", "Big_Nose", "Black_Hair", "Blond_Hair", "Blurry", "Brown_Hair", "Bushy_Eyebrows",
    "Chubby", "Double_Chin", "Eyeglasses", "Goatee", "Gray_Hair", "Heavy_Makeup", "High_Cheekbones",
    "Male", "Mouth_Slightly_Open", "Mustache", "Narrow_Eyes", "No_Beard", "Oval_Face", "Pale_Skin",
    "Pointy_Nose", "Receding_Hairline", "Rosy_Cheeks", "Sideburns", "Smiling", "Straight_Hair",
    "Wavy_Hair", "Wearing_Earrings", "Wearing_Hat", "Wearing_Lipstick", "Wearing_Necklace",
    "Wearing_Necktie", "Young",
)
IMAGE_DIR = "img_align_celeba"
IDENTITY_FILE = "identity_CelebA.txt"
ATTRIBUTE_FILE = "list_attr_celeba.txt"
PARTITION_FILE = "list_eval_partition.txt"
CACHE_ENV = "FEDCARE_CACHE"
CACHE_VERSION = "celeba-faces-v1"
_LAYOUT_HINT = (f"expected the CelebA layout: {IMAGE_DIR}/, {IDENTITY_FILE}, {ATTRIBUTE_FILE} "
                f"[, {PARTITION_FILE}] (flat, under celeba/, or Img/ Anno/ Eval/)")

PROBLEM_KINDS: dict[str, str] = {
    "bad_identity_line": "identity_CelebA.txt line that is not 'file identity'",
    "bad_attribute_header": "list_attr_celeba.txt count line or attribute-name line is wrong",
    "bad_attribute_line": "list_attr_celeba.txt row without exactly 41 fields",
    "bad_attribute_value": "list_attr_celeba.txt value other than -1 or 1",
    "attribute_count_mismatch": "list_attr_celeba.txt count line disagrees with its rows",
    "bad_partition_line": "list_eval_partition.txt line that is not 'file 0|1|2'",
    "duplicate_file": "a file name listed twice in one text file",
    "missing_attributes": "image in identity_CelebA.txt but not in list_attr_celeba.txt",
    "missing_identity": "image in list_attr_celeba.txt but not in identity_CelebA.txt",
    "missing_partition": "image without a list_eval_partition.txt line (when that file exists)",
    "missing_image": "image listed but not in img_align_celeba/",
    "unreadable_image": "image that cannot be decoded",
}
_IMAGE_KINDS = {"missing_image", "unreadable_image"}


class CelebaLayoutError(DataError):
    """The path is not a CelebA copy (missing folder, or a required file absent)."""


class CelebaFormatError(DataError):
    """A malformed line in one of the text files; the message names the file and line."""


class CelebaImageError(DataError):
    """An image that is listed but missing, or cannot be decoded; the message names it."""


@dataclass(frozen=True)
class CelebaProblem:
    kind: str  # a key of PROBLEM_KINDS
    path: Path
    line: int | None  # 1-based line of the text file, when the problem is a line
    detail: str

    def message(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else f"{self.path}"
        return f"{where}: {self.detail}"


@dataclass(frozen=True)
class CelebaFiles:
    root: Path  # the folder holding the files (may be below the path given)
    images: Path
    identity: Path
    attributes: Path
    partition: Path | None


@dataclass
class CelebaDataset:
    """The images listed in both identity_CelebA.txt and list_attr_celeba.txt (and present on
    disk), in identity-file order. Row i: ``filenames[i]``, ``identities[i]``,
    ``attributes[i]`` (40 bools in ``ATTRIBUTES`` order; True = 1), ``partition[i]``."""

    root: Path
    files: CelebaFiles
    filenames: list[str]
    identities: np.ndarray  # (n,) int64
    attributes: np.ndarray  # (n, 40) bool
    partition: np.ndarray | None  # (n,) int8 0/1/2, or None without a partition file
    problems: list[CelebaProblem] = field(default_factory=list)
    synthetic: bool = False
    unlisted_images: int = 0  # image files on disk that no text file lists

    def __len__(self) -> int:
        return len(self.filenames)

    def path(self, i: int) -> Path:
        return self.files.images / self.filenames[i]

    def identity_ids(self) -> np.ndarray:
        """The sorted distinct identity ids."""
        return np.unique(self.identities)

    def attribute(self, name: str) -> np.ndarray:
        """(n,) bool column of an attribute; DataError naming an unknown name."""
        return self.attributes[:, attribute_index(name)]

    @cached_property
    def rows_by_identity(self) -> dict[int, np.ndarray]:
        order = np.argsort(self.identities, kind="stable")
        ids, starts = np.unique(self.identities[order], return_index=True)
        return {int(i): rows for i, rows in zip(ids, np.split(order, starts[1:]))}


def attribute_index(name: str) -> int:
    try:
        return ATTRIBUTES.index(name)
    except ValueError:
        import difflib
        close = difflib.get_close_matches(name, ATTRIBUTES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise DataError(f"unknown CelebA attribute {name!r}{hint} (names are case-sensitive, e.g. 'Eyeglasses')") from None


# --------------------------------------------------------------------------- layout


def _part(parent: Path, name: str) -> Path | None:
    p = parent / name
    if not p.is_dir():
        return None
    return p / name if (p / name).is_dir() else p


def find_celeba(root: Path | str) -> CelebaFiles:
    """Locate the image folder and text files of a CelebA copy at or just below `root`."""
    root = Path(root)
    if not root.exists():
        raise CelebaLayoutError(f"{root}: no such file or directory ({_LAYOUT_HINT})")
    if not root.is_dir():
        raise CelebaLayoutError(f"{root}: not a directory ({_LAYOUT_HINT})")
    for base in (root, root / "celeba", root / "CelebA"):
        if not base.is_dir():
            continue
        images = _part(base, IMAGE_DIR) or (_part(base / "Img", IMAGE_DIR) if (base / "Img").is_dir() else None)
        if images is None:
            continue

        def text(name: str, *folders: str) -> Path | None:
            for folder in ("", *folders):
                p = base / folder / name if folder else base / name
                if p.is_file():
                    return p
            return None

        identity = text(IDENTITY_FILE, "Anno")
        if identity is None:
            raise CelebaLayoutError(f"{base / IDENTITY_FILE}: identity file missing (also looked in Anno/); "
                                    f"it maps each image to its person and is needed ({_LAYOUT_HINT})")
        attributes = text(ATTRIBUTE_FILE, "Anno")
        if attributes is None:
            raise CelebaLayoutError(f"{base / ATTRIBUTE_FILE}: attribute file missing (also looked in Anno/) "
                                    f"({_LAYOUT_HINT})")
        return CelebaFiles(base, images, identity, attributes, text(PARTITION_FILE, "Eval"))
    if (root / IDENTITY_FILE).is_file() or root.name == IMAGE_DIR:
        raise CelebaLayoutError(f"{root}: no {IMAGE_DIR}/ folder found; pass the folder that contains it "
                                f"({_LAYOUT_HINT})")
    raise CelebaLayoutError(f"{root}: no {IMAGE_DIR}/ folder found ({_LAYOUT_HINT})")


# --------------------------------------------------------------------------- text files


class _Problems:
    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.found: list[CelebaProblem] = []

    def add(self, kind: str, path: Path, line: int | None, detail: str) -> None:
        problem = CelebaProblem(kind, Path(path), line, detail)
        if self.strict:
            error = CelebaImageError if kind in _IMAGE_KINDS else CelebaFormatError
            raise error(problem.message())
        self.found.append(problem)


def _lines(path: Path) -> Iterator[tuple[int, list[str]]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for number, line in enumerate(fh, start=1):
                fields = line.split()
                if fields:
                    yield number, fields
    except OSError as e:
        raise CelebaLayoutError(f"{path}: cannot read file ({e.strerror or e})") from None


def _read_pairs(path: Path, what: str, kind: str, valid: Callable[[str], int | None],
                problems: _Problems) -> dict[str, tuple[int, int]]:
    """file name -> (value, line) of a two-column file."""
    out: dict[str, tuple[int, int]] = {}
    for number, fields in _lines(path):
        value = valid(fields[1]) if len(fields) == 2 else None
        if value is None:
            problems.add(kind, path, number, f"expected 'file {what}', got {' '.join(fields)[:80]!r}")
            continue
        if fields[0] in out:
            problems.add("duplicate_file", path, number, f"{fields[0]} already listed on line {out[fields[0]][1]}")
            continue
        out[fields[0]] = (value, number)
    return out


def _identity_value(token: str) -> int | None:
    return int(token) if token.isdigit() else None


def _partition_value(token: str) -> int | None:
    return int(token) if token in ("0", "1", "2") else None


def _read_attributes(path: Path, problems: _Problems) -> tuple[dict[str, tuple[np.ndarray, int]], int | None]:
    """file name -> (40 bools in ATTRIBUTES order, line), and the count line's value."""
    rows: dict[str, tuple[np.ndarray, int]] = {}
    lines = _lines(path)
    first = next(lines, None)
    if first is None:
        problems.add("bad_attribute_header", path, 1, "empty file (expected the image count on line 1)")
        return rows, None
    number, fields = first
    count = int(fields[0]) if len(fields) == 1 and fields[0].isdigit() else None
    if count is None:
        problems.add("bad_attribute_header", path, number, f"expected the image count, got {' '.join(fields)[:80]!r}")
    second = next(lines, None)
    if second is None:
        problems.add("bad_attribute_header", path, number + 1, "missing the line of 40 attribute names")
        return rows, count
    number, names = second
    unknown = [n for n in names if n not in ATTRIBUTES]
    if len(names) != len(ATTRIBUTES) or unknown or len(set(names)) != len(names):
        detail = f"expected the 40 CelebA attribute names, found {len(names)} names"
        if unknown:
            detail += f"; unknown: {', '.join(unknown[:5])}"
        problems.add("bad_attribute_header", path, number, detail)
        if problems.strict is False:
            return rows, count
    order = np.array([ATTRIBUTES.index(n) for n in names])  # file column -> canonical index
    n_fields = len(ATTRIBUTES) + 1
    seen = 0
    for number, fields in lines:
        seen += 1
        if len(fields) != n_fields:
            problems.add("bad_attribute_line", path, number,
                         f"expected {n_fields} fields (file name and 40 values), found {len(fields)}")
            continue
        values = fields[1:]
        bad = next((j for j, v in enumerate(values) if v != "1" and v != "-1"), None)
        if bad is not None:
            problems.add("bad_attribute_value", path, number,
                         f"{fields[0]}: attribute {names[bad]} (field {bad + 2}) is {values[bad]!r}, not -1 or 1")
            continue
        if fields[0] in rows:
            problems.add("duplicate_file", path, number, f"{fields[0]} already listed on line {rows[fields[0]][1]}")
            continue
        row = np.zeros(len(ATTRIBUTES), bool)
        row[order] = np.array(values) == "1"
        rows[fields[0]] = (row, number)
    if count is not None and count != seen:
        problems.add("attribute_count_mismatch", path, 1, f"count line says {count} images, the file has {seen} rows")
    return rows, count


def load_celeba(root: Path | str, *, strict: bool = True, check_images: bool = False,
                progress: Callable[[int, int], None] | None = None) -> CelebaDataset:
    """Index a CelebA copy (see the module docstring). strict: raise the first problem as a
    DataError naming the file and line; otherwise record problems and drop the images they
    affect. check_images: also decode every image (``unreadable_image``; minutes on the real
    202,599 images; the crops decode them anyway)."""
    files = find_celeba(root)
    problems = _Problems(strict)
    identity = _read_pairs(files.identity, "identity", "bad_identity_line", _identity_value, problems)
    attributes, _ = _read_attributes(files.attributes, problems)
    partition = (_read_pairs(files.partition, "0|1|2", "bad_partition_line", _partition_value, problems)
                 if files.partition is not None else None)
    for name, (_, line) in sorted(attributes.items(), key=lambda kv: kv[1][1]):
        if name not in identity:
            problems.add("missing_identity", files.attributes, line, f"{name} has attributes but no line in {files.identity.name}")
    try:
        on_disk = {e.name for e in os.scandir(files.images) if not e.name.startswith(".")}
    except OSError as e:  # pragma: no cover
        raise CelebaLayoutError(f"{files.images}: cannot list folder ({e.strerror or e})") from None
    names, ids, rows, parts = [], [], [], []
    for name, (person, line) in identity.items():
        attr = attributes.get(name)
        if attr is None:
            problems.add("missing_attributes", files.identity, line, f"{name} has no row in {files.attributes.name}")
            continue
        if partition is not None and name not in partition:
            problems.add("missing_partition", files.identity, line, f"{name} has no line in {files.partition.name}")
            continue
        if name not in on_disk:
            problems.add("missing_image", files.images / name, None,
                         f"listed in {files.identity.name} line {line} but missing on disk")
            continue
        names.append(name)
        ids.append(person)
        rows.append(attr[0])
        parts.append(partition[name][0] if partition is not None else 0)
    listed = set(identity) | set(attributes)
    ds = CelebaDataset(
        root=files.root, files=files, filenames=names, identities=np.array(ids, np.int64),
        attributes=np.array(rows, bool).reshape(-1, len(ATTRIBUTES)),
        partition=np.array(parts, np.int8) if partition is not None else None,
        problems=problems.found, synthetic=(files.root / SYNTHETIC_MARKER).is_file()
        or (Path(root) / SYNTHETIC_MARKER).is_file(),
        unlisted_images=len(on_disk - listed),
    )
    if check_images:
        _check_images(ds, problems, progress)
        ds.problems = problems.found
    return ds


def _check_images(ds: CelebaDataset, problems: _Problems, progress: Callable[[int, int], None] | None) -> None:
    def decodes(i: int) -> bool:
        return _imread(ds.path(i)) is not None

    with quiet_opencv(), ThreadPoolExecutor(max_workers=_workers(None)) as pool:
        for i, ok in enumerate(pool.map(decodes, range(len(ds)))):
            if not ok:
                problems.add("unreadable_image", ds.path(i), None, "cannot decode image (corrupt or not an image)")
            if progress is not None and (i % 256 == 0 or i == len(ds) - 1):
                progress(i + 1, len(ds))


# --------------------------------------------------------------------------- face crops


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



def _imread(path: Path) -> np.ndarray | None:
    image = cv2.imread(os.fspath(path), cv2.IMREAD_COLOR)
    return None if image is None or image.size == 0 else image


def _workers(n: int | None) -> int:
    return max(1, n if n else min(4, os.cpu_count() or 1))


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
        self.workers = _workers(workers)
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
            bgr = _imread(path)
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
            problems = _Problems(strict)
            for row in sorted(unreadable):
                problems.add("unreadable_image", ds.path(row), None, "cannot decode image (corrupt or not an image)")
            known = {(p.kind, p.path) for p in ds.problems}
            ds.problems += [p for p in problems.found if (p.kind, p.path) not in known]
        return FaceSet(ds, self.params, self.cascade.name, np.array(sorted(rows), np.int64),
                       np.array(sorted(no_face), np.int64), np.array(sorted(unreadable), np.int64), boxes, entries)


# --------------------------------------------------------------------------- summary


def summarize(ds: CelebaDataset, faces: FaceSet | None = None) -> dict:
    """JSON-able overview: counts, images per identity, attribute prevalences (% of images with
    the attribute = 1), partition counts, the detection rate (when `faces` is given), and every
    problem with its path (and line)."""
    per_identity = np.bincount(np.unique(ds.identities, return_inverse=True)[1]) if len(ds) else np.zeros(0, int)
    prevalence = {name: round(100.0 * float(ds.attributes[:, j].mean()), 2) if len(ds) else 0.0
                  for j, name in enumerate(ATTRIBUTES)}
    counts = Counter(p.kind for p in ds.problems)
    kinds = list(PROBLEM_KINDS)
    out = {
        "root": str(ds.root),
        "synthetic": ds.synthetic,
        "files": {k: (str(v) if v is not None else None) for k, v in asdict(ds.files).items()},
        "identities": int(len(per_identity)),
        "images": len(ds),
        "unlisted_images": ds.unlisted_images,
        "images_per_identity": ({"min": int(per_identity.min()), "mean": round(float(per_identity.mean()), 2),
                                 "max": int(per_identity.max())} if len(per_identity) else None),
        "partition": ({name: int((ds.partition == k).sum()) for k, name in enumerate(("train", "valid", "test"))}
                      if ds.partition is not None else None),
        "attribute_prevalence_percent": prevalence,
        "detection": None,
        "problem_counts": {k: counts[k] for k in sorted(counts, key=lambda k: kinds.index(k) if k in kinds else 99)},
        "problems": [{"kind": p.kind, "path": str(p.path), "line": p.line, "detail": p.detail} for p in ds.problems],
    }
    if faces is not None:
        looked = len(faces.rows) + len(faces.no_face) + len(faces.unreadable)
        out["detection"] = {
            "detector": faces.detector, "params": asdict(faces.params), "images": looked,
            "identities": len(faces._entries), "faces": len(faces.rows), "no_face": len(faces.no_face),
            "unreadable": len(faces.unreadable), "rate_percent": round(100.0 * faces.detection_rate, 2),
        }
    return out

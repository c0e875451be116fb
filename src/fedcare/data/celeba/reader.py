"""CelebA (aligned and cropped), read in its real on-disk layout.

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

Face crops and their cache: `fedcare.data.celeba.faces`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import cv2
import numpy as np

from fedcare.data.common import SYNTHETIC_MARKER, DataError
from fedcare.data.video import quiet_opencv

__all__ = [
    "ATTRIBUTES", "CACHE_ENV", "PROBLEM_KINDS", "CelebaDataset", "CelebaFiles", "CelebaFormatError",
    "CelebaImageError", "CelebaLayoutError", "CelebaProblem", "find_celeba", "load_celeba",
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


class Problems:
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
                problems: Problems) -> dict[str, tuple[int, int]]:
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


def _read_attributes(path: Path, problems: Problems) -> tuple[dict[str, tuple[np.ndarray, int]], int | None]:
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
    problems = Problems(strict)
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


def imread(path: Path) -> np.ndarray | None:
    image = cv2.imread(os.fspath(path), cv2.IMREAD_COLOR)
    return None if image is None or image.size == 0 else image


def worker_count(n: int | None) -> int:
    return max(1, n if n else min(4, os.cpu_count() or 1))


def _check_images(ds: CelebaDataset, problems: Problems, progress: Callable[[int, int], None] | None) -> None:
    def decodes(i: int) -> bool:
        return imread(ds.path(i)) is not None

    with quiet_opencv(), ThreadPoolExecutor(max_workers=worker_count(None)) as pool:
        for i, ok in enumerate(pool.map(decodes, range(len(ds)))):
            if not ok:
                problems.add("unreadable_image", ds.path(i), None, "cannot decode image (corrupt or not an image)")
            if progress is not None and (i % 256 == 0 or i == len(ds) - 1):
                progress(i + 1, len(ds))


# --------------------------------------------------------------------------- face crops


# --------------------------------------------------------------------------- summary



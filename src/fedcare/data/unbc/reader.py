"""Loader for the UNBC-McMaster Shoulder Pain Expression Archive, read in its real on-disk layout.

Layout (see ``dataset-formats.md`` §1)::

    <root>/Images/<NNN>-<ii><NNN>/<seq>/<seq><FFF>.png
    <root>/Frame_Labels/PSPI/<subj>/<seq>/<seq><FFF>_facs.txt   one number, "   2.0000000e+00"
    <root>/Frame_Labels/FACS/<subj>/<seq>/<seq><FFF>_facs.txt   0..n lines "AU intensity ..."
    <root>/AAM_landmarks/<subj>/<seq>/<seq><FFF>_aam.txt        66 lines "x y"
    <root>/Sequence_Labels/{AFF,OPR,SEN,VAS}/<subj>/<seq>.txt   one number each

Only ``Images/`` and ``Frame_Labels/PSPI/`` are required; FACS, AAM landmarks and each of the
four sequence-label measures are optional parts. An optional part that is absent as a whole is
not a problem (see ``UnbcDataset.parts``); when a part is present, every frame (or sequence)
it lacks is reported.

Conventions
-----------
* **Subjects** are keyed by the 3-digit number of their folder as an int (``042-ll042`` -> 42);
  the initials are not unique (two ``mg``, two ``jh``). Subject folders must match
  ``^\\d{3}-[a-z]{2}\\d{3}$``. In the label trees a subject folder is matched to the image
  folder by its number as well.
* **Sessions**: the k-th sequence of a subject, in sorted sequence-name order, is session k
  (0-based). The thesis numbers each subject's sessions from 0; sequence names encode the test
  occasion (``t1``/``t2``) and then the test type, so name order is the only capture order the
  archive lets us infer. Only sequence folders holding at least one frame image count, so the
  sessions of a subject are always 0..k-1 (an empty sequence folder is reported as
  ``empty_sequence``).
* **Frames** are ``<seq><FFF>.png`` with FFF the 1-based frame number (3 or more digits).
  ``UnbcDataset.frames`` holds every frame image found (with or without labels), sorted by
  (subject, session, index). Frames with unreadable or black images are kept in the list (so
  counts reflect the files on disk); consumers that read pixels get an ``UnbcImageError``
  naming the path, and black frames can be dropped by the caller.
* **Numbers** are MATLAB ``e+00`` text; every number is parsed with ``float(token)`` of
  whitespace-split text. FACS lines are read for their first two fields only (AU, intensity).
  AU43 (eyes closed) has no intensity grade and may be stored as 0: its *presence* counts as 1
  wherever something is computed from FACS (``pspi_from_facs``); ``read_facs`` returns the
  stored value.

Problems
--------
``load_unbc`` never fails on per-file defects; it records them as ``UnbcProblem`` (kind, path,
detail). ``path`` is the file or folder that exists on disk (for a missing counterpart it is
the file that *lacks* it, and ``detail`` names the expected path). Kinds (``PROBLEM_KINDS``):

* ``missing_pspi``: a frame image without its PSPI file. This is also "image without label":
  PSPI is the frame label, so a separate ``image_without_label`` kind is not used.
* ``bad_pspi``: a PSPI file that is empty, not a number, not finite or outside 0..16
  (the frame's ``pspi`` is None).
* ``missing_facs``: a frame image without its FACS file (only when ``Frame_Labels/FACS`` exists).
* ``bad_facs``: a FACS file with a line that is not "AU intensity" numbers (``facs`` is None).
* ``empty_facs``: an empty FACS file on a frame whose PSPI is > 0, i.e. pain but no coded AU.
  An empty FACS file on a PSPI-0 frame is normal data (a frame with no AU, ``facs == {}``) and
  is only counted in ``summarize`` (``empty_facs_files``), not reported as a problem, so that a
  clean copy has no problems.
* ``missing_landmarks``: a frame image without its AAM file (only when ``AAM_landmarks`` exists).
* ``bad_landmarks``: an AAM file that is not 66 lines of "x y" (only checked with
  ``check_images=True``, which reads every file).
* ``missing_sequence_label``: a sequence without its AFF/OPR/SEN/VAS file (only for measures
  whose ``Sequence_Labels/<M>`` folder exists). Path: the image sequence folder.
* ``bad_sequence_label``: a sequence-label file that is not a number.
* ``label_without_image``: a PSPI, FACS, AAM or sequence-label file with no matching image
  (frame or sequence). Path: the label file.
* ``unreadable_image`` / ``black_frame``: found with ``check_images=True`` (decode failure; mean
  grey level < 1.0).
* ``empty_sequence``: a sequence folder under ``Images/`` without any frame image.
* ``stray_file``: an unexpected entry inside a part's tree that *looks like data*: a folder, or a
  file with a data extension (``.png .jpg .jpeg .bmp .tif .tiff .txt .csv .mat .json``) whose
  name does not fit the layout (e.g. ``Images/042-ll042/x.png``, ``Images/42-ll042/``), or a
  duplicate subject number / frame number. System junk is ignored silently: names starting
  with ``.`` (``.DS_Store``, ``._*`` AppleDouble files), ``Thumbs.db``, ``desktop.ini``,
  ``__MACOSX``, and files with other extensions. Entries directly in ``<root>`` (README, zips,
  ``fedcare-synthetic.json``) or directly in ``Frame_Labels/`` / ``Sequence_Labels/`` are not
  checked.

Doubled top folders (``Images/Images``, ``Frame_Labels/Frame_Labels``,
``AAM_landmarks/AAM_landmarks``, ``Sequence_Labels/Sequence_Labels``), as in the Kaggle copy,
are accepted for each part independently.

Speed: without ``check_images`` the loader lists folders with ``os.scandir`` (no per-file stat)
and reads only the small PSPI, FACS and sequence-label text files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedcare.data.common import SYNTHETIC_MARKER, DataError
from fedcare.data.unbc.files import (
    UnbcImageError,
    imread_grey,
    pspi_from_facs,
    read_facs,
    read_grey,
    read_landmarks,
    read_pspi,
    read_sequence_label,
)
from fedcare.data.video import quiet_opencv

__all__ = [
    "MEASURES",
    "PROBLEM_KINDS",
    "UnbcDataset",
    "UnbcFrame",
    "UnbcImageError",
    "UnbcLayoutError",
    "UnbcProblem",
    "load_unbc",
    "pspi_from_facs",
    "read_facs",
    "read_grey",
    "read_landmarks",
    "read_pspi",
    "read_sequence_label",
]

MEASURES = ("AFF", "OPR", "SEN", "VAS")
PAIN_THRESHOLD = 1.0  # summarize: a pain frame has PSPI >= 1
BLACK_MEAN = 1.0  # check_images: a frame whose mean grey level is below this is black

# Problems that make a frame unusable (a run refuses the copy): a label without its image, an
# image without its label; `fedcare data summary unbc --strict` fails on them and on unreadable images.
FATAL_PROBLEMS = frozenset({"missing_pspi", "bad_pspi", "label_without_image"})
STRICT_PROBLEMS = FATAL_PROBLEMS | {"unreadable_image"}

PROBLEM_KINDS: dict[str, str] = {
    "missing_pspi": "frame image without its Frame_Labels/PSPI file (image without label)",
    "bad_pspi": "PSPI file empty, not a number, not finite or outside 0..16",
    "missing_facs": "frame image without its Frame_Labels/FACS file",
    "bad_facs": "FACS file with a line that is not 'AU intensity' numbers",
    "empty_facs": "empty FACS file on a frame with PSPI > 0 (pain but no coded AU)",
    "missing_landmarks": "frame image without its AAM_landmarks file",
    "bad_landmarks": "AAM file that is not 66 lines of 'x y' (checked with check_images)",
    "missing_sequence_label": "sequence without its Sequence_Labels/<measure> file",
    "bad_sequence_label": "sequence-label file that is not a number",
    "label_without_image": "label file (PSPI, FACS, AAM or sequence label) with no matching image",
    "unreadable_image": "frame image that cannot be decoded (checked with check_images)",
    "black_frame": "frame image whose mean grey level is < 1.0 (checked with check_images)",
    "empty_sequence": "sequence folder under Images/ without frame images",
    "stray_file": "unexpected data-like file or folder inside the dataset tree",
}

_SUBJECT_RE = re.compile(r"^\d{3}-[a-z]{2}\d{3}$")
_DATA_EXTS = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".txt", ".csv", ".mat", ".json"})
_JUNK_NAMES = frozenset({"thumbs.db", "desktop.ini", "__macosx"})
_LAYOUT_HINT = "expected the UNBC-McMaster layout: Images/, Frame_Labels/PSPI/ ..."


class UnbcLayoutError(DataError):
    """The path is not a UNBC-McMaster copy (missing, not a folder, or required parts absent)."""


class UnbcUnusableError(DataError):
    """A copy a run cannot use: a subject it needs is absent, or frames have problems a run
    refuses (``FATAL_PROBLEMS``); the message names the paths."""


@dataclass(frozen=True)
class UnbcFrame:
    subject: int  # 42 for '042-ll042'
    sequence: str  # 'll042t1aaaff'
    session: int  # 0-based sequence index within the subject (sorted names)
    index: int  # 1-based frame number from the file name
    image: Path
    pspi: float | None  # None when the PSPI file is missing or unparseable
    facs: dict[int, float] | None  # AU -> intensity; {} for an empty file; None if missing/bad
    landmarks: Path | None

    def grey(self) -> np.ndarray:
        """The frame image as 8-bit grey (``read_grey``)."""
        return read_grey(self.image)


@dataclass(frozen=True)
class UnbcProblem:
    kind: str  # a key of PROBLEM_KINDS
    path: Path
    detail: str


@dataclass
class UnbcDataset:
    root: Path  # the root the user gave
    frames: list[UnbcFrame]  # sorted by (subject, session, index)
    sequence_labels: dict[tuple[int, str], dict[str, float]]  # (subject, sequence) -> {"VAS": ..}
    problems: list[UnbcProblem]
    synthetic: bool  # <root>/fedcare-synthetic.json exists
    # The folder used for each part ("Images", "PSPI", "FACS", "AAM_landmarks", "AFF", "OPR",
    # "SEN", "VAS"); None for an optional part that is absent.
    parts: dict[str, Path | None] = field(default_factory=dict)
    checked_images: bool = False

    def subjects(self) -> list[int]:
        return sorted({f.subject for f in self.frames})

    def frames_of(self, subjects: Iterable[int]) -> list[UnbcFrame]:
        """The frames of `subjects`, in (subject, session, index) order."""
        wanted = set(subjects)
        return [f for f in self.frames if f.subject in wanted]

    def sequences(self, subject: int) -> list[str]:
        """The subject's sequences in session order (index = session)."""
        by_session = {f.session: f.sequence for f in self.frames if f.subject == subject}
        return [by_session[s] for s in sorted(by_session)]


def subject_dir_name(images_dir: Path, subject: int) -> str:
    """The subject's folder name under Images/ (e.g. "048-aa048"); "048" if there is none."""
    names = sorted(e.name for e in _entries(os.fspath(images_dir))
                   if e.is_dir() and _SUBJECT_RE.match(e.name) and e.name.startswith(f"{subject:03d}-"))
    return names[0] if names else f"{subject:03d}"


# --------------------------------------------------------------------------- file readers


# --------------------------------------------------------------------------- tree scanning


def _is_junk(name: str) -> bool:
    return name.startswith(".") or name.lower() in _JUNK_NAMES


def _looks_like_data(entry: os.DirEntry) -> bool:
    if _is_junk(entry.name):
        return False
    if entry.is_dir():
        return True
    return os.path.splitext(entry.name)[1].lower() in _DATA_EXTS


def _entries(path: str) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError:
        return []


def _part_dir(parent: Path, name: str) -> Path | None:
    """``parent/name``, or ``parent/name/name`` when the archive was unpacked with a doubled folder."""
    p = parent / name
    if not p.is_dir():
        return None
    doubled = p / name
    return doubled if doubled.is_dir() else p


def _strip_path(detail: str, path: str | Path) -> str:
    """Reader errors start with "<path>: "; the problem already carries the path."""
    prefix = f"{os.fspath(path)}: "
    return detail[len(prefix):] if detail.startswith(prefix) else detail


class _Scan:
    """Collects problems while walking the part trees."""

    def __init__(self, wanted: set[int] | None) -> None:
        self.wanted = wanted
        self.problems: list[UnbcProblem] = []

    def problem(self, kind: str, path: str | Path, detail: str) -> None:
        self.problems.append(UnbcProblem(kind, Path(path), _strip_path(detail, path)))

    def stray(self, entry: os.DirEntry, why: str) -> None:
        if _looks_like_data(entry):
            self.problem("stray_file", entry.path, why)

    def subjects(self, part: Path, what: str) -> Iterator[tuple[int, os.DirEntry]]:
        """(number, folder) of each subject folder in `part` (the wanted ones only)."""
        seen: dict[int, str] = {}
        for entry in _entries(os.fspath(part)):
            if not (_SUBJECT_RE.match(entry.name) and entry.is_dir()):
                self.stray(entry, f"not a subject folder of {what} (expected NNN-iiNNN, e.g. 042-ll042)")
                continue
            number = int(entry.name[:3])
            if self.wanted is not None and number not in self.wanted:
                continue
            if number in seen:
                self.problem("stray_file", entry.path, f"duplicate subject number {number} (already {seen[number]}); ignored")
                continue
            seen[number] = entry.name
            yield number, entry

    def frames(self, part: Path, suffix: str, what: str) -> dict[int, dict[str, dict[int, str]]]:
        """subject -> sequence -> frame number -> path of `<seq><FFF><suffix>` files."""
        tree: dict[int, dict[str, dict[int, str]]] = {}
        n = len(suffix)
        for number, subj in self.subjects(part, what):
            sequences: dict[str, dict[int, str]] = {}
            for seq in _entries(subj.path):
                if not seq.is_dir():
                    self.stray(seq, f"file directly in a subject folder of {what} (expected sequence folders)")
                    continue
                if _is_junk(seq.name):
                    continue
                name, frames = seq.name, {}
                lead = len(name)
                for entry in _entries(seq.path):
                    fname = entry.name
                    digits = fname[lead:-n] if len(fname) > lead + n else ""
                    if fname.startswith(name) and fname.endswith(suffix) and len(digits) >= 3 and digits.isdigit():
                        index = int(digits)
                        if index in frames:
                            self.problem("stray_file", entry.path, f"duplicate frame number {index} (already {frames[index]}); ignored")
                        else:
                            frames[index] = entry.path
                    else:
                        self.stray(entry, f"unexpected entry in sequence folder {name} of {what} (expected {name}<FFF>{suffix})")
                sequences[name] = frames
            tree[number] = sequences
        return tree

    def sequence_files(self, part: Path, what: str) -> dict[int, dict[str, str]]:
        """subject -> sequence -> path of `<seq>.txt` files."""
        tree: dict[int, dict[str, str]] = {}
        for number, subj in self.subjects(part, what):
            files: dict[str, str] = {}
            for entry in _entries(subj.path):
                if entry.name.endswith(".txt") and not _is_junk(entry.name) and not entry.is_dir():
                    files[entry.name[:-4]] = entry.path
                else:
                    self.stray(entry, f"not a {what} file (expected <sequence>.txt)")
            tree[number] = files
        return tree


def _layout_error(root: Path, what: str) -> UnbcLayoutError:
    message = f"{root}: {what} ({_LAYOUT_HINT})"
    # Two common mistakes: passing the folder above the dataset, or the Images/ folder itself.
    try:
        children = [e for e in _entries(os.fspath(root)) if e.is_dir() and not _is_junk(e.name)]
    except OSError:  # pragma: no cover
        children = []
    inner = [c for c in children if _part_dir(Path(c.path), "Images") is not None]
    if len(inner) == 1:
        message += f"; did you mean {inner[0].path}?"
    elif children and all(_SUBJECT_RE.match(c.name) for c in children):
        message += "; this looks like the Images/ folder itself: pass the folder that contains Images/"
    return UnbcLayoutError(message)


# --------------------------------------------------------------------------- loader


@dataclass(frozen=True)
class _Parts:
    """The folders of a copy: the two a run needs and the optional ones (None when absent)."""

    images: Path
    pspi: Path
    facs: Path | None
    aam: Path | None
    measures: dict[str, Path | None]  # Sequence_Labels/<AFF|OPR|SEN|VAS>


@dataclass
class _Labels:
    """The label files the scan found (subject -> sequence -> frame -> path); a frame takes
    its own out, so what is left has no image."""

    pspi: dict
    facs: dict | None
    aam: dict | None
    measures: dict[str, dict]  # measure -> subject -> sequence -> path


def _find_parts(root: Path) -> _Parts:
    """The folders of the copy at `root`, or UnbcLayoutError naming what is missing."""
    if not root.exists():
        raise UnbcLayoutError(f"{root}: no such file or directory ({_LAYOUT_HINT})")
    if not root.is_dir():
        raise UnbcLayoutError(f"{root}: not a directory ({_LAYOUT_HINT})")
    images_dir = _part_dir(root, "Images")
    if images_dir is None:
        raise _layout_error(root, "no Images/ folder found")
    frame_labels = _part_dir(root, "Frame_Labels")
    pspi_dir = frame_labels / "PSPI" if frame_labels is not None and (frame_labels / "PSPI").is_dir() else None
    if pspi_dir is None:
        raise _layout_error(root, "no Frame_Labels/PSPI/ folder found")
    facs_dir = frame_labels / "FACS" if (frame_labels / "FACS").is_dir() else None
    aam_dir = _part_dir(root, "AAM_landmarks")
    seq_labels_root = _part_dir(root, "Sequence_Labels")
    measure_dirs = {
        m: (seq_labels_root / m if seq_labels_root is not None and (seq_labels_root / m).is_dir() else None)
        for m in MEASURES
    }
    if not any(_SUBJECT_RE.match(e.name) and e.is_dir() for e in _entries(os.fspath(images_dir))):
        raise UnbcLayoutError(f"{images_dir}: no subject folders found (expected NNN-iiNNN folders like 042-ll042; {_LAYOUT_HINT})")
    return _Parts(images_dir, pspi_dir, facs_dir, aam_dir, measure_dirs)


def _label_path(part: Path, subj_folder: str, seq: str, index: int, suffix: str) -> Path:
    return part / subj_folder / seq / f"{seq}{index:03d}{suffix}"


def _sequence_frames(number: int, folder: str, seq: str, session: int, seq_frames: dict[int, str], labels: _Labels,
                     parts: _Parts, problem: Callable[[str, Path | str, str], None]) -> list[UnbcFrame]:
    """The frames of one sequence with their PSPI, FACS and landmarks; every missing or bad label is a problem."""
    pspi_seq = labels.pspi.get(number, {}).get(seq, {})
    facs_seq = labels.facs.get(number, {}).get(seq, {}) if labels.facs is not None else None
    aam_seq = labels.aam.get(number, {}).get(seq, {}) if labels.aam is not None else None
    frames = []
    for index in sorted(seq_frames):
        image = Path(seq_frames[index])
        value: float | None = None
        p = pspi_seq.pop(index, None)
        if p is None:
            problem("missing_pspi", image, f"no PSPI label (expected {_label_path(parts.pspi, folder, seq, index, '_facs.txt')})")
        else:
            try:
                value = read_pspi(p)
            except ValueError as e:
                problem("bad_pspi", p, str(e))
        au: dict[int, float] | None = None
        if facs_seq is not None:
            f = facs_seq.pop(index, None)
            if f is None:
                problem("missing_facs", image, f"no FACS file (expected {_label_path(parts.facs, folder, seq, index, '_facs.txt')})")
            else:
                try:
                    au = read_facs(f)
                except ValueError as e:
                    problem("bad_facs", f, str(e))
                else:
                    if not au and value is not None and value > 0:
                        problem("empty_facs", f, f"empty FACS file but PSPI is {value:g} (pain without coded AUs)")
        landmarks: Path | None = None
        if aam_seq is not None:
            a = aam_seq.pop(index, None)
            if a is None:
                problem("missing_landmarks", image, f"no AAM landmarks (expected {_label_path(parts.aam, folder, seq, index, '_aam.txt')})")
            else:
                landmarks = Path(a)
        frames.append(UnbcFrame(number, seq, session, index, image, value, au, landmarks))
    return frames


def _sequence_labels(number: int, folder: str, seq: str, labels: _Labels, parts: _Parts,
                     problem: Callable[[str, Path | str, str], None]) -> dict[str, float]:
    """The sequence's self-reports and observer rating (AFF, OPR, SEN, VAS) that are present."""
    values: dict[str, float] = {}
    for m, tree in labels.measures.items():
        s = tree.get(number, {}).pop(seq, None)
        if s is None:
            problem("missing_sequence_label", parts.images / folder / seq,
                    f"no {m} label (expected {parts.measures[m] / folder / (seq + '.txt')})")
            continue
        try:
            values[m] = read_sequence_label(s)
        except ValueError as e:
            problem("bad_sequence_label", s, str(e))
    return values


def _report_orphans(labels: _Labels, parts: _Parts, subject_folder: dict[int, str],
                    problem: Callable[[str, Path | str, str], None]) -> None:
    """Whatever label files no frame or sequence took have no image."""
    for tree, what in ((labels.pspi, "PSPI"), (labels.facs, "FACS"), (labels.aam, "AAM landmarks")):
        if tree is None:
            continue
        for number in sorted(tree):
            for seq in sorted(tree[number]):
                for index, path in sorted(tree[number][seq].items()):
                    folder = subject_folder.get(number, Path(path).parent.parent.name)
                    problem("label_without_image", path, f"{what} file without image (expected {parts.images / folder / seq / f'{seq}{index:03d}.png'})")
    for m, tree in labels.measures.items():
        for number in sorted(tree):
            for seq, path in sorted(tree[number].items()):
                problem("label_without_image", path, f"{m} sequence label without images (no sequence {seq} with frames under {parts.images})")


def load_unbc(
    root: Path | str,
    *,
    subjects: Iterable[int] | None = None,
    check_images: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> UnbcDataset:
    """Index a UNBC-McMaster copy at `root` (see the module docstring for the layout and the
    problem kinds).

    subjects: only these subject numbers are read (all when None).
    check_images: also decode every frame image (``unreadable_image``, ``black_frame``: mean
        grey level < 1.0) and parse every landmark file (``bad_landmarks``); otherwise only the
        presence of images and landmark files is checked.
    progress: ``progress(done, total)`` over frames, called while images are checked (only with
        check_images=True).

    Raises UnbcLayoutError naming the path when `root` does not exist, is not a folder, or has no
    ``Images/`` or ``Frame_Labels/PSPI/`` folder, or ``Images/`` holds no subject folder.
    """
    root = Path(root)
    parts = _find_parts(root)
    scan = _Scan(None if subjects is None else {int(s) for s in subjects})
    images = scan.frames(parts.images, ".png", "Images")
    labels = _Labels(
        pspi=scan.frames(parts.pspi, "_facs.txt", "Frame_Labels/PSPI"),
        facs=scan.frames(parts.facs, "_facs.txt", "Frame_Labels/FACS") if parts.facs else None,
        aam=scan.frames(parts.aam, "_aam.txt", "AAM_landmarks") if parts.aam else None,
        measures={m: scan.sequence_files(d, f"Sequence_Labels/{m}") for m, d in parts.measures.items() if d is not None},
    )
    problem = scan.problem
    frames: list[UnbcFrame] = []
    sequence_labels: dict[tuple[int, str], dict[str, float]] = {}
    subject_folder: dict[int, str] = {}
    for number in sorted(images):
        sequences = images[number]
        some_frame = next((p for fr in sequences.values() for p in fr.values()), None)
        folder = Path(some_frame).parent.parent.name if some_frame else subject_dir_name(parts.images, number)
        subject_folder[number] = folder
        session = 0
        for seq in sorted(sequences):
            if not sequences[seq]:
                problem("empty_sequence", parts.images / folder / seq, "sequence folder without frame images (<seq><FFF>.png)")
                continue
            frames += _sequence_frames(number, folder, seq, session, sequences[seq], labels, parts, problem)
            seq_labels = _sequence_labels(number, folder, seq, labels, parts, problem)
            if seq_labels:
                sequence_labels[(number, seq)] = seq_labels
            session += 1
    _report_orphans(labels, parts, subject_folder, problem)

    if check_images:
        _check_files(frames, scan, progress)

    problems = sorted(scan.problems, key=lambda p: (kind_order(p.kind), str(p.path)))
    return UnbcDataset(
        root=root,
        frames=frames,  # built in (subject, session, index) order
        sequence_labels=sequence_labels,
        problems=problems,
        synthetic=(root / SYNTHETIC_MARKER).is_file(),
        parts={"Images": parts.images, "PSPI": parts.pspi, "FACS": parts.facs, "AAM_landmarks": parts.aam,
               **parts.measures},
        checked_images=check_images,
    )


def load_for_run(root: Path | str, subjects: Iterable[int]) -> UnbcDataset:
    """`load_unbc` for a run on `subjects`: every subject present and no frame with a problem a
    run refuses, else UnbcUnusableError naming the folder or the files (five of them, and
    the command that lists them all)."""
    subjects = sorted({int(s) for s in subjects})
    dataset = load_unbc(root, subjects=subjects)
    images = dataset.parts.get("Images") or Path(root) / "Images"
    for k in sorted(set(subjects) - set(dataset.subjects())):  # before its labels are listed "without image"
        folder = images / subject_dir_name(images, k)
        if folder.is_dir():
            raise UnbcUnusableError(f"subject {k} has no frames in {folder}")
        raise UnbcUnusableError(f"{root}: subject {k} not found: no {images}/{k:03d}-* folder "
                                f"(found subjects {', '.join(map(str, dataset.subjects()))})")
    fatal = [p for p in dataset.problems if p.kind in FATAL_PROBLEMS]
    if fatal:
        listed = "\n".join(f"  {p.kind}: {p.path} ({p.detail})" for p in fatal[:5])
        more = f"\n  ... and {len(fatal) - 5} more" if len(fatal) > 5 else ""
        raise UnbcUnusableError(
            f"{root}: {len(fatal)} frame(s) cannot be used:\n{listed}{more}\n"
            f"(`fedcare data summary unbc {root}` lists every problem)"
        )
    return dataset


def _check_one(frame: UnbcFrame) -> list[tuple[str, Path, str]]:
    found = []
    try:
        grey = imread_grey(frame.image)
    except UnbcImageError as e:
        found.append(("unreadable_image", frame.image, str(e)))
    else:
        mean = float(grey.mean())
        if mean < BLACK_MEAN:
            found.append(("black_frame", frame.image, f"black frame: mean grey level {mean:.2f} < {BLACK_MEAN:.1f}"))
    if frame.landmarks is not None:
        try:
            read_landmarks(frame.landmarks)
        except ValueError as e:
            found.append(("bad_landmarks", frame.landmarks, str(e)))
    return found


def _check_files(frames: list[UnbcFrame], scan: _Scan, progress: Callable[[int, int], None] | None) -> None:
    """Decode every image and parse every landmark file; OpenCV releases the GIL, so a few
    threads give a near-linear speed-up on the ~48k frames of the real archive."""
    total = len(frames)
    if progress:
        progress(0, total)
    workers = max(1, min(8, os.cpu_count() or 1))
    step = max(1, total // 200)
    with quiet_opencv(), ThreadPoolExecutor(max_workers=workers) as pool:
        for i, found in enumerate(pool.map(_check_one, frames, chunksize=16), start=1):
            for kind, path, detail in found:
                scan.problem(kind, path, detail)
            if progress and (i % step == 0 or i == total):
                progress(i, total)


# --------------------------------------------------------------------------- summary


def kind_order(kind: str) -> tuple[int, str]:
    kinds = list(PROBLEM_KINDS)
    return (kinds.index(kind) if kind in PROBLEM_KINDS else len(kinds), kind)



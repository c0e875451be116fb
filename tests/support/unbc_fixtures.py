"""Small UNBC-McMaster trees in the real on-disk layout (dataset-formats.md §1.11), for tests.

Base tree (no quirks): 2 subjects x 1-2 sequences x 3 frames, every part present::

    Images/042-ll042/ll042t1aaaff/ll042t1aaaff001.png ...   20x24 RGB PNGs
    Frame_Labels/PSPI/...<frame>_facs.txt                     "   2.0000000e+00\\n"
    Frame_Labels/FACS/...<frame>_facs.txt                     "   4.0000000e+00   2.0000000e+00\\n" lines
    AAM_landmarks/...<frame>_aam.txt                          66 lines "x y" in e-notation
    Sequence_Labels/{AFF,OPR,SEN,VAS}/<subj>/<seq>.txt        one e+00 number

PSPI and FACS agree (PSPI = AU4 + max(AU6,AU7) + max(AU9,AU10) + [AU43 present]); frame
ll042t1aaaff001 has an EMPTY FACS file (PSPI 0), frame ll042t1aaaff003 has AU43 stored as 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import cv2
import numpy as np

SUBJECT_FOLDERS = {42: "042-ll042", 43: "043-jh043"}
SEQUENCES = {42: ["ll042t1aaaff", "ll042t2afaff"], 43: ["jh043t1afaff"]}
# (PSPI, FACS lines as (AU, intensity)) per frame 1..3 of each sequence
FRAMES: dict[str, list[tuple[float, list[tuple[int, float]]]]] = {
    "ll042t1aaaff": [(0.0, []), (2.0, [(4, 2.0)]), (3.0, [(4, 1.0), (6, 1.0), (43, 0.0)])],
    "ll042t2afaff": [(0.0, [(12, 3.0)]), (0.0, [(25, 1.0), (26, 2.0)]), (1.0, [(7, 1.0), (12, 2.0)])],
    "jh043t1afaff": [(0.0, [(20, 1.0)]), (4.0, [(4, 2.0), (10, 2.0), (9, 1.0)]), (0.0, [])],
}
SEQUENCE_LABELS = {
    "ll042t1aaaff": {"AFF": 3.0, "OPR": 2.0, "SEN": 5.0, "VAS": 4.0},
    "ll042t2afaff": {"AFF": 1.0, "OPR": 0.0, "SEN": 2.0, "VAS": 1.0},
    "jh043t1afaff": {"AFF": 7.0, "OPR": 3.0, "SEN": 9.0, "VAS": 6.0},
}
IMAGE_SHAPE = (20, 24)  # H, W
PARTS = ("Images", "Frame_Labels", "AAM_landmarks", "Sequence_Labels")
MEASURES = ("AFF", "OPR", "SEN", "VAS")


def num(value: float) -> str:
    """MATLAB ASCII style, as in the real label files: '   2.0000000e+00'."""
    return f"{value:16.7e}"


def _face(rng: np.random.Generator, value: int | None = None) -> np.ndarray:
    h, w = IMAGE_SHAPE
    if value is not None:
        return np.full((h, w, 3), value, np.uint8)
    img = rng.integers(40, 220, size=(h, w, 3), dtype=np.uint8)
    img[5:9, 6:18] = 250
    return img


def _landmark_text(rng: np.random.Generator, lines: int = 66) -> str:
    pts = rng.uniform(0, 24, size=(lines, 2))
    return "".join(f"{num(x)}{num(y)}\n" for x, y in pts)


class Tree:
    """Paths of one fixture tree (with or without doubled top folders)."""

    def __init__(self, root: Path, doubled: Iterable[str]) -> None:
        self.root = root
        top = {p: (root / p / p if p in doubled else root / p) for p in PARTS}
        self.images = top["Images"]
        self.pspi = top["Frame_Labels"] / "PSPI"
        self.facs = top["Frame_Labels"] / "FACS"
        self.aam = top["AAM_landmarks"]
        self.seq_labels = top["Sequence_Labels"]

    @staticmethod
    def _frame(subject: int, seq: str, index: int) -> tuple[str, str]:
        return SUBJECT_FOLDERS.get(subject, f"{subject:03d}-xx{subject:03d}"), f"{seq}{index:03d}"

    def image(self, subject: int, seq: str, index: int) -> Path:
        folder, stem = self._frame(subject, seq, index)
        return self.images / folder / seq / f"{stem}.png"

    def pspi_file(self, subject: int, seq: str, index: int) -> Path:
        folder, stem = self._frame(subject, seq, index)
        return self.pspi / folder / seq / f"{stem}_facs.txt"

    def facs_file(self, subject: int, seq: str, index: int) -> Path:
        folder, stem = self._frame(subject, seq, index)
        return self.facs / folder / seq / f"{stem}_facs.txt"

    def aam_file(self, subject: int, seq: str, index: int) -> Path:
        folder, stem = self._frame(subject, seq, index)
        return self.aam / folder / seq / f"{stem}_aam.txt"

    def seq_label(self, measure: str, subject: int, seq: str) -> Path:
        return self.seq_labels / measure / SUBJECT_FOLDERS[subject] / f"{seq}.txt"


def _write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _png(path: Path, img: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    ok, buf = cv2.imencode(".png", img)
    assert ok
    path.write_bytes(buf.tobytes())
    return path


def write_unbc_fixture(
    root: Path,
    *,
    doubled: bool | Iterable[str] = False,
    synthetic: bool = False,
    aam: bool = True,
    sequence_labels: bool = True,
    black_frame: bool = False,
    missing_pspi: bool = False,
    image_without_label: bool = False,
    label_without_image: bool = False,
    corrupt_png: bool = False,
    bad_pspi: bool = False,
    bad_facs: bool = False,
    empty_facs_with_pain: bool = False,
    missing_facs: bool = False,
    missing_landmarks: bool = False,
    bad_landmarks: bool = False,
    missing_sequence_label: bool = False,
    bad_sequence_label: bool = False,
    empty_sequence: bool = False,
    stray_files: bool = False,
) -> Path:
    """Write the fixture tree under `root` (created) and return `root`.

    doubled: True doubles every top folder (Images/Images, Frame_Labels/Frame_Labels,
        AAM_landmarks/AAM_landmarks, Sequence_Labels/Sequence_Labels); or a collection of the
        part names to double.
    Quirks (each touches one known file; see `quirk_paths` for the exact paths):
        black_frame: jh043t1afaff003.png all zeros.   corrupt_png: ll042t1aaaff003.png truncated.
        missing_pspi: PSPI of ll042t2afaff002 removed.  bad_pspi: PSPI of ll042t2afaff003 = "n/a".
        image_without_label: extra ll042t2afaff004.png with no PSPI/FACS/AAM at all.
        label_without_image: extra PSPI file jh043t1afaff004_facs.txt without image.
        bad_facs: FACS of jh043t1afaff001 has a one-field line.  missing_facs: FACS of
        jh043t1afaff002 removed.  empty_facs_with_pain: FACS of ll042t1aaaff002 (PSPI 2) empty.
        missing_landmarks: AAM of ll042t2afaff001 removed.  bad_landmarks: AAM of
        ll042t1aaaff002 has 65 lines.  missing_sequence_label: VAS of jh043t1afaff removed.
        bad_sequence_label: OPR of ll042t2afaff = "n/a".  empty_sequence: empty folder
        Images/043-jh043/jh043t2afaff.  stray_files: Images/042-ll042/ll042t1aaaff/notes.txt
        (reported) plus .DS_Store and Thumbs.db (ignored).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    parts = set(PARTS) if doubled is True else set(doubled or ())
    t = Tree(root, parts)
    rng = np.random.default_rng(0)
    for subject, seqs in SEQUENCES.items():
        for seq in seqs:
            for i, (pspi, aus) in enumerate(FRAMES[seq], start=1):
                _png(t.image(subject, seq, i), _face(rng))
                _write(t.pspi_file(subject, seq, i), num(pspi) + "\n")
                _write(t.facs_file(subject, seq, i), "".join(f"{num(au)}{num(v)}\n" for au, v in aus))
                if aam:
                    _write(t.aam_file(subject, seq, i), _landmark_text(rng))
            if sequence_labels:
                for m, v in SEQUENCE_LABELS[seq].items():
                    _write(t.seq_label(m, subject, seq), num(v) + "\n")
    if synthetic:
        _write(root / "fedcare-synthetic.json", '{"generator": "test fixture"}\n')

    if black_frame:
        _png(t.image(43, "jh043t1afaff", 3), _face(rng, value=0))
    if corrupt_png:
        path = t.image(42, "ll042t1aaaff", 3)
        path.write_bytes(path.read_bytes()[:40])
    if missing_pspi:
        t.pspi_file(42, "ll042t2afaff", 2).unlink()
    if bad_pspi:
        _write(t.pspi_file(42, "ll042t2afaff", 3), "n/a\n")
    if image_without_label:
        _png(t.image(42, "ll042t2afaff", 4), _face(rng))
    if label_without_image:
        _write(t.pspi_file(43, "jh043t1afaff", 4), num(1.0) + "\n")
    if bad_facs:
        _write(t.facs_file(43, "jh043t1afaff", 1), f"{num(20)}\n")
    if missing_facs:
        t.facs_file(43, "jh043t1afaff", 2).unlink()
    if empty_facs_with_pain:
        _write(t.facs_file(42, "ll042t1aaaff", 2), "")
    if missing_landmarks:
        t.aam_file(42, "ll042t2afaff", 1).unlink()
    if bad_landmarks:
        _write(t.aam_file(42, "ll042t1aaaff", 2), _landmark_text(rng, lines=65))
    if missing_sequence_label:
        t.seq_label("VAS", 43, "jh043t1afaff").unlink()
    if bad_sequence_label:
        _write(t.seq_label("OPR", 42, "ll042t2afaff"), "n/a\n")
    if empty_sequence:
        (t.images / "043-jh043" / "jh043t2afaff").mkdir(parents=True)
    if stray_files:
        seq_dir = t.images / "042-ll042" / "ll042t1aaaff"
        _write(seq_dir / "notes.txt", "a note\n")
        _write(seq_dir / ".DS_Store", b"\0\0\0\1Bud1")
        _write(t.images / "Thumbs.db", b"\0")
    return root


def quirk_paths(root: Path, doubled: bool | Iterable[str] = False) -> dict[str, Path]:
    """Problem kind -> the exact path `load_unbc` must report for the quirks above."""
    parts = set(PARTS) if doubled is True else set(doubled or ())
    t = Tree(Path(root), parts)
    return {
        "black_frame": t.image(43, "jh043t1afaff", 3),
        "unreadable_image": t.image(42, "ll042t1aaaff", 3),
        "missing_pspi": t.image(42, "ll042t2afaff", 2),
        "bad_pspi": t.pspi_file(42, "ll042t2afaff", 3),
        "label_without_image": t.pspi_file(43, "jh043t1afaff", 4),
        "bad_facs": t.facs_file(43, "jh043t1afaff", 1),
        "missing_facs": t.image(43, "jh043t1afaff", 2),
        "empty_facs": t.facs_file(42, "ll042t1aaaff", 2),
        "missing_landmarks": t.image(42, "ll042t2afaff", 1),
        "bad_landmarks": t.aam_file(42, "ll042t1aaaff", 2),
        "missing_sequence_label": t.images / "043-jh043" / "jh043t1afaff",
        "bad_sequence_label": t.seq_label("OPR", 42, "ll042t2afaff"),
        "empty_sequence": t.images / "043-jh043" / "jh043t2afaff",
        "stray_file": t.images / "042-ll042" / "ll042t1aaaff" / "notes.txt",
        "image_without_label": t.image(42, "ll042t2afaff", 4),  # reported as missing_pspi
    }

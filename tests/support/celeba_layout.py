"""Tiny hand-written CelebA copies in the real layout: grey JPEGs, the identity file, the 40
attributes (+1/-1) and the partition, for the loader and partition tests."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from fedcare.data.celeba.reader import ATTRIBUTES
from fedcare.data.celeba.synthetic import HEIGHT, WIDTH


def write_jpeg(path: Path, value: int = 128, size=(HEIGHT, WIDTH)) -> None:
    ok, buf = cv2.imencode(".jpg", np.full((*size, 3), value, np.uint8))
    path.write_bytes(buf.tobytes())


def attribute_row(name: str, values) -> str:
    return name + "".join(f" {1 if v else -1:2d}" for v in values) + "\n"


def write_layout(root: Path, rows: list[tuple[str, int, np.ndarray]], partition: bool = True) -> Path:
    """A tiny hand-written CelebA copy: (file name, identity, 40 bools) rows, grey JPEGs."""
    (root / "img_align_celeba").mkdir(parents=True)
    for name, _, _ in rows:
        write_jpeg(root / "img_align_celeba" / name)
    (root / "identity_CelebA.txt").write_text("".join(f"{n}   {i}\n" for n, i, _ in rows))
    (root / "list_attr_celeba.txt").write_text(
        f"{len(rows)}\n" + " ".join(ATTRIBUTES) + " \n" + "".join(attribute_row(n, a) for n, _, a in rows))
    if partition:
        (root / "list_eval_partition.txt").write_text("".join(f"{n} {k % 3}\n" for k, (n, _, _) in enumerate(rows)))
    return root

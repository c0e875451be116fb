"""The synthetic CelebA generator: the real layout, determinism, and each attribute changing the
picture where it should."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import cv2
import numpy as np
import pytest

from fedcare.data.celeba.reader import ATTRIBUTES
from fedcare.data.common import SYNTHETIC_MARKER
from fedcare.data.celeba.synthetic import HEIGHT, WIDTH, draw_face, generate_celeba


def test_generator_writes_the_celeba_layout(celeba_copy):
    root, summary = celeba_copy
    files = sorted(p.name for p in (root / "img_align_celeba").iterdir())
    assert files[0] == "000001.jpg" and len(files) == summary["images"] == sum(summary["splits"].values())
    assert re.fullmatch(r"\d{6}\.jpg", files[-1]) and files[-1] == f"{len(files):06d}.jpg"
    image = cv2.imread(str(root / "img_align_celeba" / files[0]))
    assert image.shape == (HEIGHT, WIDTH, 3) == (218, 178, 3)
    attr = (root / "list_attr_celeba.txt").read_text().splitlines()
    assert attr[0] == str(len(files)) and attr[1] == " ".join(ATTRIBUTES) + " "  # trailing space as in CelebA
    assert re.fullmatch(r"000001\.jpg( (-1| 1)){40}", attr[2])
    ident = (root / "identity_CelebA.txt").read_text().splitlines()
    assert len(ident) == len(files) and {int(line.split()[1]) for line in ident} == set(range(1, 9))
    part = [int(line.split()[1]) for line in (root / "list_eval_partition.txt").read_text().splitlines()]
    assert part == sorted(part) and set(part) == {0, 1, 2}  # contiguous train / valid / test blocks
    marker = json.loads((root / SYNTHETIC_MARKER).read_text())
    assert marker["generator"] == "fedcare.data.synthetic.celeba" and marker["seed"] == 0


def test_generator_is_deterministic(tmp_path):
    def digest(root: Path) -> dict:
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
                if p.is_file()}

    a = generate_celeba(tmp_path / "a", seed=3, identities=3, images_per_identity=2, workers=1)
    generate_celeba(tmp_path / "b", seed=3, identities=3, images_per_identity=2, workers=1)
    generate_celeba(tmp_path / "c", seed=4, identities=3, images_per_identity=2, workers=1)
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    assert digest(tmp_path / "a") != digest(tmp_path / "c")
    assert a["images"] == len(list((tmp_path / "a" / "img_align_celeba").iterdir()))
    with pytest.raises(FileExistsError):
        generate_celeba(tmp_path / "a", seed=3, identities=3, images_per_identity=2)
    with pytest.raises(ValueError, match="identities"):
        generate_celeba(tmp_path / "d", identities=0)


def _region_change(attribute: str, box) -> tuple[float, float]:
    """Mean absolute pixel change inside and outside a box when `attribute` is switched on."""
    changes_in, changes_out = [], []
    for person in (1, 2, 3):
        off = draw_face(person, 0, overrides={"Wearing_Hat": False, "Eyeglasses": False, attribute: False})
        on = draw_face(person, 0, overrides={"Wearing_Hat": False, "Eyeglasses": False, attribute: True})
        diff = np.abs(on.image.astype(int) - off.image.astype(int)).mean(-1)
        y0, y1, x0, x1 = box(off)
        mask = np.zeros(diff.shape, bool)
        mask[y0:y1, x0:x1] = True
        changes_in.append(diff[mask].mean())
        changes_out.append(diff[~mask].mean())
    return float(np.mean(changes_in)), float(np.mean(changes_out))


def test_attributes_change_the_picture_where_they_should():
    def eyes(face):
        (xl, yl), (xr, yr) = face.eyes
        return int(min(yl, yr) - 15), int(max(yl, yr) + 15), int(xl - 22), int(xr + 22)

    def top(face):
        return 0, int(face.eyes[:, 1].min() - 25), 0, WIDTH

    def mouth(face):
        y = int(face.eyes[:, 1].mean())
        return y + 35, y + 80, int(face.eyes[0, 0] - 10), int(face.eyes[1, 0] + 10)

    for attribute, box in (("Eyeglasses", eyes), ("Wearing_Hat", top), ("Smiling", mouth), ("Mustache", mouth)):
        inside, outside = _region_change(attribute, box)
        assert inside > 8 * max(outside, 0.05), (attribute, inside, outside)
    # a non-visual attribute changes nothing, and the draw is repeatable
    a = draw_face(5, 1, overrides={"Wearing_Necktie": True})
    b = draw_face(5, 1, overrides={"Wearing_Necktie": False})
    assert np.array_equal(a.image, b.image) and np.array_equal(draw_face(5, 1).image, draw_face(5, 1).image)
    with pytest.raises(ValueError, match="Glasses"):
        draw_face(1, 0, overrides={"Glasses": True})


@pytest.mark.parametrize("options", [{"identities": 10 ** 9}, {"images_per_identity": 10 ** 6}])
def test_counts_past_their_bounds_are_refused_before_anything_is_drawn(tmp_path, options):
    from fedcare.errors import InputError

    with pytest.raises(InputError, match="<= 100000|<= 1000"):
        generate_celeba(tmp_path / "x", **options)
    assert list(tmp_path.iterdir()) == []

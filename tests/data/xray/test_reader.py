"""The chest X-ray loader (Sait et al. layout): nested class folders labelled by folder; a wrong
layout or a bad image named by its path."""

from pathlib import Path

import cv2
import numpy as np
import pytest

from fedcare.data.xray.reader import CLASSES, XrayImageError, XrayLayoutError, load_xray, read_xray


def _fixture(root: Path) -> Path:
    """The §5 fixture recipe: doubly nested, small JPEGs of mixed size and mode."""
    base = root / "Curated X-Ray Dataset" / "Curated X-Ray Dataset"
    for i, name in enumerate(CLASSES):
        (base / name).mkdir(parents=True)
        for n in (1, 2, 10):
            shape = (20 + n, 30) if n % 2 else (25, 25, 3)
            cv2.imwrite(str(base / name / f"{name} ({n}).jpg"), np.full(shape, 40 * i, np.uint8))
    (base / "Normal" / "notes.txt").write_text("not an image")
    return root


def test_loader_finds_the_nested_class_folders_and_labels_by_folder(tmp_path):
    ds = load_xray(_fixture(tmp_path))
    assert ds.root.name == "Curated X-Ray Dataset" and ds.root.parent.name == "Curated X-Ray Dataset"
    assert ds.class_counts() == {name: 3 for name in CLASSES}
    assert [p.name for p in ds.paths[:3]] == ["COVID-19 (1).jpg", "COVID-19 (10).jpg", "COVID-19 (2).jpg"]
    assert ds.labels.tolist() == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    assert ds.synthetic is False
    for path in ds.paths:  # colour and greyscale, any size -> square greyscale
        assert read_xray(path, 16).shape == (16, 16)


def test_wrong_layout_and_bad_images_name_the_path(tmp_path):
    with pytest.raises(XrayLayoutError, match="no such folder"):
        load_xray(tmp_path / "missing")
    (tmp_path / "x" / "COVID-19").mkdir(parents=True)
    with pytest.raises(XrayLayoutError, match="four class folders"):
        load_xray(tmp_path / "x")
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not a jpeg")
    with pytest.raises(XrayImageError, match="bad.jpg"):
        read_xray(bad, 16)

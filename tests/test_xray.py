"""Chest X-ray loader (Sait et al. layout), its synthetic generator and AlexNet-BN."""

import hashlib
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from fedcare.data.xray.synthetic import generate_xray
from fedcare.data.xray.reader import CLASSES, XrayImageError, XrayLayoutError, load_xray, read_xray
from fedcare.models.alexnet_bn import AlexNetBN


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


def _tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    return h.hexdigest()


def test_generator_writes_the_layout_deterministically(tmp_path):
    summary = generate_xray(tmp_path / "a", seed=3, scale=0.003, image_size=32)
    assert summary["classes"] == {"COVID-19": 4, "Normal": 10, "Pneumonia-Bacterial": 9, "Pneumonia-Viral": 5}
    ds = load_xray(tmp_path / "a")
    assert ds.synthetic and ds.class_counts() == summary["classes"]
    assert (tmp_path / "a" / "Curated X-Ray Dataset" / "Normal" / "Normal (1).jpg").is_file()
    generate_xray(tmp_path / "b", seed=3, scale=0.003, image_size=32)
    generate_xray(tmp_path / "c", seed=4, scale=0.003, image_size=32)
    assert _tree_hash(tmp_path / "a") == _tree_hash(tmp_path / "b") != _tree_hash(tmp_path / "c")
    with pytest.raises(FileExistsError, match="not empty"):
        generate_xray(tmp_path / "a", scale=0.003)


def test_a_failure_leaves_nothing_half_written(tmp_path, monkeypatch):
    calls = []

    def failing_write(path, img, params=None):
        calls.append(path)
        if len(calls) > 5:
            raise OSError("disk full")
        return True

    monkeypatch.setattr(cv2, "imwrite", failing_write)
    with pytest.raises(OSError):
        generate_xray(tmp_path / "out", scale=0.003)
    assert list(tmp_path.iterdir()) == []


def test_classes_are_learnable_from_pixels(tmp_path):
    generate_xray(tmp_path / "d", seed=0, scale=0.03, image_size=48)
    ds = load_xray(tmp_path / "d")
    x = np.stack([read_xray(p, 24).ravel() / 255.0 for p in ds.paths])
    rng = np.random.default_rng(0)
    test = rng.random(len(x)) < 0.3
    model = LogisticRegression(max_iter=2000).fit(x[~test], ds.labels[~test])
    accuracy = (model.predict(x[test]) == ds.labels[test]).mean()
    majority = np.bincount(ds.labels[test]).max() / test.sum()
    assert accuracy > majority + 0.1


def test_alexnet_bn_shapes_and_batchnorm_points():
    model = AlexNetBN(num_classes=4, hidden=64).eval()
    assert model(torch.zeros(2, 1, 64, 64)).shape == (2, 4)
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert len(bns) == 7  # 5 conv + 2 FC: FedHealth 2's 7 statistics points
    full = AlexNetBN(hidden=4096)
    fc = sum(p.numel() for p in full.classifier.parameters())
    assert fc == (9216 * 4096 + 4096) + 2 * 4096 + (4096 * 4096 + 4096) + 2 * 4096 + (4096 * 4 + 4)

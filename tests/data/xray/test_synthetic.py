"""The synthetic chest X-ray generator: the layout, the same bytes for a seed, nothing half-written
on failure, and classes learnable from the pixels."""

import cv2
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from fedcare.data.xray.synthetic import generate_xray
from fedcare.data.xray.reader import load_xray, read_xray

from support import tree_hash


def test_generator_writes_the_layout_deterministically(tmp_path):
    summary = generate_xray(tmp_path / "a", seed=3, scale=0.003, image_size=32)
    assert summary["classes"] == {"COVID-19": 4, "Normal": 10, "Pneumonia-Bacterial": 9, "Pneumonia-Viral": 5}
    ds = load_xray(tmp_path / "a")
    assert ds.synthetic and ds.class_counts() == summary["classes"]
    assert (tmp_path / "a" / "Curated X-Ray Dataset" / "Normal" / "Normal (1).jpg").is_file()
    generate_xray(tmp_path / "b", seed=3, scale=0.003, image_size=32)
    generate_xray(tmp_path / "c", seed=4, scale=0.003, image_size=32)
    assert tree_hash(tmp_path / "a") == tree_hash(tmp_path / "b") != tree_hash(tmp_path / "c")
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


@pytest.mark.parametrize("option, value", [("--scale", "nan"), ("--scale", "inf"), ("--scale", "1e9"),
                                           ("--scale", "0"), ("--image-size", "100000")])
def test_a_scale_or_size_out_of_range_is_one_line_and_writes_nothing(tmp_path, option, value):
    """`--scale nan` passed `scale <= 0` and failed in round() with a traceback."""
    from typer.testing import CliRunner

    from fedcare.cli import app

    result = CliRunner().invoke(app, ["data", "synth", "xray", str(tmp_path / "x"), option, value])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert ("scale must be a number above 0 and at most 10" if option == "--scale"
            else "image_size must be from 16 to 1024") in result.output
    assert list(tmp_path.iterdir()) == []

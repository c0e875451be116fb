import numpy as np
import pytest

from fedcare.data.transforms import CROP_RATIO, four_variants, precrop_size, preprocess


def _face(size=60):
    rng = np.random.default_rng(0)
    img = (rng.random((size, size)) * 80).astype(np.uint8)
    img[10:20, 5:25] = 200  # an asymmetric bright patch: flips and rotations move it
    return img


def test_precrop_keeps_the_thesis_ratio():
    assert precrop_size(215) == 250
    assert precrop_size(32) == int(np.ceil(32 / CROP_RATIO))


def test_preprocess_equalizes_to_the_full_range():
    out = preprocess(_face(), 32)
    assert out.shape == (precrop_size(32),) * 2 and out.dtype == np.uint8
    assert out.min() == 0 and out.max() == 255


def test_preprocess_rejects_colour_input():
    with pytest.raises(ValueError, match="greyscale"):
        preprocess(np.zeros((10, 10, 3), np.uint8), 32)


def test_four_variants_are_original_flipped_and_rotated_copies():
    img = preprocess(_face(), 32)
    v = four_variants(img, 32, rotation_sign=1)
    assert v.shape == (4, 32, 32)
    assert np.array_equal(v[1], four_variants(img[:, ::-1].copy(), 32, 1)[0])
    assert not np.array_equal(v[2], v[0])
    left = four_variants(img, 32, rotation_sign=-1)
    assert np.array_equal(left[0], v[0]) and not np.array_equal(left[2], v[2])


@pytest.mark.parametrize("size", [32, 215])
def test_centre_crop_removes_the_rotation_fill(size):
    white = np.full((precrop_size(size),) * 2, 255, np.uint8)
    rotated = four_variants(white, size, rotation_sign=1)[2:]
    assert rotated.min() > 200  # no black corner survives the crop (edge pixels interpolate a little)

"""The Haar face detector (fedcare.data.haar): its numpy port finds OpenCV's boxes on synthetic
CelebA faces, groups rectangles and scans windows in OpenCV's order."""

from __future__ import annotations

import cv2
import numpy as np

from fedcare.data import haar


def test_numpy_haar_port_matches_opencv_when_opencv_has_the_cascade(celeba_copy):
    files = sorted((celeba_copy[0] / "img_align_celeba").iterdir())[:6]
    port = haar.HaarCascade(backend="numpy")
    found = 0
    for f in files:
        grey = cv2.equalizeHist(cv2.cvtColor(cv2.imread(str(f)), cv2.COLOR_BGR2GRAY))
        boxes = port.detect(grey, 1.1, 5, 48)
        found += len(boxes) > 0
        if haar.opencv_has_cascade():
            reference = haar.HaarCascade(backend="opencv").detect(grey, 1.1, 5, 48)
            assert sorted(map(tuple, boxes.tolist())) == sorted(map(tuple, reference.tolist()))
    assert found >= 4
    flat = np.full((218, 178), 128, np.uint8)
    assert len(port.detect(flat, 1.1, 0, 24)) == 0  # flat windows are rejected (no variance)


def test_group_rectangles_and_the_scan_order():
    rects = np.array([[10, 10, 50, 50], [12, 11, 50, 50], [11, 12, 52, 52], [100, 100, 30, 30]])
    assert haar.group_rectangles(rects, 2).tolist() == [[11, 11, 51, 51]]  # 3 similar boxes, the lone one dropped
    assert haar.group_rectangles(rects, 0).tolist() == rects.tolist()
    # OpenCV skips the window after one rejected by the first stage: brute force vs vectorised
    rng = np.random.default_rng(0)
    reject = rng.random((6, 40)) < 0.6
    for row in range(6):
        visited, x = [], 0
        while x < 40:
            visited.append(x)
            x += 2 if reject[row, x] else 1
        expected = np.zeros(40, bool)
        expected[visited] = True
        assert haar._visited(reject[row : row + 1])[0].tolist() == expected.tolist()

"""The PAMAP2 loader on fixtures in the real layout (NaN, the subject from the file name, malformed
rows named by file and line) and its windowing."""

from pathlib import Path

import numpy as np
import pytest

from fedcare.data.pamap2.reader import (
    CHANNEL_COLUMNS,
    CHANNEL_NAMES,
    PAPER_ACTIVITIES,
    Pamap2FormatError,
    Pamap2LayoutError,
    load_pamap2,
    load_pamap2_windows,
    make_windows,
    read_pamap2_file,
)
from fedcare.data.common import SYNTHETIC_MARKER


REAL_FIRST_ROW = (
    "8.38 0 104 30 2.37223 8.60074 3.51048 2.43954 8.76165 3.35465 -0.0922174 0.0568115 -0.0158445 14.6806 "
    "-69.2128 -5.58905 1 0 0 0 31.8125 0.23808 9.80003 -1.68896 0.265304 9.81549 -1.41344 -0.00506495 "
    "-0.00678097 -0.00566295 0.47196 -51.0499 43.2903 1 0 0 0 30.3125 9.65918 -1.65569 -0.0997967 9.64689 "
    "-1.55576 0.310404 0.00830026 0.00925038 -0.0175803 -61.1888 -38.9599 -58.1438 1 0 0 0"
)


# activity per fixture row: transient, lying, transient, rope jumping (not a paper class),
# ironing directly followed by sitting (no transient in between)
SEGMENTS = [(0, 50), (1, 130), (0, 20), (24, 60), (17, 45), (2, 40)]


def _value(row: int, col: int) -> float:
    return col + row / 1000  # linear in the row: interpolation of a NaN cell is exact


def _fixture_rows(subject_offset: float = 0.0) -> list[str]:
    """§4.5 recipe: timestamps from 8.38 by 0.01, integer HR on every 10th row and NaN otherwise,
    orientation 1 0 0 0, a few NaN IMU cells; cell values encode (row, column)."""
    activity = np.concatenate([np.full(n, a) for a, n in SEGMENTS])
    lines = [REAL_FIRST_ROW]
    for r in range(1, len(activity)):
        cells = [f"{8.38 + r / 100:.2f}", str(int(activity[r])), str(100 + r // 10) if r % 10 == 0 else "NaN"]
        for c in range(3, 54):
            cells.append(f"{_value(r, c) + subject_offset:.6g}")
        for imu_start in (3, 20, 37):  # orientation: invalid, "1 0 0 0"
            cells[imu_start + 13 : imu_start + 17] = ["1", "0", "0", "0"]
        if r == 100:
            cells[4] = "NaN"  # hand acc16 x drop-out inside the lying segment
        if r == 120:
            cells[7] = cells[16] = "NaN"  # acc6 and orientation: not model inputs
        lines.append(" ".join(cells))
    return lines


def _write_fixture(root: Path) -> Path:
    base = root / "PAMAP2_Dataset"
    (base / "Protocol").mkdir(parents=True)
    (base / "Optional").mkdir()
    (base / "readme.pdf").write_bytes(b"%PDF-")
    (base / "Protocol" / "subject101.dat").write_text("\n".join(_fixture_rows()) + "\n")
    (base / "Protocol" / "subject102.dat").write_text("\n".join(_fixture_rows(0.5)) + "\n")
    (base / "Optional" / "subject101.dat").write_text("\n".join(_fixture_rows()[:60]) + "\n")
    return root


def test_channels_are_acc16_gyro_mag_of_the_three_imus():
    expected = [4, 5, 6, 10, 11, 12, 13, 14, 15, 21, 22, 23, 27, 28, 29, 30, 31, 32, 38, 39, 40, 44, 45, 46, 47, 48, 49]
    assert list(CHANNEL_COLUMNS) == expected
    assert len(CHANNEL_NAMES) == 27 and CHANNEL_NAMES[0] == "hand_acc16_x" and CHANNEL_NAMES[-1] == "ankle_mag_z"
    assert PAPER_ACTIVITIES == (1, 2, 3, 4, 6, 7, 12, 13, 16, 17)


def test_reads_the_real_format_with_nan_and_subject_from_the_file_name(tmp_path):
    root = _write_fixture(tmp_path)
    rec = read_pamap2_file(root / "PAMAP2_Dataset" / "Protocol" / "subject102.dat")
    assert rec.subject == 102 and len(rec) == 345
    assert rec.timestamps[0] == pytest.approx(8.38) and rec.timestamps[1] == pytest.approx(8.39)
    assert rec.activity[:3].tolist() == [0, 0, 0] and set(rec.activity.tolist()) == {0, 1, 2, 17, 24}
    assert rec.heart_rate[0] == 104 and rec.heart_rate[10] == 101 and np.isnan(rec.heart_rate[11])
    assert rec.channels.shape == (345, 27) and rec.channels.dtype == np.float32
    assert rec.channels[0, 0] == pytest.approx(2.37223)  # hand acc16 x of the real first row
    assert rec.channels[0, -1] == pytest.approx(-58.1438)  # ankle mag z
    assert rec.channels[5].tolist() == pytest.approx([_value(5, c) + 0.5 for c in CHANNEL_COLUMNS], abs=1e-4)
    rec1 = read_pamap2_file(root / "PAMAP2_Dataset" / "Protocol" / "subject101.dat")
    assert np.isnan(rec1.channels[100, 0]) and not np.isnan(rec1.channels[120]).any()


def test_load_subjects_optional_and_synthetic_flag(tmp_path):
    root = _write_fixture(tmp_path)
    ds = load_pamap2(root)  # the folder holding PAMAP2_Dataset/ ...
    assert ds.subjects() == [101, 102] and ds.root.name == "PAMAP2_Dataset" and ds.synthetic is False
    assert [r.part for r in ds.recordings] == ["Protocol", "Protocol"]
    only = load_pamap2(root / "PAMAP2_Dataset", subjects=[102])  # ... or PAMAP2_Dataset/ itself
    assert [r.subject for r in only.recordings] == [102]
    both = load_pamap2(root, subjects=[101], include_optional=True)
    assert [(r.subject, r.part, len(r)) for r in both.recordings] == [(101, "Protocol", 345), (101, "Optional", 60)]
    with pytest.raises(Pamap2LayoutError, match=r"subject105\.dat"):
        load_pamap2(root, subjects=[105])
    (root / SYNTHETIC_MARKER).write_text("{}")
    assert load_pamap2(root).synthetic is True


def test_windows_drop_activity_0_and_other_activities_and_never_bridge_them(tmp_path):
    root = _write_fixture(tmp_path)
    w = load_pamap2_windows(root, window=20, step=10, subjects=[101], standardize=False)
    # lying: 130 rows -> 12 windows; rope jumping dropped; ironing 45 + sitting 40 = 85 rows -> 7
    assert w.x.shape == (19, 27, 20) and w.x.dtype == np.float32 and w.y.dtype == np.int64
    lying, ironing, sitting = 0, 9, 1
    assert w.y.tolist() == [lying] * 12 + [ironing] * 4 + [sitting] * 3  # window 290..309: 15 ironing, 5 sitting
    assert w.class_names[ironing] == "ironing" and w.class_names[sitting] == "sitting"
    assert w.subject.tolist() == [101] * 19
    assert not np.isnan(w.x).any()
    assert w.x[0, 0, 0] == pytest.approx(_value(50, 4), abs=1e-4)  # first window starts at the first lying row
    assert w.x[4, 0, 10] == pytest.approx(_value(100, 4), abs=1e-4)  # window 4 starts at row 90: the NaN cell, interpolated
    assert w.info["rows_activity_0"] == 70 and w.info["rows_other_activities"] == 60
    z = load_pamap2_windows(root, window=20, step=10, subjects=[101])  # default: z-scored per channel
    assert z.standardized and np.allclose(z.x.mean(axis=(0, 2)), 0, atol=1e-4)
    assert np.allclose(z.x.std(axis=(0, 2)), 1, atol=1e-3)
    assert np.allclose(z.x * z.channel_std[None, :, None] + z.channel_mean[None, :, None], w.x, atol=1e-3)
    last = load_pamap2_windows(root, window=20, step=10, subjects=[101], label_rule="last")
    assert last.y.tolist() == [lying] * 12 + [ironing] * 3 + [sitting] * 4
    dropped = load_pamap2_windows(root, window=20, step=10, subjects=[101], nan_policy="drop")
    assert len(dropped.y) == 12 - 2 + 7  # the NaN row splits lying into 50 + 79 rows: 4 + 6 windows


def test_make_windows_counts_and_label_rules():
    t = np.arange(1000, dtype=np.float32)
    signals = np.stack([t, -t], axis=1)
    labels = np.repeat([3, 5], 500)
    x, y = make_windows(signals, labels, 200, 100)
    assert x.shape == (9, 2, 200) and y.shape == (9,)
    assert x[1, 0, 0] == 100 and x[1, 1, 199] == -299
    assert y.tolist() == [3, 3, 3, 3, 3, 5, 5, 5, 5]  # window 400..599: tie 100/100 -> smaller label
    _, y_last = make_windows(signals, labels, 200, 100, label_rule="last")
    assert y_last.tolist() == [3, 3, 3, 3, 5, 5, 5, 5, 5]
    assert make_windows(signals[:150], labels[:150], 200, 100)[0].shape == (0, 2, 200)
    assert make_windows(signals[:200], labels[:200], 200, 100)[0].shape == (1, 2, 200)
    with pytest.raises(ValueError, match="label_rule"):
        make_windows(signals, labels, 200, 100, label_rule="first")


def _broken(root: Path, line: int, new: str) -> Path:
    path = root / "PAMAP2_Dataset" / "Protocol" / "subject101.dat"
    lines = path.read_text().splitlines()
    lines[line - 1] = new
    path.write_text("\n".join(lines) + "\n")
    return path


def test_malformed_rows_name_the_file_and_line(tmp_path):
    root = _write_fixture(tmp_path)
    good = _fixture_rows()
    _broken(root, 7, " ".join(good[6].split()[:53]))
    with pytest.raises(Pamap2FormatError, match=r"subject101\.dat: line 7: expected 54 .* got 53") as err:
        load_pamap2(root)
    assert err.value.line == 7 and err.value.path.name == "subject101.dat"
    _broken(root, 7, good[6])
    tokens = good[4].split()
    tokens[10] = "0.12x"
    _broken(root, 5, " ".join(tokens))
    with pytest.raises(Pamap2FormatError, match=r"subject101\.dat: line 5: column 11: '0\.12x' is not a number"):
        load_pamap2(root)
    _broken(root, 5, good[4])
    tokens = good[8].split()
    tokens[1] = "8"  # no activity 8 in PAMAP2
    _broken(root, 9, " ".join(tokens))
    with pytest.raises(Pamap2FormatError, match=r"line 9: activity id 8 is not a PAMAP2 activity"):
        load_pamap2(root)
    _broken(root, 9, good[8])
    tokens = good[11].split()
    tokens[0] = "NaN"
    _broken(root, 12, " ".join(tokens))
    with pytest.raises(Pamap2FormatError, match=r"subject101\.dat: line 12: timestamp is NaN"):
        load_pamap2(root)


def test_missing_or_empty_folders_name_the_path(tmp_path):
    with pytest.raises(Pamap2LayoutError, match=r"nowhere: no such folder"):
        load_pamap2(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(Pamap2LayoutError, match=r"empty: no Protocol/ folder"):
        load_pamap2(tmp_path / "empty")
    (tmp_path / "empty" / "PAMAP2_Dataset" / "Protocol").mkdir(parents=True)
    with pytest.raises(Pamap2LayoutError, match=r"Protocol: no subjectNNN\.dat files"):
        load_pamap2(tmp_path / "empty")
    (tmp_path / "empty" / "PAMAP2_Dataset" / "Protocol" / "subject101.dat").write_text("")
    with pytest.raises(Pamap2LayoutError, match=r"subject101\.dat: empty file"):
        load_pamap2(tmp_path / "empty")

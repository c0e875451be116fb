"""The UNBC-McMaster loader on fixture trees in the real layout, and `fedcare data` commands."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from fedcare.data.cli import data_app
from fedcare.data.unbc.reader import (
    PROBLEM_KINDS,
    UnbcImageError,
    UnbcLayoutError,
    UnbcUnusableError,
    load_for_run,
    load_unbc,
    pspi_from_facs,
    read_facs,
    read_grey,
    read_landmarks,
    read_pspi,
)
from fedcare.data.unbc.summary import summarize

from support.unbc_fixtures import FRAMES, SEQUENCE_LABELS, IMAGE_SHAPE, quirk_paths, write_unbc_fixture


ALL_QUIRKS = dict(
    black_frame=True, corrupt_png=True, missing_pspi=True, bad_pspi=True, image_without_label=True,
    label_without_image=True, bad_facs=True, missing_facs=True, empty_facs_with_pain=True,
    missing_landmarks=True, bad_landmarks=True, missing_sequence_label=True, bad_sequence_label=True,
    empty_sequence=True, stray_files=True,
)


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.add_typer(data_app, name="data")
    return app


@pytest.fixture(scope="module")
def clean_root(tmp_path_factory) -> Path:
    return write_unbc_fixture(tmp_path_factory.mktemp("unbc") / "UNBC")


@pytest.fixture(scope="module")
def quirky_root(tmp_path_factory) -> Path:
    return write_unbc_fixture(tmp_path_factory.mktemp("unbc") / "quirky", **ALL_QUIRKS)


# --------------------------------------------------------------------------- readers


def test_read_pspi_parses_matlab_text_with_leading_spaces(tmp_path):
    for text, value in [("   2.0000000e+00\n", 2.0), ("  1.2000000e+01", 12.0), ("0.0000000e+00  \n\n", 0.0), ("3", 3.0)]:
        p = tmp_path / "x_facs.txt"
        p.write_text(text)
        assert read_pspi(p) == value
    for bad in ["", "   \n", "abc", "nan", "   1.7000000e+01\n", "-1.0000000e+00"]:
        p.write_text(bad)
        with pytest.raises(ValueError, match=str(p)):
            read_pspi(p)


def test_read_facs_reads_first_two_fields_and_empty_file(tmp_path):
    p = tmp_path / "f_facs.txt"
    p.write_text("   4.0000000e+00   2.0000000e+00\n   4.3000000e+01   0.0000000e+00   9.0000000e+00\n\n")
    assert read_facs(p) == {4: 2.0, 43: 0.0}
    p.write_text("")
    assert read_facs(p) == {}
    p.write_text("   4.0000000e+00\n")
    with pytest.raises(ValueError, match=str(p)):
        read_facs(p)
    with pytest.raises(ValueError, match="missing.txt"):
        read_facs(tmp_path / "missing.txt")


def test_pspi_from_facs_counts_au43_presence_as_one():
    assert pspi_from_facs({4: 1.0, 6: 1.0, 7: 3.0, 43: 0.0}) == 5.0
    assert pspi_from_facs({9: 2.0, 10: 4.0, 12: 5.0}) == 4.0
    assert pspi_from_facs({}) == 0.0


def test_read_landmarks_shape_and_bad_file_names_path(clean_root, tmp_path):
    pts = read_landmarks(next(clean_root.glob("AAM_landmarks/*/*/*_aam.txt")))
    assert pts.shape == (66, 2) and pts.dtype == np.float64 and (pts >= 0).all()
    bad = tmp_path / "x_aam.txt"
    bad.write_text("1.0 2.0\n" * 65)
    with pytest.raises(ValueError, match=f"{bad}.*66"):
        read_landmarks(bad)
    bad.write_text("1.0 2.0\n" * 65 + "1.0 oops\n")
    with pytest.raises(ValueError, match=str(bad)):
        read_landmarks(bad)


def test_read_grey_returns_uint8_and_fails_naming_the_path(clean_root, tmp_path):
    grey = read_grey(clean_root / "Images/042-ll042/ll042t1aaaff/ll042t1aaaff001.png")
    assert grey.dtype == np.uint8 and grey.shape == IMAGE_SHAPE
    corrupt = tmp_path / "corrupt.png"
    corrupt.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    for path in (corrupt, tmp_path / "missing.png"):
        with pytest.raises(UnbcImageError, match=f"{path}: cannot read image"):
            read_grey(path)


# --------------------------------------------------------------------------- loader


def test_subjects_sessions_and_labels_of_the_clean_fixture(clean_root):
    ds = load_unbc(clean_root, check_images=True)
    assert ds.problems == []
    assert ds.subjects() == [42, 43]
    assert ds.sequences(42) == ["ll042t1aaaff", "ll042t2afaff"]
    assert ds.sequences(43) == ["jh043t1afaff"]
    assert [(f.subject, f.session, f.index) for f in ds.frames] == sorted((f.subject, f.session, f.index) for f in ds.frames)
    assert len(ds.frames) == 9
    by_key = {(f.sequence, f.index): f for f in ds.frames}
    f = by_key[("ll042t2afaff", 3)]
    assert (f.subject, f.session, f.pspi, f.facs) == (42, 1, 1.0, {7: 1.0, 12: 2.0})
    assert f.image == clean_root / "Images/042-ll042/ll042t2afaff/ll042t2afaff003.png"
    assert f.landmarks == clean_root / "AAM_landmarks/042-ll042/ll042t2afaff/ll042t2afaff003_aam.txt"
    assert by_key[("ll042t1aaaff", 1)].facs == {}  # the empty FACS file
    assert by_key[("ll042t1aaaff", 3)].facs == {4: 1.0, 6: 1.0, 43: 0.0}
    for (seq, index), frame in by_key.items():
        assert frame.pspi == FRAMES[seq][index - 1][0]
    assert ds.sequence_labels[(43, "jh043t1afaff")] == SEQUENCE_LABELS["jh043t1afaff"]
    assert ds.synthetic is False


def test_subject_id_is_the_folder_number_and_sessions_follow_sorted_names(tmp_path):
    root = write_unbc_fixture(tmp_path / "r")
    # a third subject sharing initials with 043 ('jh'), sequences created out of name order
    for seq in ("jh123t2aeunaff", "jh123t1afaff", "jh123t1aaunaff"):
        src = root / "Images/043-jh043/jh043t1afaff/jh043t1afaff001.png"
        (root / "Images/123-jh123" / seq).mkdir(parents=True)
        shutil.copy(src, root / "Images/123-jh123" / seq / f"{seq}001.png")
        (root / "Frame_Labels/PSPI/123-jh123" / seq).mkdir(parents=True)
        (root / "Frame_Labels/PSPI/123-jh123" / seq / f"{seq}001_facs.txt").write_text("   0.0000000e+00\n")
    ds = load_unbc(root, subjects=[123, 43])
    assert ds.subjects() == [43, 123]
    assert ds.sequences(123) == ["jh123t1aaunaff", "jh123t1afaff", "jh123t2aeunaff"]
    assert {f.sequence: f.session for f in ds.frames if f.subject == 123} == {
        "jh123t1aaunaff": 0, "jh123t1afaff": 1, "jh123t2aeunaff": 2}
    assert not any(f.subject == 42 for f in ds.frames)  # filtered out


def test_doubled_nesting_gives_the_same_frames(tmp_path):
    plain = load_unbc(write_unbc_fixture(tmp_path / "plain"), check_images=True)
    doubled_root = write_unbc_fixture(tmp_path / "doubled", doubled=True)
    assert (doubled_root / "Frame_Labels/Frame_Labels/PSPI").is_dir() and (doubled_root / "Images/Images").is_dir()
    doubled = load_unbc(doubled_root, check_images=True)
    assert doubled.problems == []

    def key(ds):
        return [(f.subject, f.sequence, f.session, f.index, f.pspi, f.facs, f.image.name,
                 f.landmarks.name if f.landmarks else None) for f in ds.frames]

    assert key(doubled) == key(plain)
    assert doubled.sequence_labels == plain.sequence_labels
    assert doubled.frames[0].image == doubled_root / "Images/Images/042-ll042/ll042t1aaaff/ll042t1aaaff001.png"
    # only Frame_Labels doubled (the Kaggle copy)
    mixed = load_unbc(write_unbc_fixture(tmp_path / "mixed", doubled=["Frame_Labels"]))
    assert key(mixed) == key(plain) and mixed.problems == []


def test_each_problem_kind_is_reported_with_the_exact_path(quirky_root):
    ds = load_unbc(quirky_root, check_images=True)
    reported = {(p.kind, p.path) for p in ds.problems}
    expected = quirk_paths(quirky_root)
    image_without_label = expected.pop("image_without_label")
    for kind, path in expected.items():
        assert (kind, path) in reported, f"{kind} not reported for {path}: {sorted(reported)}"
    # an image without any label is reported as missing_pspi (plus the missing FACS and AAM)
    assert {k for k, p in reported if p == image_without_label} == {"missing_pspi", "missing_facs", "missing_landmarks"}
    assert {p.kind for p in ds.problems} <= set(PROBLEM_KINDS)
    assert set(PROBLEM_KINDS) - {p.kind for p in ds.problems} == set()
    # junk files are ignored silently
    assert not any(p.path.name in (".DS_Store", "Thumbs.db") for p in ds.problems)
    # frames stay (also black/unreadable ones); bad labels become None
    frames = {f.image.name: f for f in ds.frames}
    assert frames["ll042t2afaff003.png"].pspi is None and frames["ll042t2afaff002.png"].pspi is None
    assert frames["jh043t1afaff001.png"].facs is None and frames["jh043t1afaff002.png"].facs is None
    assert frames["ll042t2afaff001.png"].landmarks is None
    assert "VAS" not in ds.sequence_labels[(43, "jh043t1afaff")]
    assert "OPR" not in ds.sequence_labels[(42, "ll042t2afaff")]
    assert len(ds.frames) == 10 and ds.sequences(43) == ["jh043t1afaff"]


def test_without_check_images_only_presence_is_checked(quirky_root):
    ds = load_unbc(quirky_root)
    kinds = {p.kind for p in ds.problems}
    assert not kinds & {"black_frame", "unreadable_image", "bad_landmarks"}
    assert {"missing_pspi", "label_without_image", "stray_file"} <= kinds


def test_check_images_reports_progress(clean_root):
    calls = []
    load_unbc(clean_root, check_images=True, progress=lambda done, total: calls.append((done, total)))
    assert calls[0] == (0, 9) and calls[-1] == (9, 9)


def test_optional_parts_may_be_absent(tmp_path):
    root = write_unbc_fixture(tmp_path / "r", aam=False, sequence_labels=False)
    shutil.rmtree(root / "Frame_Labels/FACS")
    ds = load_unbc(root, check_images=True)
    assert ds.problems == [] and len(ds.frames) == 9
    assert all(f.landmarks is None and f.facs is None for f in ds.frames)
    assert ds.sequence_labels == {}
    assert ds.parts["FACS"] is None and ds.parts["VAS"] is None and ds.parts["Images"] == root / "Images"


@pytest.mark.parametrize("case", ["missing", "empty", "random_files", "a_file", "no_pspi", "no_subjects"])
def test_wrong_layout_raises_naming_the_path(tmp_path, case):
    root = tmp_path / "data"
    if case != "missing":
        root.mkdir()
    if case == "random_files":
        (root / "notes.txt").write_text("hello")
        (root / "pictures").mkdir()
        (root / "pictures" / "cat.png").write_bytes(b"x")
    elif case == "a_file":
        root.rmdir()
        root.write_text("not a folder")
    elif case == "no_pspi":
        write_unbc_fixture(root)
        shutil.rmtree(root / "Frame_Labels/PSPI")
    elif case == "no_subjects":
        (root / "Images" / "misc").mkdir(parents=True)
        (root / "Frame_Labels/PSPI").mkdir(parents=True)
    with pytest.raises(UnbcLayoutError) as info:
        load_unbc(root)
    assert str(root) in str(info.value)
    if case in ("empty", "random_files"):
        assert "no Images/ folder found" in str(info.value)
    if case == "no_pspi":
        assert "Frame_Labels/PSPI" in str(info.value)


def test_layout_error_hints_at_the_right_folder(tmp_path):
    write_unbc_fixture(tmp_path / "outer" / "UNBC")
    with pytest.raises(UnbcLayoutError, match="did you mean .*UNBC"):
        load_unbc(tmp_path / "outer")
    with pytest.raises(UnbcLayoutError, match="Images/ folder itself"):
        load_unbc(tmp_path / "outer" / "UNBC" / "Images")


def test_synthetic_flag_from_marker_file(tmp_path):
    assert load_unbc(write_unbc_fixture(tmp_path / "s", synthetic=True)).synthetic is True


# --------------------------------------------------------------------------- summary


def test_summarize_counts_on_the_fixture(clean_root):
    s = summarize(load_unbc(clean_root, check_images=True))
    json.dumps(s)  # JSON-able
    assert (s["subjects"], s["sequences"], s["frames"], s["pain_frames"]) == (2, 3, 9, 4)
    assert s["pspi_histogram"] == {0: 5, 1: 1, 2: 1, 3: 1, 4: 1}
    assert s["pain_percent"] == round(400 / 9, 2)
    per = {p["subject"]: p for p in s["per_subject"]}
    assert (per[42]["sessions"], per[42]["frames"], per[42]["pain_frames"]) == (2, 6, 3)
    assert (per[43]["sessions"], per[43]["frames"], per[43]["pain_frames"]) == (1, 3, 1)
    assert per[43]["pain_percent"] == round(100 / 3, 2)
    assert s["pspi_vs_facs"] == {"compared": 9, "mismatched": 0}  # AU43 stored as 0 counts as 1
    assert s["empty_facs_files"] == 2 and s["problems"] == [] and s["problem_counts"] == {}


def test_summarize_lists_every_problem_with_counts(quirky_root):
    ds = load_unbc(quirky_root, check_images=True)
    s = summarize(ds)
    assert sum(s["problem_counts"].values()) == len(s["problems"]) == len(ds.problems)
    assert s["problem_counts"]["missing_pspi"] == 2
    assert {"kind": "black_frame", "path": str(quirk_paths(quirky_root)["black_frame"]),
            "detail": "black frame: mean grey level 0.00 < 1.0"} in s["problems"]


# --------------------------------------------------------------------------- CLI


def test_cli_summary_json(quirky_root):
    result = CliRunner().invoke(_cli(), ["data", "summary", "unbc", str(quirky_root), "--json"])
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)
    assert (s["subjects"], s["frames"]) == (2, 10)
    assert s["problem_counts"]["black_frame"] == 1  # images checked by default
    # ll042t2afaff002 (PSPI 0) has no PSPI file and ll042t2afaff003 (PSPI 1) a bad one
    assert s["pspi_histogram"] == {"0": 4, "2": 1, "3": 1, "4": 1}
    assert s["labelled_frames"] == 7 and s["pain_frames"] == 3  # 10 frames: + one image without labels
    fast = json.loads(CliRunner().invoke(_cli(), ["data", "summary", "unbc", str(quirky_root), "--json",
                                                  "--no-check-images"]).stdout)
    assert "black_frame" not in fast["problem_counts"] and fast["checked_images"] is False


def test_cli_summary_tables_and_synthetic_warning(tmp_path):
    root = write_unbc_fixture(tmp_path / "syn", synthetic=True, missing_pspi=True)
    result = CliRunner().invoke(_cli(), ["data", "summary", "unbc", str(root)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "SYNTHETIC" in out and "Subjects" in out and "PSPI histogram" in out
    assert "missing_pspi (1)" in out and "ll042t2afaff002.png" in out


def test_cli_caps_problems_per_kind(tmp_path):
    root = write_unbc_fixture(tmp_path / "r")
    extra = root / "Frame_Labels/PSPI/042-ll042/ll042t1aaaff"
    for i in range(100, 160):
        (extra / f"ll042t1aaaff{i}_facs.txt").write_text("   0.0000000e+00\n")
    result = CliRunner().invoke(_cli(), ["data", "summary", "unbc", str(root), "--no-check-images"])
    assert result.exit_code == 0, result.output
    assert "label_without_image (60)" in result.stdout and "... and 10 more" in result.stdout
    full = json.loads(CliRunner().invoke(_cli(), ["data", "summary", "unbc", str(root), "--json"]).stdout)
    assert len(full["problems"]) == 60


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_cli_bad_path_exits_2_naming_the_path(tmp_path, make):
    path = tmp_path / "nowhere"
    if make == "empty":
        path.mkdir()
    result = CliRunner().invoke(_cli(), ["data", "summary", "unbc", str(path), "--json"])
    assert result.exit_code == 2
    assert str(path) in result.output and "Traceback" not in result.output
    assert result.stdout == ""  # nothing on stdout for a JSON consumer


def test_cli_synth_pain_generates_a_clean_cohort(tmp_path):
    out = tmp_path / "cohort"
    args = ["data", "synth", "pain", str(out), "--subjects", "42,43", "--frame-scale", "0.01", "--image-size", "32"]
    result = CliRunner().invoke(_cli(), args)
    assert result.exit_code == 0, result.output
    ds = load_unbc(out, check_images=True)
    assert ds.problems == [], ds.problems[:5]
    assert len(ds.frames) > 0 and ds.synthetic is True and ds.subjects() == [42, 43]
    again = CliRunner().invoke(_cli(), args)  # exists and no --overwrite
    assert again.exit_code == 2 and "Traceback" not in again.output


def test_load_for_run_gives_the_frames_of_the_subjects_a_run_asks_for(clean_root):
    ds = load_for_run(clean_root, [43])
    frames = ds.frames_of([43])
    assert [f.sequence for f in frames] == ["jh043t1afaff"] * 3 and [f.index for f in frames] == [1, 2, 3]
    assert np.array_equal(frames[1].grey(), read_grey(frames[1].image))


def test_load_for_run_refuses_an_absent_subject_and_unusable_frames(clean_root, tmp_path):
    with pytest.raises(UnbcUnusableError, match=r"subject 99 not found: no .*Images/099-\* folder \(found subjects 42\)"):
        load_for_run(clean_root, [42, 99])
    root = write_unbc_fixture(tmp_path / "UNBC", missing_pspi=True)
    with pytest.raises(UnbcUnusableError, match="frame.* cannot be used:\n  missing_pspi: .*png") as info:
        load_for_run(root, [42, 43])
    assert f"fedcare data summary unbc {root}" in str(info.value)

"""The surgical data layer: frame cache, Cholec80 and HeiChole loaders, the thesis's five
clients, the synthetic generator and the CLI, on small generated videos in both layouts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.data import video as video_module
from fedcare.data.surgical.cholec80 import load_cholec80, read_tool_annotation, split_of
from fedcare.data.surgical.cholec80 import map_tools as cholec_map
from fedcare.data.common import SYNTHETIC_MARKER, DataError
from fedcare.data.surgical.heichole import load_heichole, read_instrument_annotation, test_videos
from fedcare.data.surgical.heichole import map_tools as heichole_map
from fedcare.data.surgical.clients import (
    CLIENTS,
    IMAGENET_MEAN,
    IMAGENET_STD,
    TOOLS,
    BorderThresholds,
    FrameCache,
    SurgicalAnnotationError,
    SurgicalLayoutError,
    VideoDecodeError,
    border_widths,
    classify_border,
    modal_border,
    normalize,
    positive_weights,
    thesis_clients,
    white_frames,
)
from fedcare.data.surgical.synthetic import generate_surgical, plan_videos

SMALL = {"seed": 3, "videos": 2, "heichole_videos": 4, "seconds": 16}
TINY = {"seed": 5, "videos": 2, "heichole_videos": 4, "seconds": 8, "width": 128, "height": 72}
RARE = [TOOLS.index(t) for t in ("Clipper", "Scissors", "Suction-Irrigation", "Specimen Bag")]


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("surgical") / "synth"
    generate_surgical(out, **SMALL)
    return out


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("frames")


@pytest.fixture(scope="module")
def clients(synth, cache_dir):
    return thesis_clients(synth / "cholec80", synth / "heichole", cache=FrameCache(cache_dir), seed=0)


def count_opens(monkeypatch) -> list[str]:
    opened: list[str] = []
    real = cv2.VideoCapture

    def counting(path, *args):
        opened.append(str(path))
        return real(path, *args)

    monkeypatch.setattr(video_module.cv2, "VideoCapture", counting)
    return opened


def write_video(path: Path, frames: list[np.ndarray], fps: int = 25) -> None:
    h, w = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
    assert writer.isOpened()
    for f in frames:
        writer.write(cv2.cvtColor(f, cv2.COLOR_RGB2BGR))
    writer.release()


def copy_cholec(synth: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(synth / "cholec80", tmp_path / "cholec80"))


# --------------------------------------------------------------------------- generator and layouts


def test_generator_writes_both_real_layouts(synth):
    assert json.loads((synth / SYNTHETIC_MARKER).read_text())["seed"] == SMALL["seed"]
    for sub in ("cholec80", "heichole"):
        assert (synth / sub / SYNTHETIC_MARKER).is_file()
    cho = sorted(p.name for p in (synth / "cholec80" / "videos").iterdir())
    assert cho == [f"video{n:02d}.mp4" for n in (1, 2, 3, 4, 5, 61, 62, 63)]  # 5 train, 3 test: the thesis split
    tool = (synth / "cholec80" / "tool_annotations" / "video01-tool.txt").read_text().splitlines()
    assert tool[0] == "Frame\tGrasper\tBipolar\tHook\tScissors\tClipper\tIrrigator\tSpecimenBag"
    assert [line.split("\t")[0] for line in tool[1:4]] == ["0", "25", "50"]
    phase = (synth / "cholec80" / "phase_annotations" / "video01-phase.txt").read_text().splitlines()
    assert phase[0] == "Frame\tPhase" and phase[2].startswith("1\t")
    hei = sorted(p.name for p in (synth / "heichole" / "Videos" / "Full").iterdir())
    assert hei == [f"Hei-Chole{n}.mp4" for n in (1, 13, 14, 15, 16, 2, 3, 4)]
    rows = (synth / "heichole" / "Annotations" / "Instrument" / "Hei-Chole16_Annotation_Instrument.csv").read_text().splitlines()
    assert all(len(r.split(",")) == 22 for r in rows) and rows[1].startswith("1,")
    cap = cv2.VideoCapture(str(synth / "heichole" / "Videos" / "Full" / "Hei-Chole16.mp4"))
    assert cap.get(cv2.CAP_PROP_FPS) == 50 and cap.get(cv2.CAP_PROP_FRAME_COUNT) == len(rows)  # 50 fps, as the real 16
    cap.release()


def test_a_seed_decides_the_timelines():
    a = {p.id: p.presence for p in plan_videos(seed=1, videos=2, heichole_videos=4, seconds=16)}
    b = {p.id: p.presence for p in plan_videos(seed=1, videos=2, heichole_videos=4, seconds=16)}
    c = {p.id: p.presence for p in plan_videos(seed=2, videos=2, heichole_videos=4, seconds=16)}
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert any(a[k].shape != c[k].shape or not np.array_equal(a[k], c[k]) for k in a)


def test_generator_refuses_bad_options(tmp_path):
    with pytest.raises(ValueError, match="even"):
        generate_surgical(tmp_path / "x", width=241)
    with pytest.raises(ValueError, match="heichole_videos"):
        generate_surgical(tmp_path / "x", heichole_videos=3)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError):
        generate_surgical(tmp_path / "full")
    assert not (tmp_path / "x").exists()


# --------------------------------------------------------------------------- loaders


def test_loaders_read_the_generated_copies(synth, cache_dir, clients):
    cache = FrameCache(cache_dir)
    cds = load_cholec80(synth / "cholec80", cache=cache)
    hds = load_heichole(synth / "heichole", cache=cache)
    assert cds.synthetic and hds.synthetic and not cds.problems and not hds.problems
    plans = {p.id: p for p in plan_videos(**{k: v for k, v in SMALL.items()})}
    expected_border = {"CHO1": "large", "CHO2": "intermediate", "CHO3": "none"}
    for v in cds.videos:
        plan = plans[v.id]
        assert v.border == expected_border[plan.client], (v.id, v.border_fraction)
        rows = len((v.annotation).read_text().splitlines()) - 1
        assert v.frames_count == rows == plan.seconds and v.native_fps == 25
        assert v.labels.dtype == np.uint8 and v.labels.shape == (rows, 6)
        assert list(v.seconds) == list(range(rows))
    for v in hds.videos:
        plan = plans[v.id]
        assert v.centre == ("Heidelberg" if v.number <= 12 else "Salem")
        assert v.native_fps == plan.fps and v.frame_count == plan.frames
        assert v.border == ("intermediate" if v.number <= 12 else "none")
        assert v.frames_count + v.white_dropped == plan.seconds
    frames = cds.videos[0].frames(cache)
    assert frames.shape == (cds.videos[0].frames_count, 135, 240, 3) and frames.dtype == np.uint8


def test_layout_errors_name_the_path(tmp_path, synth):
    with pytest.raises(SurgicalLayoutError, match=str(tmp_path / "nope")):
        load_cholec80(tmp_path / "nope")
    with pytest.raises(SurgicalLayoutError, match="did you mean"):
        load_cholec80(synth)
    with pytest.raises(SurgicalLayoutError, match="Annotations/Instrument"):
        load_heichole(synth / "cholec80")


def test_corrupt_mp4_is_an_error_naming_the_file(synth, tmp_path):
    root = copy_cholec(synth, tmp_path)
    bad = root / "videos" / "video02.mp4"
    bad.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 20)
    cut = root / "videos" / "video03.mp4"
    cut.write_bytes(cut.read_bytes()[:2000])
    cache = FrameCache(tmp_path / "c")
    with pytest.raises(VideoDecodeError, match=str(bad)) as err:
        load_cholec80(root, cache=cache, numbers=[1, 2, 3])
    assert isinstance(err.value, DataError) and "1 more problems" in str(err.value)
    ds = load_cholec80(root, cache=cache, numbers=[1, 2, 3], strict=False)
    assert [v.number for v in ds.videos] == [1]
    assert {(p.kind, p.path) for p in ds.problems} == {("unreadable_video", bad), ("unreadable_video", cut)}


def test_missing_annotation_names_the_expected_file(synth, tmp_path):
    root = copy_cholec(synth, tmp_path)
    (root / "tool_annotations" / "video04-tool.txt").unlink()
    with pytest.raises(SurgicalAnnotationError, match="tool_annotations/video04-tool.txt") as err:
        load_cholec80(root, cache=FrameCache(tmp_path / "c"), numbers=[4])
    assert str(root / "videos" / "video04.mp4") in str(err.value)


def test_frame_count_mismatch_beyond_the_tolerance(synth, tmp_path):
    root = copy_cholec(synth, tmp_path)
    path = root / "tool_annotations" / "video05-tool.txt"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-5]) + "\n")  # 5 s short: beyond ±2
    cache = FrameCache(tmp_path / "c")
    with pytest.raises(SurgicalAnnotationError, match="annotation rows") as err:
        load_cholec80(root, cache=cache, numbers=[5])
    assert str(path) in str(err.value) and "video05.mp4" in str(err.value)
    path.write_text("\n".join(lines[:-1]) + "\n")  # 1 s short: within the tolerance
    ds = load_cholec80(root, cache=cache, numbers=[5])
    assert ds.videos[0].frames_count == len(lines) - 2 and ds.videos[0].unlabelled == 1
    hei = Path(shutil.copytree(synth / "heichole", tmp_path / "heichole"))
    csv = hei / "Annotations" / "Instrument" / "Hei-Chole2_Annotation_Instrument.csv"
    csv.write_text("\n".join(csv.read_text().splitlines()[:-100]) + "\n")  # 4 s at 25 fps
    with pytest.raises(SurgicalAnnotationError, match="annotation rows") as err:
        load_heichole(hei, cache=cache, numbers=[2])
    assert str(err.value).startswith(str(csv)) and "Hei-Chole2.mp4" in str(err.value)


@pytest.mark.parametrize("text, message", [
    ("", "empty tool annotation"),
    ("0\t1\t0\t0\t0\t0\t0\t0\n", "line 1: expected the header"),
    ("Frame\tGrasper\tBipolar\tHook\tScissors\tClipper\tIrrigator\tSpecimenBag\n0\t1\t0\t0\t0\t0\t0\t2\n",
     "line 2: tool values must be 0 or 1"),
    ("Frame\tGrasper\tBipolar\tHook\tScissors\tClipper\tIrrigator\tSpecimenBag\n0\t1\t0\t0\t0\t0\t0\t0\n26\t0\t0\t0\t0\t0\t0\t0\n",
     "line 3: frame 26, expected 25"),
    ("Frame\tGrasper\tBipolar\tHook\tScissors\tClipper\tIrrigator\tSpecimenBag\n0\t1\t0\tx\n", "line 2: expected 8 whole numbers"),
])
def test_malformed_cholec80_lines(tmp_path, text, message):
    path = tmp_path / "video01-tool.txt"
    path.write_text(text)
    with pytest.raises(SurgicalAnnotationError, match=message) as err:
        read_tool_annotation(path)
    assert str(err.value).startswith(str(path))


@pytest.mark.parametrize("rows, message", [
    (["0," + ",".join(["0"] * 21), "1," + ",".join(["0"] * 20)], "line 2: expected 22 comma-separated fields"),
    (["0," + ",".join(["0"] * 21), "2," + ",".join(["0"] * 21)], "line 2: frame 2, expected 1"),
    (["0," + ",".join(["0"] * 20) + ",5"], "line 1: category values must be 0 or 1"),
])
def test_malformed_heichole_lines(tmp_path, rows, message):
    path = tmp_path / "Hei-Chole1_Annotation_Instrument.csv"
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(SurgicalAnnotationError, match=message) as err:
        read_instrument_annotation(path)
    assert str(err.value).startswith(str(path))


def test_malformed_annotation_in_a_copy_is_reported_with_its_path(synth, tmp_path):
    root = copy_cholec(synth, tmp_path)
    path = root / "tool_annotations" / "video01-tool.txt"
    path.write_text(path.read_text().replace("\n25\t", "\n25\tx", 1))
    ds = load_cholec80(root, cache=FrameCache(tmp_path / "c"), numbers=[1, 2], strict=False)
    assert [(p.kind, p.path) for p in ds.problems] == [("malformed_annotation", path)]
    assert "line 3" in ds.problems[0].detail and [v.number for v in ds.videos] == [2]


# --------------------------------------------------------------------------- labels, borders, white frames


def test_tool_mapping(tmp_path):
    # Cholec80 columns: Grasper, Bipolar, Hook, Scissors, Clipper, Irrigator, SpecimenBag
    raw = np.array([[0, 1, 0, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0, 0], [1, 0, 0, 1, 1, 1, 1]])
    assert cholec_map(raw).tolist() == [[0, 0, 1, 0, 0, 0], [0, 0, 1, 0, 0, 0], [0, 0, 1, 0, 0, 0], [1, 1, 0, 1, 1, 1]]
    # header order does not matter: columns are found by name
    path = tmp_path / "video01-tool.txt"
    path.write_text("Frame\tHook\tGrasper\tBipolar\tScissors\tClipper\tIrrigator\tSpecimenBag\n0\t1\t0\t0\t0\t0\t0\t0\n")
    assert cholec_map(read_tool_annotation(path)).tolist() == [[0, 0, 1, 0, 0, 0]]
    # HeiChole: c0..c5 one to one, Stapler (c6) and the undefined shaft (c20) dropped
    cats = np.zeros((3, 21), np.uint8)
    cats[0, 6] = 1
    cats[1, 20] = 1
    cats[2, [0, 2, 4]] = 1
    assert heichole_map(cats).tolist() == [[0] * 6, [0] * 6, [1, 0, 1, 0, 1, 0]]


def test_stapler_frames_are_kept_without_a_label(synth, clients):
    stapler_videos = []
    for csv in (synth / "heichole" / "Annotations" / "Instrument").glob("*_Instrument.csv"):
        cats = read_instrument_annotation(csv)
        if cats[:, 6].any():
            stapler_videos.append(csv.name.split("_")[0])
    assert len(stapler_videos) == 1  # one video of one client, as in the thesis
    video = next(v for splits in clients.videos.values() for vs in splits.values() for v in vs if v.id == stapler_videos[0])
    assert video.labels.shape[1] == len(TOOLS) == 6


def test_border_widths_on_known_borders():
    def frame(left: int, right: int, width: int = 240, height: int = 135) -> np.ndarray:
        f = np.full((height, width, 3), (170, 70, 60), np.uint8)
        f[:, :left] = 4
        f[:, width - right:] = 4
        return f

    frames = np.stack([frame(30, 30), frame(30, 31), frame(12, 12), frame(0, 0), frame(3, 3),
                       np.zeros((135, 240, 3), np.uint8)])  # the last one is all black
    frames[1, 60:80, 200:] = 5  # a dark instrument at one edge does not widen the border (smaller side)
    widths = border_widths(frames)
    assert widths.tolist() == [30, 30, 12, 0, 3, -1]
    th = BorderThresholds()
    assert [classify_border(w / 240, th) for w in (30, 12, 3, 0)] == ["large", "intermediate", "none", "none"]
    assert classify_border(12 / 240, BorderThresholds(intermediate=0.06, large=0.2)) == "none"
    # the most frequent width decides, not the largest or the mean
    mixed = np.array([30] * 3 + [12] * 5 + [0] * 2 + [-1] * 9)
    assert modal_border(mixed) == 12
    with pytest.raises(ValueError):
        BorderThresholds(intermediate=0.1, large=0.05)


def test_white_frames_are_detected_and_dropped(synth, clients):
    white = np.full((4, 135, 240, 3), 255, np.uint8)
    white[1, -10:] = 0  # a white frame with an information bar is still white
    white[2] = (235, 150, 140)  # bright tissue is not
    white[3, :, :40] = 0  # a third of the frame dark: not white
    assert white_frames(white).tolist() == [True, True, False, False]
    plans = {p.id: p for p in plan_videos(**SMALL)}
    for splits in (clients.videos["HEI1"], clients.videos["HEI2"]):
        for v in splits["train"] + splits["test"]:
            plan = plans[v.id]
            censored = sum(any(a <= s < b for a, b in plan.white) for s in range(plan.seconds))
            assert v.white_dropped == censored > 0
            assert not white_frames(v.frames(clients.cache)).any()


# --------------------------------------------------------------------------- frame cache


def test_frame_cache_decodes_once(synth, tmp_path, monkeypatch):
    opened = count_opens(monkeypatch)
    cache = FrameCache(tmp_path / "frames")
    ds = load_heichole(synth / "heichole", cache=cache)
    assert len(opened) == len(ds.videos) == 8
    stats = cache.stats()
    assert (stats.misses, stats.hits, stats.files) == (8, 0, 8)
    expected = sum(v.sampled for v in ds.videos) * 135 * 240 * 3
    assert expected < stats.bytes < expected + 8 * 4096
    opened.clear()
    second = FrameCache(tmp_path / "frames")  # a new process would see the same
    again = load_heichole(synth / "heichole", cache=second)
    assert opened == [] and second.stats().hits == 8 and second.stats().misses == 0
    assert [v.labels.tolist() for v in again.videos] == [v.labels.tolist() for v in ds.videos]
    arr = np.load(next((tmp_path / "frames").glob("Hei-Chole1-*.npy")), mmap_mode="r")
    assert isinstance(arr, np.memmap) and arr.dtype == np.uint8 and arr.shape[1:] == (135, 240, 3)
    assert not list((tmp_path / "frames").glob(".*"))  # no temporary file left behind


def test_frame_cache_key_sampling_and_colours(tmp_path, monkeypatch):
    # frame i is pure red with brightness 2*i: the cached frames show which frames were taken, in RGB
    frames = [np.zeros((72, 128, 3), np.uint8) for _ in range(60)]
    for i, f in enumerate(frames):
        f[..., 0] = 2 * i + 40
    path = tmp_path / "clip.mp4"
    write_video(path, frames)
    cache = FrameCache(tmp_path / "c")
    got = cache.get(path)
    assert got.info.frame_indices == (0, 25, 50) and got.info.step == 25 and got.info.frame_count == 60
    assert got.frames.shape == (3, 135, 240, 3)
    red = got.frames[:, 60:70, 100:110].reshape(3, -1, 3).mean(axis=1)
    assert np.allclose(red[:, 0], [40, 90, 140], atol=6) and (red[:, 1:] < 10).all()
    assert cache.get(path, fps=5).info.step == 5  # another sampling is another entry
    assert cache.get(path, indices=[3, 7]).frames.shape[0] == 2
    small = FrameCache(tmp_path / "c", size=(64, 36))
    assert small.frames(path).shape == (3, 36, 64, 3)
    assert cache.stats().files == 4
    key = cache.key(path)
    import os
    os.utime(path, ns=(1, 1))  # an edited video is a new entry
    assert cache.key(path) != key
    opened = count_opens(monkeypatch)
    cache.frames(path)
    assert len(opened) == 1
    path.unlink()
    with pytest.raises(VideoDecodeError, match="clip.mp4"):
        cache.frames(path)


def test_default_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDCARE_CACHE", str(tmp_path / "env"))
    assert FrameCache().root == tmp_path / "env"
    monkeypatch.delenv("FEDCARE_CACHE")
    assert FrameCache().root == Path.home() / ".cache" / "fedcare" / "frames"


# --------------------------------------------------------------------------- clients


def test_thesis_clients(synth, cache_dir, clients):
    assert clients.names == list(CLIENTS) == ["HEI1", "HEI2", "CHO1", "CHO2", "CHO3"]
    for name in ("HEI1", "HEI2"):
        assert len(clients.videos[name]["test"]) == 3 and len(clients.videos[name]["train"]) == 1
        assert {v.centre for s in clients.videos[name].values() for v in s} == {"Heidelberg" if name == "HEI1" else "Salem"}
    for name, border in (("CHO1", "large"), ("CHO2", "intermediate"), ("CHO3", "none")):
        assert {v.border for s in clients.videos[name].values() for v in s} == {border}
        assert all(split_of(v.number) == split for split, vs in clients.videos[name].items() for v in vs)
        assert all(v.number >= 61 for v in clients.videos[name]["test"])
    again = thesis_clients(synth / "cholec80", synth / "heichole", cache=FrameCache(cache_dir), seed=0)
    assert {c: {s: [v.id for v in vs] for s, vs in sp.items()} for c, sp in again.videos.items()} == \
        {c: {s: [v.id for v in vs] for s, vs in sp.items()} for c, sp in clients.videos.items()}
    assert test_videos(range(1, 13), "Heidelberg", seed=0) == test_videos(range(1, 13), "Heidelberg", seed=0)
    assert len({tuple(test_videos(range(1, 13), "Salem", seed=s)) for s in range(6)}) > 1
    x, y = clients.arrays("CHO2", "train")
    assert x.dtype == np.uint8 and x.shape[1:] == (135, 240, 3) and y.shape == (len(x), 6) and y.dtype == np.uint8
    prev = clients.prevalence()
    assert set(prev) == set(CLIENTS) and set(prev["HEI1"]["train"]) == set(TOOLS)
    summary = clients.summary()
    assert json.loads(json.dumps(summary))["clients"]["CHO1"]["test"]["frames"] == clients.counts()["CHO1"]["test"]
    with pytest.raises(SurgicalLayoutError, match="test videos"):
        thesis_clients(None, synth / "heichole", cache=FrameCache(cache_dir), heichole_test=4)


def test_the_generators_promised_skews(clients):
    counts = clients.counts()
    total = {c: sum(s.values()) for c, s in counts.items()}
    assert 1.6 <= total["CHO2"] / total["CHO1"] <= 2.4  # quantity skew
    assert total["HEI1"] < total["CHO1"] and total["HEI2"] < total["CHO3"]
    labels = {c: np.concatenate([clients.labels(c, s) for s in clients.splits(c)]) for c in clients.names}
    rare = {c: labels[c][:, RARE].mean() for c in labels}
    assert all(rare["HEI1"] > rare[c] for c in labels if c != "HEI1")  # label skew
    coag = TOOLS.index("Coagulation Instrument")
    assert labels["HEI1"][:, coag].mean() < min(labels[c][:, coag].mean() for c in labels if c != "HEI1") - 0.1
    suction = TOOLS.index("Suction-Irrigation")
    assert clients.labels("HEI2", "test")[:, suction].sum() == 0 < clients.labels("HEI2", "train")[:, suction].sum()
    for c in clients.names:
        for s in clients.splits(c):
            present = clients.labels(c, s).sum(axis=0) > 0
            missing = [TOOLS[j] for j in np.flatnonzero(~present)]
            assert missing == (["Suction-Irrigation"] if (c, s) == ("HEI2", "test") else []), (c, s, missing)
    # centre-specific colour: HeiChole brighter than Cholec80
    mean = {c: clients.frames(clients.videos[c]["train"][0])[:, 40:90, 100:140].mean() for c in ("HEI2", "CHO3")}
    assert mean["HEI2"] > mean["CHO3"] + 10


def test_normalize_and_weights():
    assert IMAGENET_MEAN == (0.485, 0.456, 0.406) and IMAGENET_STD == (0.229, 0.224, 0.225)
    frames = np.zeros((2, 4, 5, 3), np.uint8)
    frames[..., 0] = 255
    x = normalize(frames)
    assert tuple(x.shape) == (2, 3, 4, 5) and str(x.dtype) == "torch.float32"
    assert np.isclose(float(x[0, 0, 0, 0]), (1 - 0.485) / 0.229) and np.isclose(float(x[1, 2, 3, 4]), -0.406 / 0.225)
    with pytest.raises(ValueError):
        normalize(frames.astype(np.float32))
    y = np.array([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]], np.uint8)
    assert positive_weights(y).tolist() == [1 / 3, 3.0, 1.0, 1.0, 1.0, 1.0]


# --------------------------------------------------------------------------- CLI


@pytest.mark.parametrize("command", [["data", "summary", "cholec80"], ["data", "summary", "heichole"],
                                     ["data", "synth", "surgical"]], ids=" ".join)
def test_cli_help(command):
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "Usage" in result.output and "--json" in result.output if command[1] == "summary" else "--seed" in result.output
    group = typer.main.get_command(app)
    for name in command:
        group = group.commands[name]
    params = [p for p in group.params if p.name != "help"]
    assert len(params) >= 6
    assert all(getattr(p, "help", None) for p in params), [p.name for p in params if not getattr(p, "help", None)]


def test_cli_summary(synth, cache_dir, clients):
    result = CliRunner().invoke(app, ["data", "summary", "cholec80", str(synth / "cholec80"), "--cache", str(cache_dir),
                                      "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["videos"] == 8 and summary["synthetic"] and summary["problems"] == []
    assert summary["border_classes"] == {"large": 2, "intermediate": 4, "none": 2}
    assert set(summary["clients"]) == {"CHO1", "CHO2", "CHO3"} and summary["cache"]["misses"] == 0
    result = CliRunner().invoke(app, ["data", "summary", "heichole", str(synth / "heichole"), "--cache", str(cache_dir)])
    assert result.exit_code == 0, result.output
    for text in ("SYNTHETIC", "Hei-Chole16", "Salem", "Tool prevalence", "HEI1", "white", "no problems found"):
        assert text in result.output


def test_cli_reports_problems_and_bad_paths(synth, tmp_path):
    root = copy_cholec(synth, tmp_path)
    (root / "tool_annotations" / "video62-tool.txt").unlink()
    result = CliRunner().invoke(app, ["data", "summary", "cholec80", str(root), "--cache", str(tmp_path / "c")])
    assert result.exit_code == 0 and "missing_annotation" in result.output
    assert str(root / "videos" / "video62.mp4") in result.output.replace("\n", "")
    missing = tmp_path / "no-such-copy"
    for command in (["data", "summary", "cholec80", str(missing)], ["data", "summary", "heichole", str(missing)]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2 and str(missing) in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) <= 3
    result = CliRunner().invoke(app, ["data", "synth", "surgical", str(tmp_path / "s"), "--width", "241"])
    assert result.exit_code == 2 and "even" in result.output


def test_cli_synth_surgical_is_deterministic(tmp_path):
    out = tmp_path / "cli-synth"
    args = ["--seed", "5", "--videos", "2", "--heichole-videos", "4", "--seconds", "8", "--width", "128", "--height", "72"]
    result = CliRunner().invoke(app, ["data", "synth", "surgical", str(out), *args], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "CHO2" in result.output and (out / "cholec80" / SYNTHETIC_MARKER).is_file()
    marker = json.loads((out / SYNTHETIC_MARKER).read_text())
    assert marker["options"]["width"] == 128 and marker["generator"] == "fedcare.data.synthetic.surgical"
    cap = cv2.VideoCapture(str(out / "cholec80" / "videos" / "video01.mp4"))
    assert (cap.get(cv2.CAP_PROP_FRAME_WIDTH), cap.get(cv2.CAP_PROP_FRAME_HEIGHT)) == (128, 72)
    cap.release()
    result = CliRunner().invoke(app, ["data", "synth", "surgical", str(out)])
    assert result.exit_code == 2 and "--overwrite" in result.output
    # the same seed and options again: the same annotation files, the same pictures
    again = tmp_path / "again"
    generate_surgical(again, **TINY)
    texts = sorted(p.relative_to(out) for p in out.rglob("*") if p.suffix in (".txt", ".csv"))
    assert len(texts) == 8 * 2 + 8 * 2
    for rel in texts:
        assert (again / rel).read_bytes() == (out / rel).read_bytes(), rel
    cache = FrameCache(tmp_path / "c")
    for rel in ("cholec80/videos/video61.mp4", "heichole/Videos/Full/Hei-Chole16.mp4"):
        a, b = cache.frames(out / rel), cache.frames(again / rel)
        assert a.shape == b.shape and np.abs(a.astype(int) - b.astype(int)).mean() < 1.0


@pytest.mark.parametrize("how", ["deleted", "link to /dev/zero"])
def test_a_video_its_annotation_lists_but_the_copy_lacks_is_an_error(synth, tmp_path, how):
    """A missing video (annotation kept) dropped CHO2's frames 29 -> 17 with exit 0 and no note."""
    root = copy_cholec(synth, tmp_path)
    video = root / "videos" / "video02.mp4"
    video.unlink()
    if how != "deleted":
        video.symlink_to("/dev/zero")
    with pytest.raises(SurgicalAnnotationError, match="video02-tool.txt: no video") as err:
        load_cholec80(root, cache=FrameCache(tmp_path / "c"), numbers=[1, 2, 3])
    assert isinstance(err.value, DataError)
    ds = load_cholec80(root, cache=FrameCache(tmp_path / "c"), numbers=[1, 2, 3], strict=False)  # the summary lists it
    assert ("annotation_without_video", root / "tool_annotations" / "video02-tool.txt") in {(p.kind, p.path) for p in ds.problems}


def test_a_zero_filled_cache_entry_of_the_right_size_is_decoded_again(synth, tmp_path):
    """A crash can leave a file of the right size full of zeros: it was served as frames."""
    import os

    video = synth / "cholec80" / "videos" / "video01.mp4"
    first = FrameCache(tmp_path / "c")
    frames = np.array(first.frames(video))
    npy = next((tmp_path / "c").glob("*.npy"))
    meta = json.loads(npy.with_suffix(".json").read_text())
    assert len(meta["frames_sha256"]) == 64
    assert npy.stat().st_mode & 0o777 == 0o666 & ~_umask()  # entries follow the umask, not a fixed 0644
    header = npy.stat().st_size - frames.nbytes
    with open(npy, "r+b") as f:
        f.seek(header)
        f.write(bytes(frames.nbytes))
        f.flush()
        os.fsync(f.fileno())
    again = FrameCache(tmp_path / "c")
    assert np.array_equal(again.frames(video), frames)
    assert again.stats().misses == 1 and again.stats().hits == 0  # checked, found damaged, decoded again
    assert np.array_equal(FrameCache(tmp_path / "c").frames(video), frames)


def _umask() -> int:
    from fedcare.files import umask

    return umask()


def test_a_sigkilled_decodes_scratch_file_is_removed_by_the_next_decode(synth, tmp_path):
    """A SIGKILL while decoding left `.decode-*.raw` in the cache forever."""
    import os
    import subprocess
    import sys

    from fedcare.data.video import _decode_prefix

    root = tmp_path / "c"
    root.mkdir()
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    left = root / f"{_decode_prefix(dead)}abc.raw"
    left.write_bytes(b"x" * 100)
    running = root / f"{_decode_prefix(os.getpid())}def.raw"  # a decode going on in a live process
    running.write_bytes(b"y")
    FrameCache(root).frames(synth / "cholec80" / "videos" / "video01.mp4")
    assert not left.exists() and running.exists()

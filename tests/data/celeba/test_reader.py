"""The CelebA reader: the loader on the generated copy and hand-written layouts (bad input named by
file and line), Haar crops and their cache, the federated client arrays and the `fedcare data`
commands."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.data.celeba.reader import (
    ATTRIBUTES,
    CelebaFormatError,
    CelebaImageError,
    CelebaLayoutError,
    find_celeba,
    load_celeba,
)
from fedcare.data.celeba.faces import DetectorParams, FaceCropper, crop_face, default_cache_dir
from fedcare.data.celeba.summary import summarize
from fedcare.data.celeba.federation import federated_celeba
from fedcare.data.common import DataError

from support.celeba_layout import attribute_row, write_jpeg, write_layout


# --------------------------------------------------------------------------- loader


def test_loader_reads_the_generated_copy(celeba_copy):
    root, summary = celeba_copy
    ds = load_celeba(root)
    assert ds.synthetic and len(ds) == summary["images"] and ds.problems == []
    assert ds.identity_ids().tolist() == list(range(1, 9))
    assert ds.attributes.shape == (len(ds), 40) and ds.attributes.dtype == bool
    assert {n: int(ds.attribute(n).sum()) for n in ATTRIBUTES} == summary["attribute_counts"]
    assert sorted(np.unique(ds.partition).tolist()) == [0, 1, 2]
    assert ds.path(0).is_file()
    with pytest.raises(DataError, match="did you mean 'Eyeglasses'"):
        ds.attribute("eyeglasses")


def test_loader_handles_irregular_spacing_and_the_official_tree(tmp_path):
    a = np.zeros(40, bool)
    a[ATTRIBUTES.index("Male")] = a[ATTRIBUTES.index("Young")] = True
    root = tmp_path / "CelebA"
    (root / "Img" / "img_align_celeba").mkdir(parents=True)
    (root / "Anno").mkdir()
    (root / "Eval").mkdir()
    for n in ("000001.jpg", "000002.jpg", "000003.jpg"):
        write_jpeg(root / "Img" / "img_align_celeba" / n)
    (root / "Anno" / "identity_CelebA.txt").write_text("000001.jpg 2880\n000002.jpg\t\t2937\n\n000003.jpg   2880  \n")
    names = "  ".join(ATTRIBUTES)
    rows = "".join(attribute_row(n, a) for n in ("000001.jpg", "000002.jpg"))
    rows += "000003.jpg" + "\t".join(f"  {1 if v else -1}" for v in a) + "\n"
    (root / "Anno" / "list_attr_celeba.txt").write_text(f"3\n{names} \n{rows}")
    (root / "Eval" / "list_eval_partition.txt").write_text("000001.jpg 0\n000002.jpg 1\n000003.jpg    2\n")
    ds = load_celeba(tmp_path)  # the folder above CelebA/
    assert ds.filenames == ["000001.jpg", "000002.jpg", "000003.jpg"]
    assert ds.identities.tolist() == [2880, 2937, 2880] and ds.partition.tolist() == [0, 1, 2]
    assert ds.attribute("Male").all() and ds.attribute("Young").all() and not ds.attribute("Bald").any()
    assert ds.rows_by_identity[2880].tolist() == [0, 2] and not ds.synthetic
    flat = write_layout(tmp_path / "flat", [("000001.jpg", 7, a)], partition=False)
    files = find_celeba(flat)
    assert files.partition is None and load_celeba(flat).partition is None


def _base(tmp_path: Path) -> Path:
    a = np.zeros(40, bool)
    return write_layout(tmp_path / "c", [(f"{i:06d}.jpg", 1 + i % 2, a) for i in range(1, 5)])


@pytest.mark.parametrize("case, error, pattern", [
    ("no_identity", CelebaLayoutError, r"identity_CelebA\.txt: identity file missing"),
    ("columns", CelebaFormatError, r"list_attr_celeba\.txt:4: expected 41 fields .* found 40"),
    ("value", CelebaFormatError, r"list_attr_celeba\.txt:5: 000003\.jpg: attribute Bald \(field 6\) is '0', not -1 or 1"),
    ("missing_image", CelebaImageError, r"img_align_celeba/000004\.jpg: listed in identity_CelebA\.txt line 4 but missing"),
    ("identity_line", CelebaFormatError, r"identity_CelebA\.txt:2: expected 'file identity', got '000002\.jpg two'"),
    ("count", CelebaFormatError, r"list_attr_celeba\.txt:1: count line says 9 images, the file has 4 rows"),
    ("header", CelebaFormatError, r"list_attr_celeba\.txt:2: expected the 40 CelebA attribute names.*unknown: Glasses"),
    ("no_images", CelebaLayoutError, r"no img_align_celeba/ folder"),
])
def test_bad_input_names_the_file_and_line(tmp_path, case, error, pattern):
    root = _base(tmp_path)
    attr = root / "list_attr_celeba.txt"
    lines = attr.read_text().splitlines(keepends=True)
    if case == "no_identity":
        (root / "identity_CelebA.txt").unlink()
    elif case == "columns":
        lines[3] = " ".join(lines[3].split()[:-1]) + "\n"
        attr.write_text("".join(lines))
    elif case == "value":
        fields = lines[4].split()
        fields[1 + ATTRIBUTES.index("Bald")] = "0"
        lines[4] = " ".join(fields) + "\n"
        attr.write_text("".join(lines))
    elif case == "missing_image":
        (root / "img_align_celeba" / "000004.jpg").unlink()
    elif case == "identity_line":
        ident = root / "identity_CelebA.txt"
        ident.write_text(ident.read_text().replace("000002.jpg   1", "000002.jpg two"))
    elif case == "count":
        attr.write_text("9\n" + "".join(lines[1:]))
    elif case == "header":
        attr.write_text(lines[0] + lines[1].replace("Eyeglasses", "Glasses") + "".join(lines[2:]))
    elif case == "no_images":
        os.rename(root / "img_align_celeba", root / "images")
    with pytest.raises(error, match=pattern) as info:
        load_celeba(root)
    assert isinstance(info.value, DataError) and "\n" not in str(info.value)
    if case not in ("no_identity", "no_images"):  # non-strict: recorded with its path, the rest loads
        ds = load_celeba(root, strict=False)
        assert ds.problems and re.search(pattern, ds.problems[0].message())
        assert len(ds) <= 4 and (len(ds) > 0 or case == "header")  # a bad header drops every row


def test_unreadable_image_is_a_data_error_naming_it(tmp_path, cache):
    root = _base(tmp_path)
    (root / "img_align_celeba" / "000002.jpg").write_bytes(b"not a jpeg")
    ds = load_celeba(root)  # listed and present: fine until decoded
    with pytest.raises(CelebaImageError, match=r"000002\.jpg: cannot decode image"):
        FaceCropper(cache_dir=cache).faces(ds)
    with pytest.raises(CelebaImageError, match=r"000002\.jpg"):
        load_celeba(root, check_images=True)
    faces = FaceCropper(cache_dir=cache).faces(ds, strict=False)
    assert [ds.filenames[r] for r in faces.unreadable] == ["000002.jpg"]
    assert [p.kind for p in ds.problems] == ["unreadable_image"]


# --------------------------------------------------------------------------- faces and cache


def test_haar_crops_and_drops_images_without_a_face(tmp_path, cropped, cache):
    ds, cropper, faces = cropped
    assert faces.detection_rate >= 0.75  # synthetic faces are made to be found (about 90% on large copies)
    assert len(faces.rows) + len(faces.no_face) == len(ds) and len(faces.unreadable) == 0
    crops = faces.images(faces.rows[:5])
    assert crops.shape == (5, 128, 128, 3) and crops.dtype == np.uint8
    # a flat grey image has no face: dropped and counted
    grey = write_layout(tmp_path / "grey", [("000001.jpg", 1, np.zeros(40, bool))])
    gds = load_celeba(grey)
    gfaces = FaceCropper(cache_dir=cache).faces(gds)
    assert len(gfaces.rows) == 0 and gfaces.no_face.tolist() == [0] and gfaces.detection_rate == 0.0
    again = FaceCropper(cache_dir=cache)
    assert again.faces(gds).no_face.tolist() == [0] and again.stats.decoded == 0  # "no face" is cached too
    with pytest.raises(KeyError, match="no face"):
        gfaces.images([0])


def test_crop_face_geometry():
    image = np.zeros((218, 178, 3), np.uint8)
    image[50:150, 40:140] = (0, 0, 255)  # red square (BGR) = the "face box"
    crop = crop_face(image, (40, 50, 100, 100), margin=0.0, size=128)
    assert crop.shape == (128, 128, 3) and crop[64, 64].tolist() == [255, 0, 0]  # RGB out
    wide = crop_face(image, (40, 50, 100, 100), margin=0.25, size=128)
    assert wide[2, 2].tolist() == [0, 0, 0] and wide[64, 64].tolist() == [255, 0, 0]
    edge = crop_face(image, (150, 190, 40, 40), margin=0.5, size=64)  # leaves the image: border replicated
    assert edge.shape == (64, 64, 3)


def test_the_cache_makes_the_second_pass_decode_nothing(cropped, cache, celeba_copy):
    ds, first, faces = cropped
    assert first.stats.misses == 8 and first.stats.hits == 0 and first.stats.decoded == len(ds)
    again = FaceCropper(cache_dir=cache)
    faces2 = again.faces(ds)
    assert again.stats.decoded == 0 and again.stats.hits == 8 and again.stats.misses == 0
    assert np.array_equal(faces2.rows, faces.rows) and np.array_equal(faces2.images(), faces.images())
    # another margin is another cache entry; a touched image invalidates only its identity
    other = FaceCropper(cache_dir=cache, params=DetectorParams(margin=0.3))
    other.faces(ds, [1])
    assert other.stats.misses == 1 and other.stats.decoded == len(ds.rows_by_identity[1])
    path = ds.path(int(ds.rows_by_identity[2][0]))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    third = FaceCropper(cache_dir=cache)
    third.faces(ds)
    assert third.stats.misses == 1 and third.stats.hits == 7 and third.stats.decoded == len(ds.rows_by_identity[2])
    entries = list((cache / "celeba-faces-v1").rglob("*.npy"))
    assert entries and not list((cache / "celeba-faces-v1").rglob("*.tmp"))


def test_default_cache_dir_follows_fedcare_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDCARE_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path / "faces"
    monkeypatch.delenv("FEDCARE_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "fedcare" / "faces"


# --------------------------------------------------------------------------- pipeline and CLI


def test_federated_celeba_from_root_to_client_arrays(celeba_copy, cropped, cache):
    data = federated_celeba(celeba_copy[0], "equal", n_identities=8, n_clients=4, min_faces=2, cache_dir=cache)
    assert data.cache_stats["decoded"] == 0  # all from the cache made by the `cropped` fixture
    assert [c.client for c in data.clients] == [1, 2, 3, 4] and data.n_global_classes == 8
    for c in data.clients:
        assert c.n_classes == 2 and not c.unseen
        x, y = c.train.images, c.train.labels
        assert x.shape[1:] == (128, 128, 3) and x.dtype == np.uint8 and len(x) == len(y)
        assert set(y.tolist()) == {0, 1} and set(c.test.labels.tolist()) <= {0, 1} and len(c.test)
        assert set(c.train.identities.tolist()) == set(c.test.identities.tolist())
    attr = federated_celeba(celeba_copy[0], "attribute", attribute_scale=0.01, cache_dir=cache)
    assert len(attr.clients) == 20 and [c.client for c in attr.unseen_clients()] == [16, 17, 18, 19, 20]
    with pytest.raises(ValueError, match="partition"):
        federated_celeba(celeba_copy[0], "dirichlet")


def test_cli_synth_and_summary(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDCARE_CACHE", str(tmp_path / "cache"))
    runner = CliRunner()
    out = tmp_path / "copy"
    result = runner.invoke(app, ["data", "synth", "celeba", str(out), "--identities", "3", "--images-per-identity", "3"])
    assert result.exit_code == 0, result.output
    assert "synthetic CelebA" in result.stdout and "3 identities" in result.stdout
    result = runner.invoke(app, ["data", "summary", "celeba", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["synthetic"] and summary["identities"] == 3 and summary["problems"] == []
    assert summary["detection"]["images"] == summary["images"] and 0 < summary["detection"]["rate_percent"] <= 100
    assert len(summary["attribute_filters"]) == 20 and set(summary["attribute_prevalence_percent"]) == set(ATTRIBUTES)
    assert list((tmp_path / "cache" / "faces" / "celeba-faces-v1").rglob("*.json"))
    result = runner.invoke(app, ["data", "summary", "celeba", str(out), "--no-detect"])
    assert result.exit_code == 0 and "--no-detect" in result.stdout and "Table 4.1" in result.stdout
    # a problem is listed with its file and line; a non-copy is a one-line error, exit 2
    attr = out / "list_attr_celeba.txt"
    lines = attr.read_text().splitlines(keepends=True)
    attr.write_text("".join(lines[:2]) + lines[2].replace(" 1", " 2", 1) + "".join(lines[3:]))
    result = runner.invoke(app, ["data", "summary", "celeba", str(out), "--no-detect", "--json"])
    problems = json.loads(result.stdout)["problems"]
    assert problems[0]["kind"] == "bad_attribute_value" and problems[0]["line"] == 3
    assert problems[0]["path"].endswith("list_attr_celeba.txt")
    result = runner.invoke(app, ["data", "summary", "celeba", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "no such file" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["data", "synth", "celeba", str(out), "--identities", "2"])
    assert result.exit_code == 2 and "not empty" in result.output
    for command in (["data", "summary", "celeba"], ["data", "synth", "celeba"]):
        help_text = runner.invoke(app, [*command, "--help"]).stdout
        assert "Usage" in help_text and "--json" in help_text or "--identities" in help_text


def test_summarize_counts(celeba_copy):
    ds = load_celeba(celeba_copy[0])
    s = summarize(ds)
    assert s["identities"] == 8 and s["images"] == len(ds) and s["detection"] is None
    assert s["partition"]["train"] + s["partition"]["valid"] + s["partition"]["test"] == len(ds)
    male = s["attribute_prevalence_percent"]["Male"]
    assert male == round(100 * ds.attribute("Male").mean(), 2)

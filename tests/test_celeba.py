"""CelebA data layer: loader (real layout, bad input named by file and line), Haar crops and
their cache, the Hess thesis's three partitions, the synthetic generator and the CLI."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.data import haar
from fedcare.data.celeba import identity_partition as ip
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
from fedcare.data.common import SYNTHETIC_MARKER, DataError
from fedcare.data.celeba.synthetic import HEIGHT, WIDTH, draw_face, generate_celeba

SMALL = dict(identities=8, images_per_identity=4, workers=1)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("celeba") / "synth"
    return root, generate_celeba(root, seed=0, **SMALL)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def cropped(synth, cache):
    """One cropping pass over the synthetic copy, shared (the detector is the slow part)."""
    ds = load_celeba(synth[0])
    cropper = FaceCropper(cache_dir=cache)
    return ds, cropper, cropper.faces(ds)


def _jpeg(path: Path, value: int = 128, size=(HEIGHT, WIDTH)) -> None:
    ok, buf = cv2.imencode(".jpg", np.full((*size, 3), value, np.uint8))
    path.write_bytes(buf.tobytes())


def _attr_row(name: str, values) -> str:
    return name + "".join(f" {1 if v else -1:2d}" for v in values) + "\n"


def _write_layout(root: Path, rows: list[tuple[str, int, np.ndarray]], partition: bool = True) -> Path:
    """A tiny hand-written CelebA copy: (file name, identity, 40 bools) rows, grey JPEGs."""
    (root / "img_align_celeba").mkdir(parents=True)
    for name, _, _ in rows:
        _jpeg(root / "img_align_celeba" / name)
    (root / "identity_CelebA.txt").write_text("".join(f"{n}   {i}\n" for n, i, _ in rows))
    (root / "list_attr_celeba.txt").write_text(
        f"{len(rows)}\n" + " ".join(ATTRIBUTES) + " \n" + "".join(_attr_row(n, a) for n, _, a in rows))
    if partition:
        (root / "list_eval_partition.txt").write_text("".join(f"{n} {k % 3}\n" for k, (n, _, _) in enumerate(rows)))
    return root


# --------------------------------------------------------------------------- generator


def test_generator_writes_the_celeba_layout(synth):
    root, summary = synth
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


# --------------------------------------------------------------------------- loader


def test_loader_reads_the_generated_copy(synth):
    root, summary = synth
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
        _jpeg(root / "Img" / "img_align_celeba" / n)
    (root / "Anno" / "identity_CelebA.txt").write_text("000001.jpg 2880\n000002.jpg\t\t2937\n\n000003.jpg   2880  \n")
    names = "  ".join(ATTRIBUTES)
    rows = "".join(_attr_row(n, a) for n in ("000001.jpg", "000002.jpg"))
    rows += "000003.jpg" + "\t".join(f"  {1 if v else -1}" for v in a) + "\n"
    (root / "Anno" / "list_attr_celeba.txt").write_text(f"3\n{names} \n{rows}")
    (root / "Eval" / "list_eval_partition.txt").write_text("000001.jpg 0\n000002.jpg 1\n000003.jpg    2\n")
    ds = load_celeba(tmp_path)  # the folder above CelebA/
    assert ds.filenames == ["000001.jpg", "000002.jpg", "000003.jpg"]
    assert ds.identities.tolist() == [2880, 2937, 2880] and ds.partition.tolist() == [0, 1, 2]
    assert ds.attribute("Male").all() and ds.attribute("Young").all() and not ds.attribute("Bald").any()
    assert ds.rows_by_identity[2880].tolist() == [0, 2] and not ds.synthetic
    flat = _write_layout(tmp_path / "flat", [("000001.jpg", 7, a)], partition=False)
    files = find_celeba(flat)
    assert files.partition is None and load_celeba(flat).partition is None


def _base(tmp_path: Path) -> Path:
    a = np.zeros(40, bool)
    return _write_layout(tmp_path / "c", [(f"{i:06d}.jpg", 1 + i % 2, a) for i in range(1, 5)])


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
    grey = _write_layout(tmp_path / "grey", [("000001.jpg", 1, np.zeros(40, bool))])
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


def test_the_cache_makes_the_second_pass_decode_nothing(cropped, cache, synth):
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


def test_numpy_haar_port_matches_opencv_when_opencv_has_the_cascade(synth):
    files = sorted((synth[0] / "img_align_celeba").iterdir())[:6]
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


# --------------------------------------------------------------------------- partitions


def _population(n_people=1800, per=6, seed=1) -> np.ndarray:
    counts = np.random.default_rng(seed).integers(2, 2 * per, size=n_people)
    return np.repeat(np.arange(1, n_people + 1) * 3, counts)  # ids 3, 6, 9, ... (not contiguous)


def test_split_sizes_are_70_10_20_per_identity():
    assert ip.split_sizes(20) == (14, 2, 4) and ip.split_sizes(10) == (7, 1, 2)
    assert ip.split_sizes(3) == (1, 1, 1) and ip.split_sizes(2) == (1, 0, 1) and ip.split_sizes(1) == (1, 0, 0)
    assert all(sum(ip.split_sizes(n)) == n and ip.split_sizes(n)[0] >= 1 for n in range(1, 60))


def test_lognormal_partition_has_the_shape_of_table_4_2():
    ids = _population()
    part = ip.lognormal_partition(ids, seed=0)
    counts = np.array([len(c.identities) for c in part.clients])
    assert len(part.clients) == 20 and counts.sum() == 1500 and counts.min() >= 1
    assert counts.max() >= 50 * counts.min()  # heavy quantity skew (Table 4.2: 171x in images)
    assert part.info["identities_per_client"] == counts.tolist()
    s = np.array(part.info["S"])
    raw = ip.largest_remainder(1500, s)
    assert np.abs(counts - raw).sum() <= 2 * (raw == 0).sum()  # only the empty clients were topped up
    people = np.concatenate([c.identities for c in part.clients])
    assert len(people) == len(set(people.tolist())) == 1500  # whole identities, each on one client
    for c in part.clients:  # every sample of a client's person is on that client, split 70/10/20
        for person in c.identities[:3].tolist():
            on = np.flatnonzero(ids == person)
            assert sorted(on.tolist()) == sorted(set(on) & set(c.samples.tolist()))
            got = tuple(int(np.isin(on, split).sum()) for split in (c.train, c.val, c.test))
            assert got == ip.split_sizes(len(on))
    again = ip.lognormal_partition(ids, seed=0)
    assert all(np.array_equal(a.train, b.train) for a, b in zip(part.clients, again.clients))
    other = ip.lognormal_partition(ids, seed=1)
    assert [len(c.identities) for c in other.clients] != counts.tolist()
    assert ip.largest_remainder(10, [1, 1, 1]).tolist() == [4, 3, 3]
    assert ip.largest_remainder(7, [0.5, 0.25, 0.25]).tolist() == [3, 2, 2]
    assert ip.largest_remainder(10, [0.55, 0.3, 0.15]).tolist() == [6, 3, 1]  # tie: lower index


def test_equal_partition_and_unseen_clients():
    ids = _population()
    part = ip.equal_partition(ids, seed=2)
    assert [len(c.identities) for c in part.clients] == [75] * 20
    assert [c.client for c in part.unseen_clients()] == list(ip.UNSEEN_CLIENTS) == [16, 17, 18, 19, 20]
    assert [c.client for c in part.training_clients()] == list(range(1, 16))
    train = part.federated_train_indices()
    assert set(train) == set(range(1, 16))
    used = np.concatenate([s for c in part.training_clients() for s in (c.train, c.val, c.test)])
    for c in part.unseen_clients():
        assert len(c.train) and not np.isin(c.samples, used).any()
        assert not np.isin(ids[c.samples], ids[used]).any()  # unseen persons never trained on
    # global labels: client 1 gets 0..74, client 2 75..149, ...
    c2 = part.client(2)
    assert sorted(set(part.global_labels(c2.train, ids).tolist())) == list(range(75, 150))
    assert sorted(set(c2.local_labels(c2.train, ids).tolist())) == list(range(75))
    # selection: the first 1500 eligible identities of the seeded order
    chosen = ip.select_identities(ids, 1500, 2)
    order = ip.selection_order(ids, 2)
    assert chosen.tolist() == [p for p in order.tolist() if (ids == p).sum() >= 3][:1500]
    with pytest.raises(ValueError, match="identities"):
        ip.equal_partition(ids[:50], seed=0)


def test_every_table_4_1_filter_takes_exactly_its_images(tmp_path):
    """One image per filter that matches it, and per filter key one image that differs in that key
    only; written as a real attribute file and read back."""
    specs = ip.load_attribute_clients()
    assert [s.client for s in specs] == list(range(1, 21)) and sum(s.size for s in specs) == 21153
    rows, expect = [], {}
    number = 1
    for spec in specs:
        base = np.zeros(40, bool)
        for key, value in spec.filter.items():
            base[ATTRIBUTES.index(key)] = value
        rows.append((f"{number:06d}.jpg", number, base))
        expect[spec.client] = number
        number += 1
        for key in spec.filter:
            flipped = base.copy()
            flipped[ATTRIBUTES.index(key)] = not flipped[ATTRIBUTES.index(key)]
            rows.append((f"{number:06d}.jpg", number, flipped))
            number += 1
    ds = load_celeba(_write_layout(tmp_path / "filters", rows))
    for spec in specs:
        own = [i for i, (_, person, _) in enumerate(rows) if expect[spec.client] <= person
               < expect[spec.client] + 1 + len(spec.filter)]
        single = ip.attribute_partition(ds.identities[own], ds.attributes[own], clients=[spec],
                                        min_images_per_identity=1)
        taken = [int(ds.identities[own][i]) for i in single.clients[0].samples]
        assert taken == [expect[spec.client]], spec
    # spot checks against the thesis table
    by = {s.client: s.filter for s in specs}
    assert by[2] == {"Male": True, "Eyeglasses": True, "Wearing_Hat": False, "Young": False, "Gray_Hair": True}
    assert by[5] == {"Eyeglasses": False, "Wearing_Hat": True}
    assert by[11]["Black_Hair"] is False and by[12]["Blond_Hair"] is False and by[13]["Brown_Hair"] is True
    assert by[17]["No_Beard"] is False and by[17]["Mustache"] is False and by[18]["Bushy_Eyebrows"] is False
    assert by[15] == {"Male": False, "Eyeglasses": False, "Wearing_Hat": False, "Young": True, "Oval_Face": False,
                      "Wearing_Lipstick": True, "Rosy_Cheeks": True}


def test_attribute_deduplication_serves_the_scarcest_filter_first():
    broad = ip.AttributeClient(1, 100, {"Male": True})
    narrow = ip.AttributeClient(2, 100, {"Male": True, "Bald": True})
    other = ip.AttributeClient(16, 3, {"Male": False, "Smiling": True})
    attrs = np.zeros((40, 40), bool)
    attrs[:30, ATTRIBUTES.index("Male")] = True
    attrs[:10, ATTRIBUTES.index("Bald")] = True
    attrs[32:38, ATTRIBUTES.index("Smiling")] = True
    ids = np.repeat(np.arange(20), 2)  # persons of two images each
    part = ip.attribute_partition(ids, attrs, clients=[broad, narrow, other], seed=0)
    assert part.info["service_order"] == [16, 2, 1]
    c1, c2, c16 = part.client(1), part.client(2), part.client(16)
    assert c2.samples.tolist() == list(range(10))  # every bald man goes to the narrow filter
    assert c1.samples.tolist() == list(range(10, 30))  # the broad one gets what is left
    assert len(c16.samples) == 4 and c16.target == 3 and c16.unseen  # whole persons: overshoots by < 1 person
    all_samples = np.concatenate([c.samples for c in part.clients])
    assert len(all_samples) == len(set(all_samples.tolist()))  # no image on two clients
    assert part.client(2).candidates == 10 and part.client(1).candidates == 30


def test_a_filter_with_an_unknown_attribute_is_an_error_naming_the_key(tmp_path):
    bad = tmp_path / "clients.toml"
    bad.write_text('[[client]]\nclient = 1\nsize = 10\nfilter = { Male = true, Glasses = true }\n')
    with pytest.raises(DataError, match=r"clients\.toml.*client 1.*'Glasses' is not a CelebA attribute"):
        ip.load_attribute_clients(bad)
    bad.write_text('[[client]]\nclient = 1\nsize = 10\nfilter = { Male = "yes" }\n')
    with pytest.raises(DataError, match=r"filter\.Male must be true or false"):
        ip.load_attribute_clients(bad)


# --------------------------------------------------------------------------- pipeline and CLI


def test_federated_celeba_from_root_to_client_arrays(synth, cropped, cache):
    data = federated_celeba(synth[0], "equal", n_identities=8, n_clients=4, min_faces=2, cache_dir=cache)
    assert data.cache_stats["decoded"] == 0  # all from the cache made by the `cropped` fixture
    assert [c.client for c in data.clients] == [1, 2, 3, 4] and data.n_global_classes == 8
    for c in data.clients:
        assert c.n_classes == 2 and not c.unseen
        x, y = c.train.images, c.train.labels
        assert x.shape[1:] == (128, 128, 3) and x.dtype == np.uint8 and len(x) == len(y)
        assert set(y.tolist()) == {0, 1} and set(c.test.labels.tolist()) <= {0, 1} and len(c.test)
        assert set(c.train.identities.tolist()) == set(c.test.identities.tolist())
    attr = federated_celeba(synth[0], "attribute", attribute_scale=0.01, cache_dir=cache)
    assert len(attr.clients) == 20 and [c.client for c in attr.unseen_clients()] == [16, 17, 18, 19, 20]
    with pytest.raises(ValueError, match="partition"):
        federated_celeba(synth[0], "dirichlet")


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


def test_summarize_counts(synth):
    ds = load_celeba(synth[0])
    s = summarize(ds)
    assert s["identities"] == 8 and s["images"] == len(ds) and s["detection"] is None
    assert s["partition"]["train"] + s["partition"]["valid"] + s["partition"]["test"] == len(ds)
    male = s["attribute_prevalence_percent"]["Male"]
    assert male == round(100 * ds.attribute("Male").mean(), 2)

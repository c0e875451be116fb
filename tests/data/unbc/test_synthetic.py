"""The synthetic UNBC-McMaster generator: exact layout, PSPI consistency, determinism, the
thesis's cohort shape, a subtle-but-present pain signal, and safe writing."""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from pathlib import Path

import cv2
import numpy as np
import pytest

from fedcare.data.unbc import synthetic as pain
from fedcare.data.unbc.synthetic import (
    DEFAULT_SUBJECTS,
    GROUP1,
    GROUP2,
    TABLE_3_1,
    TABLE_6_3_POSITIVES,
    TABLE_6_3_SESSIONS,
    generate_pain_cohort,
)

SUBJECT_RE = re.compile(r"^(\d{3})-([a-z]{2})(\d{3})$")
SEQ_RE = re.compile(r"^([a-z]{2})(\d{3})t([12])a([aefi])(aff|unaff)$")
NUMBER_RE = re.compile(r"^ *-?\d\.\d{7}e[+-]\d{2}\n$")  # f"{v:15.7e}\n"
FACS_LINE_RE = re.compile(r"^ *\d\.\d{7}e\+\d{2} +\d\.\d{7}e\+\d{2}$")
REAL_FOLDERS = set(
    "042-ll042 043-jh043 047-jl047 048-aa048 049-bm049 052-dr052 059-fn059 064-ak064 066-mg066 080-bn080 "
    "092-ch092 095-tv095 096-bg096 097-gf097 101-mg101 103-jk103 106-nm106 107-hs107 108-th108 109-ib109 "
    "115-jy115 120-kz120 121-vw121 123-jh123 124-dn124".split()
)
SMALL = dict(subjects=[42, 43, 80], frame_scale=0.02, image_size=32)


def read_number(path: Path) -> float:
    return float(path.read_text().split()[0])


def read_facs(path: Path) -> dict[int, float]:
    out = {}
    for line in path.read_text().splitlines():
        au, value = line.split()[:2]
        out[int(float(au))] = float(value)
    return out


def pspi_formula(facs: dict[int, float]) -> float:
    g = facs.get
    return g(4, 0) + max(g(6, 0), g(7, 0)) + max(g(9, 0), g(10, 0)) + (1 if 43 in facs else 0)


def load_tree(root: Path) -> dict:
    """subject number -> list (session order) of (sequence name, [frame dicts]) read from disk."""
    cohort = {}
    for subj in sorted((root / "Images").iterdir()):
        seqs = []
        for seq in sorted(p.name for p in subj.iterdir()):
            frames = []
            for png in sorted((subj / seq).iterdir()):
                rel = Path(subj.name) / seq
                frames.append({
                    "png": png,
                    "pspi": read_number(root / "Frame_Labels/PSPI" / rel / f"{png.stem}_facs.txt"),
                    "facs": read_facs(root / "Frame_Labels/FACS" / rel / f"{png.stem}_facs.txt"),
                    "aam": root / "AAM_landmarks" / rel / f"{png.stem}_aam.txt",
                })
            seqs.append((seq, frames))
        cohort[int(subj.name[:3])] = seqs
    return cohort


def tree_hashes(root: Path) -> dict[str, str]:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("small") / "cohort"
    summary = generate_pain_cohort(root, **SMALL)
    return root, summary


@pytest.fixture(scope="module")
def default_cohort(tmp_path_factory):
    """The default cohort shape (24 subjects, frame_scale 0.05) with small images."""
    root = tmp_path_factory.mktemp("default") / "cohort"
    summary = generate_pain_cohort(root, image_size=32)
    return root, summary, load_tree(root)


def test_layout_is_the_real_archive_layout(small):
    root, summary = small
    assert sorted(p.name for p in root.iterdir()) == [
        "AAM_landmarks", "Frame_Labels", "Images", "Sequence_Labels", "fedcare-synthetic.json"]
    assert sorted(p.name for p in (root / "Frame_Labels").iterdir()) == ["FACS", "PSPI"]
    assert sorted(p.name for p in (root / "Sequence_Labels").iterdir()) == ["AFF", "OPR", "SEN", "VAS"]
    assert [p.name for p in sorted((root / "Images").iterdir())] == ["042-ll042", "043-jh043", "080-bn080"]
    n_frames = n_seqs = 0
    for subj in sorted((root / "Images").iterdir()):
        m = SUBJECT_RE.match(subj.name)
        assert m and subj.name in REAL_FOLDERS and m.group(1) == m.group(3)
        for seq in sorted(subj.iterdir()):
            n_seqs += 1
            s = SEQ_RE.match(seq.name)
            assert s, seq.name
            assert s.group(1) == m.group(2) and s.group(2) == m.group(3)  # the subject's initials and number
            pngs = sorted(p.name for p in seq.iterdir())
            assert pngs == [f"{seq.name}{i:03d}.png" for i in range(1, len(pngs) + 1)]  # 1-based, 3 digits
            assert len(pngs) >= 8  # min_frames_per_sequence
            for name in pngs:
                n_frames += 1
                stem = name[:-4]
                img = cv2.imread(str(seq / name), cv2.IMREAD_UNCHANGED)
                assert img.shape == (32, 32, 3) and img.dtype == np.uint8
                pspi_text = (root / "Frame_Labels/PSPI" / subj.name / seq.name / f"{stem}_facs.txt").read_text()
                assert NUMBER_RE.match(pspi_text) and ("e+00" in pspi_text or "e+01" in pspi_text)
                value = float(pspi_text.split()[0])
                assert pspi_text == f"{value:15.7e}\n" and value == int(value)
                facs_text = (root / "Frame_Labels/FACS" / subj.name / seq.name / f"{stem}_facs.txt").read_text()
                assert all(FACS_LINE_RE.match(line) for line in facs_text.splitlines())
                aam = np.loadtxt(root / "AAM_landmarks" / subj.name / seq.name / f"{stem}_aam.txt")
                assert aam.shape == (66, 2)
                assert (aam > -8).all() and (aam < 40).all()  # pixel coordinates of a 32x32 image
            for measure, top in (("VAS", 10), ("OPR", 5), ("SEN", 15), ("AFF", 15)):
                text = (root / "Sequence_Labels" / measure / subj.name / f"{seq.name}.txt").read_text()
                assert NUMBER_RE.match(text) and "e+0" in text
                v = float(text)
                assert v == int(v) and 0 <= v <= top
        # label trees hold exactly the image tree's sequences
        for part in ("Frame_Labels/PSPI", "Frame_Labels/FACS", "AAM_landmarks"):
            assert sorted(p.name for p in (root / part / subj.name).iterdir()) == sorted(p.name for p in subj.iterdir())
    assert n_frames == summary["frames"] and n_seqs == summary["sequences"] and summary["subjects"] == 3
    assert len(list((root / "Frame_Labels/PSPI").rglob("*_facs.txt"))) == n_frames
    assert len(list((root / "AAM_landmarks").rglob("*_aam.txt"))) == n_frames
    marker = json.loads((root / "fedcare-synthetic.json").read_text())
    assert marker["generator"] == "fedcare.data.synthetic.pain" and marker["seed"] == 0
    assert marker["options"]["subjects"] == [42, 43, 80] and marker["options"]["image_size"] == 32
    assert "SYNTHETIC" in marker["note"]
    assert [p.name for p in root.parent.iterdir()] == ["cohort"]  # no temporary siblings left


def test_pspi_file_is_the_formula_of_the_facs_file(small):
    root, summary = small
    cohort = load_tree(root)
    hist: dict[str, int] = defaultdict(int)
    empty = 0
    for seqs in cohort.values():
        for _, frames in seqs:
            for f in frames:
                assert f["pspi"] == pspi_formula(f["facs"]), f["png"]
                assert set(f["facs"]) <= {4, 6, 7, 9, 10, 12, 25, 26, 43}
                assert all(1 <= v <= 5 for v in f["facs"].values()) and f["facs"].get(43, 1) == 1
                empty += not f["facs"]
                hist[str(int(f["pspi"]))] += 1
    assert empty > 0  # frames without any AU have an empty FACS file
    assert summary["pspi_histogram"] == dict(sorted(hist.items(), key=lambda kv: int(kv[0])))
    assert summary["pain_frames"] == sum(n for k, n in hist.items() if int(k) >= 1) > 0


def test_landmarks_are_the_drawn_geometry(small):
    root, _ = small
    cohort = load_tree(root)
    frames = [f for seqs in cohort.values() for _, fr in seqs for f in fr]
    open_eyes, closed_eyes = [], []
    for f in frames:
        lm = np.loadtxt(f["aam"])
        # anatomy: brows above eyes above nose tip above mouth above chin; left/right in order
        assert lm[17:27, 1].mean() < lm[36:48, 1].mean() < lm[30, 1] < lm[48:60, 1].mean() < lm[8, 1]
        assert lm[36, 0] < lm[39, 0] < lm[42, 0] < lm[45, 0] and lm[48, 0] < lm[54, 0]
        opening = np.linalg.norm(lm[37] - lm[41]) / np.linalg.norm(lm[42] - lm[39])
        (closed_eyes if 43 in f["facs"] else open_eyes).append(opening)
    if closed_eyes:
        assert max(closed_eyes) < min(open_eyes)
    img = cv2.imread(str(frames[0]["png"]))
    lm = np.loadtxt(frames[0]["aam"])
    # the nose tip lies inside the jaw outline, in image coordinates
    inside = cv2.pointPolygonTest(lm[0:17].astype(np.float32), (float(lm[30, 0]), float(lm[30, 1])), False)
    assert inside >= 0 and img.shape[0] == 32


def test_same_seed_same_bytes_other_seed_differs(tmp_path, small):
    a = generate_pain_cohort(tmp_path / "a", seed=0, subjects=[43], frame_scale=0.02, image_size=32)
    b = generate_pain_cohort(tmp_path / "b", seed=0, subjects=[43], frame_scale=0.02, image_size=32)
    generate_pain_cohort(tmp_path / "c", seed=1, subjects=[43], frame_scale=0.02, image_size=32)
    ha, hb, hc = tree_hashes(tmp_path / "a"), tree_hashes(tmp_path / "b"), tree_hashes(tmp_path / "c")
    assert ha == hb and a == {**b, "root": a["root"]}
    assert ha != hc
    assert {k: v for k, v in ha.items() if k.endswith(".png")} != {k: v for k, v in hc.items() if k.endswith(".png")}
    # a subject's files do not depend on which other subjects are generated
    root, _ = small
    hs = tree_hashes(root)
    for rel, digest in ha.items():
        if rel != "fedcare-synthetic.json":
            assert hs[rel] == digest, rel


def test_default_cohort_follows_the_thesis_tables(default_cohort):
    root, summary, cohort = default_cohort
    assert DEFAULT_SUBJECTS == tuple(sorted(GROUP1 + GROUP2)) and 101 not in DEFAULT_SUBJECTS
    assert sorted(cohort) == list(DEFAULT_SUBJECTS) and summary["subjects"] == 24
    pct = {}
    for subject, seqs in cohort.items():
        pspi = np.array([f["pspi"] for _, fr in seqs for f in fr])
        pct[subject] = 100 * (pspi >= 1).mean()
        no_pain, pain_n = TABLE_3_1[subject]
        assert abs(pct[subject] - 100 * pain_n / (no_pain + pain_n)) < 5, subject
        # frames: the real counts x 0.05 (more only where a sequence needs its minimum of 8)
        assert len(pspi) >= 0.05 * (no_pain + pain_n) - 2
        assert all(len(fr) >= 8 for _, fr in seqs)
        if subject in GROUP1:
            assert 2 <= len(seqs) <= 9
    assert pct[80] > 8 * pct[52] and pct[95] > 40 and pct[124] > 40 and pct[47] < 8
    # ~90% of frames are PSPI 0 or 1, and high levels exist
    hist = {int(k): v for k, v in summary["pspi_histogram"].items()}
    assert 0.85 < (hist[0] + hist.get(1, 0)) / summary["frames"] < 0.95
    assert sum(v for k, v in hist.items() if k >= 5) > 0
    assert 0.12 < summary["pain_frames"] / summary["frames"] < 0.25


def test_group2_sessions_follow_table_6_3(default_cohort):
    _, _, cohort = default_cohort
    for subject in GROUP2:
        seqs = cohort[subject]
        assert len(seqs) == TABLE_6_3_SESSIONS[subject], subject
        pain_sessions = [k for k, (_, fr) in enumerate(seqs) if any(f["pspi"] >= 1 for f in fr)]
        assert len(pain_sessions) == len(TABLE_6_3_POSITIVES[subject]), subject
        if len(seqs) > 7:
            assert not any(f["pspi"] >= 1 for f in seqs[7][1]), f"{subject}: pain in session 7"
    assert [k for k, (_, fr) in enumerate(cohort[59]) if any(f["pspi"] >= 1 for f in fr)] == [1]
    assert all(any(f["pspi"] >= 1 for f in fr) for _, fr in cohort[80])  # 80: pain in sessions 0-6
    # thesis: all of 48's positives are level 1; all of 92's are above 1
    assert {f["pspi"] for _, fr in cohort[48] for f in fr} == {0.0, 1.0}
    assert min(f["pspi"] for _, fr in cohort[92] for f in fr if f["pspi"] >= 1) >= 2
    # sessions 8 and 9 hold 3 and 1 subjects
    assert sorted(s for s in GROUP2 if len(cohort[s]) > 8) == [43, 52, 96]
    assert [s for s in GROUP2 if len(cohort[s]) > 9] == [52]


def test_sequence_names_sort_in_session_order(default_cohort):
    _, _, cohort = default_cohort
    for subject, seqs in cohort.items():
        names = [name for name, _ in seqs]
        assert names == sorted(names) and len(set(names)) == len(names)
    assert [name for name, _ in cohort[42]] == [  # the 8 real sequences of subject 042
        "ll042t1aaaff", "ll042t1aaunaff", "ll042t1aeunaff", "ll042t1afaff", "ll042t1afunaff",
        "ll042t1aiaff", "ll042t1aiunaff", "ll042t2afaff"]
    # session order as the generator planned it: the planned pain sessions are where the pain is
    for subject in GROUP2:
        found = tuple(k for k, (_, fr) in enumerate(cohort[subject]) if any(f["pspi"] >= 1 for f in fr))
        assert found == pain.GROUP2_PAIN_SESSIONS[subject], subject


def test_pain_comes_in_smooth_episodes_and_distractors_are_independent(default_cohort):
    _, _, cohort = default_cohort
    jumps, runs, pairs, seq_with_pain = [], [], [], 0
    au12 = {"pain": 0, "none": 0}
    au25 = {"pain": 0, "none": 0}
    for seqs in cohort.values():
        for _, fr in seqs:
            pspi = np.array([f["pspi"] for f in fr])
            if (pspi >= 1).any():
                seq_with_pain += 1
                jumps.extend(np.abs(np.diff(pspi)).tolist())
                pairs.extend(zip(pspi[:-1], pspi[1:]))
                assert pspi[0] == 0  # sequences start neutral; pain rises and falls within them
            for f in fr:
                key = "pain" if f["pspi"] >= 1 else "none"
                au12[key] += 12 in f["facs"]
                au25[key] += 25 in f["facs"]
            on = (pspi >= 1).astype(int)
            runs.extend(np.diff(np.flatnonzero(np.diff(np.r_[0, on, 0]))).tolist()[::2])
    assert seq_with_pain > 50
    assert np.mean(jumps) < 0.7 and np.corrcoef(np.array(pairs).T)[0, 1] > 0.5  # neighbouring frames are alike
    assert np.mean(runs) > 2.5  # pain lasts several frames
    assert min(au12.values()) > 0 and min(au25.values()) > 0  # smiles / open mouths with and without pain


def _eye_region_stats(cohort):
    """Per PSPI level: eye/brow-region mean absolute difference to the sequence's neutral
    frames after aligning on pain-free landmarks, and eye opening relative to neutral."""
    stable = list(range(0, 5)) + list(range(12, 17)) + [27, 28, 39, 42]
    mad, opening = defaultdict(list), defaultdict(list)

    def eye_open(lm):
        return (np.linalg.norm(lm[37] - lm[41]) + np.linalg.norm(lm[44] - lm[46])) / np.linalg.norm(lm[42] - lm[39])

    for seqs in cohort.values():
        for _, fr in seqs:
            pspi = np.array([f["pspi"] for f in fr])
            zero = np.flatnonzero(pspi == 0)
            if len(zero) < 3 or not (pspi >= 1).any():
                continue
            lms = np.stack([np.loadtxt(f["aam"]) for f in fr])
            grey = [cv2.imread(str(f["png"]), cv2.IMREAD_GRAYSCALE).astype(np.float32) for f in fr]
            size = grey[0].shape[0]
            ref_lm = lms[zero].mean(0)
            reg = np.stack([
                cv2.warpAffine(g, cv2.estimateAffinePartial2D(lm[stable], ref_lm[stable])[0], (size, size),
                               borderMode=cv2.BORDER_REPLICATE)
                for g, lm in zip(grey, lms)])
            x0, y0 = np.floor(ref_lm[17:48].min(0)).astype(int) - 1  # brows and eyes
            x1, y1 = np.ceil(ref_lm[17:48].max(0)).astype(int) + 2
            box = reg[:, y0:y1, x0:x1]
            neutral_open = np.median([eye_open(lms[j]) for j in zero])
            for i, level in enumerate(pspi):
                ref = np.median(box[zero[zero != i]], axis=0)  # leave-one-out neutral face
                key = 0 if level == 0 else 1 if level == 1 else 2 if level == 2 else 3
                mad[key].append(float(np.abs(box[i] - ref).mean()))
                opening[key].append(eye_open(lms[i]) / neutral_open)
    return mad, opening


def _auc(pos, neg):
    pos, neg = np.asarray(pos)[:, None], np.asarray(neg)[None, :]
    return float((pos > neg).mean() + 0.5 * (pos == neg).mean())


def test_pain_signal_is_there_but_level_1_is_subtle(default_cohort):
    _, _, cohort = default_cohort
    mad, opening = _eye_region_stats(cohort)
    base = np.mean(mad[0])
    d1, d3 = np.mean(mad[1]) - base, np.mean(mad[3]) - base  # PSPI 1, PSPI >= 3
    assert len(mad[3]) > 50 and len(mad[1]) > 100
    assert d3 > 1.0 and d3 > 2 * d1  # PSPI >= 3 is clearly further from neutral than PSPI 1
    assert _auc(mad[1], mad[0]) < 0.72  # PSPI 1 hides in the frame-to-frame variation
    assert _auc(mad[3], mad[0]) > _auc(mad[1], mad[0]) + 0.08
    # the drawn geometry: eyes narrow a little at PSPI 1 and a lot at PSPI >= 3
    assert 0.88 < np.mean(opening[1]) < 1.0 and np.mean(opening[3]) < 0.8
    assert 0.97 < np.mean(opening[0]) < 1.03


def test_subjects_and_sessions_look_different(default_cohort):
    _, _, cohort = default_cohort

    def neutral_mean(subject, session):
        fr = cohort[subject][session][1]
        return np.mean([cv2.imread(str(f["png"])).astype(np.float32) for f in fr if f["pspi"] == 0], axis=0)

    within = np.abs(cv2.imread(str(cohort[43][0][1][0]["png"])).astype(np.float32)
                    - cv2.imread(str(cohort[43][0][1][1]["png"])).astype(np.float32)).mean()
    across_sessions = np.abs(neutral_mean(43, 0) - neutral_mean(43, 1)).mean()
    across_subjects = np.abs(neutral_mean(43, 0) - neutral_mean(80, 0)).mean()
    assert across_sessions > within and across_subjects > within


def _corner_colour(seq_dir: Path, k: int = 3) -> np.ndarray:
    """Mean BGR of the top-left and top-right k x k pixels over a sequence's frames: backdrop
    only (far from the face, hair and shoulders), seen through the recording's light, colour
    cast, gain and contrast; the per-frame sensor noise and gain flicker average out."""
    frames = [cv2.imread(str(p)).astype(np.float32) for p in sorted(seq_dir.iterdir())]
    return np.mean([np.concatenate([f[:k, :k].reshape(-1, 3), f[:k, -k:].reshape(-1, 3)]) for f in frames],
                   axis=(0, 1))


def test_recording_conditions_belong_to_the_occasion(small):
    """The sequences of one test occasion (t1/t2 in the name) are one sitting: same backdrop,
    light, camera and clothes; another occasion looks different. A generator that draws every
    sequence's conditions on its own gives corners tens of grey levels apart within an occasion."""
    root, _ = small
    for subj in sorted((root / "Images").iterdir()):
        by_occasion = defaultdict(list)
        for seq in sorted(subj.iterdir()):
            by_occasion[SEQ_RE.match(seq.name).group(3)].append(_corner_colour(seq))
        assert sorted(by_occasion) == ["1", "2"], subj.name  # 42, 43 and 80 have both occasions
        for occasion, colours in by_occasion.items():
            assert len(colours) >= 2 or subj.name == "042-ll042"
            spread = np.ptp(np.array(colours), axis=0).max()
            assert spread < 8, (subj.name, occasion, spread)  # same sitting: same look
        closest = min(np.abs(a - b).max() for a in by_occasion["1"] for b in by_occasion["2"])
        assert closest > 8, (subj.name, closest)  # another sitting: another light and camera setting


def test_conditions_are_drawn_per_lab_occasion_and_sequence():
    """Which condition belongs to what: the backdrop to the lab (every subject), light, camera
    and clothes to (subject, occasion), the head pose to the sequence."""
    def conditions(subject, name, session, seed=0):
        rng = np.random.default_rng([seed, subject, 100 + session])
        return pain.recording_conditions(rng, name, subject, seed, 32)

    def same(a, b, keys):
        return all(np.array_equal(a[key], b[key]) for key in keys)

    a = conditions(43, "jh043t1aeaff", 0)
    b = conditions(43, "jh043t1afaff", 1)  # same sitting, another test
    c = conditions(43, "jh043t2aaaff", 5)  # the other occasion
    d = conditions(80, "bn080t1aaaff", 0)  # another subject
    assert same(a, b, pain.OCCASION_CONDITIONS + pain.LAB_CONDITIONS)
    assert not any(np.array_equal(a[key], b[key]) for key in pain.SEQUENCE_CONDITIONS)
    assert not any(np.array_equal(a[key], c[key]) for key in pain.OCCASION_CONDITIONS)
    assert same(a, c, pain.LAB_CONDITIONS) and same(a, d, pain.LAB_CONDITIONS)
    assert not any(np.array_equal(a[key], d[key]) for key in pain.OCCASION_CONDITIONS)
    assert not same(a, conditions(43, "jh043t1aeaff", 0, seed=1), pain.LAB_CONDITIONS)
    keys = pain.LAB_CONDITIONS + pain.OCCASION_CONDITIONS + pain.SEQUENCE_CONDITIONS
    assert sorted(keys) == sorted(a) and len(set(keys)) == len(keys)  # every condition is assigned once
    assert [pain.occasion_of(n) for n in ("ll042t1aaaff", "ll042t2afunaff")] == [1, 2]
    with pytest.raises(ValueError, match="sequence name"):
        pain.occasion_of("ll042t3aaaff")


def test_quirks_write_black_frames(tmp_path):
    summary = generate_pain_cohort(tmp_path / "q", subjects=[95, 101], frame_scale=0.01, image_size=32, quirks=True)
    root = tmp_path / "q"
    seqs = sorted(p.name for p in (root / "Images/095-tv095").iterdir())
    assert seqs[-1] == "tv095t2aeunaff"  # the real archive's black-frame sequence
    pngs = sorted((root / "Images/095-tv095" / seqs[-1]).iterdir())
    assert [p.name for p in pngs[:7]] == [f"tv095t2aeunaff{i:03d}.png" for i in range(1, 8)]
    for p in pngs[:7]:
        img = cv2.imread(str(p))
        assert img.shape == (32, 32, 3) and img.max() == 0
        assert read_number(root / "Frame_Labels/PSPI/095-tv095" / seqs[-1] / f"{p.stem}_facs.txt") == 0
    assert cv2.imread(str(pngs[7])).mean() > 20
    assert all(cv2.imread(str(p)).max() > 0 for p in (root / "Images/095-tv095" / seqs[0]).iterdir())
    # 101 (allowed, not in the default cohort) has no pain
    assert all(read_number(p) == 0 for p in (root / "Frame_Labels/PSPI/101-mg101").rglob("*_facs.txt"))
    assert summary["subjects"] == 2
    # without 95 the first subject's last sequence gets them; without quirks nothing is black
    generate_pain_cohort(tmp_path / "r", subjects=[43], frame_scale=0.01, image_size=32, quirks=True)
    last = sorted((tmp_path / "r/Images/043-jh043").iterdir())[-1]
    assert [cv2.imread(str(p)).max() for p in sorted(last.iterdir())[:7]] == [0] * 7
    generate_pain_cohort(tmp_path / "s", subjects=[43], frame_scale=0.01, image_size=32)
    assert all(cv2.imread(str(p)).max() > 0 for p in (tmp_path / "s/Images").rglob("*.png"))


def test_refuses_to_overwrite_and_overwrites_only_a_cohort_on_request(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    for overwrite in (False, True):  # --overwrite replaces a synthetic cohort, never a user's folder
        with pytest.raises(FileExistsError, match=re.escape(str(out))):
            generate_pain_cohort(out, subjects=[43], frame_scale=0.01, image_size=16, overwrite=overwrite)
        assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "precious"
        assert [p.name for p in tmp_path.iterdir()] == ["out"]
    cohort = tmp_path / "cohort"
    generate_pain_cohort(cohort, subjects=[43], frame_scale=0.01, image_size=16)
    (cohort / "stray.txt").write_text("left in a generated cohort")
    summary = generate_pain_cohort(cohort, subjects=[43], frame_scale=0.01, image_size=16, overwrite=True)
    assert not (cohort / "stray.txt").exists() and (cohort / "fedcare-synthetic.json").is_file()
    assert summary["root"] == str(cohort) and sorted(p.name for p in tmp_path.iterdir()) == ["cohort", "out"]
    empty = tmp_path / "empty"
    empty.mkdir()
    generate_pain_cohort(empty, subjects=[43], frame_scale=0.01, image_size=16)  # an empty folder is fine
    assert (empty / "Images/043-jh043").is_dir()


def test_a_failure_leaves_nothing_half_written(tmp_path, monkeypatch):
    real = pain._write_png
    calls = {"n": 0}

    def flaky(path, image):
        calls["n"] += 1
        if calls["n"] >= 40:
            raise OSError("disk full (simulated)")
        real(path, image)

    monkeypatch.setattr(pain, "_write_png", flaky)
    out = tmp_path / "deep" / "out"
    with pytest.raises(OSError, match="simulated"):
        generate_pain_cohort(out, subjects=[42, 43], frame_scale=0.02, image_size=16)
    assert calls["n"] >= 40
    assert not out.exists() and list((tmp_path / "deep").iterdir()) == []

    def stop(done, total):
        if done > 0:
            raise KeyboardInterrupt

    monkeypatch.setattr(pain, "_write_png", real)
    with pytest.raises(KeyboardInterrupt):
        generate_pain_cohort(out, subjects=[42, 43], frame_scale=0.02, image_size=16, progress=stop)
    assert not out.exists() and list((tmp_path / "deep").iterdir()) == []


def test_progress_reports_every_frame(tmp_path):
    seen = []
    summary = generate_pain_cohort(tmp_path / "p", subjects=[43, 59], frame_scale=0.02, image_size=16,
                                   progress=lambda d, t: seen.append((d, t)))
    assert seen[0] == (0, summary["frames"]) and seen[-1] == (summary["frames"], summary["frames"])
    assert all(b[0] >= a[0] for a, b in zip(seen, seen[1:])) and {t for _, t in seen} == {summary["frames"]}


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="999"):
        generate_pain_cohort(tmp_path / "x", subjects=[42, 999])
    with pytest.raises(ValueError, match="empty"):
        generate_pain_cohort(tmp_path / "x", subjects=[])
    for frame_scale in (0, float("nan"), 1e9):  # 1e9 was a 23 TiB allocation
        with pytest.raises(ValueError, match="frame_scale must be a number above 0 and at most 10"):
            generate_pain_cohort(tmp_path / "x", frame_scale=frame_scale)
    for image_size in (8, 10**6):
        with pytest.raises(ValueError, match="image_size must be an integer from 16 to 1024"):
            generate_pain_cohort(tmp_path / "x", image_size=image_size)
    with pytest.raises(ValueError, match="min_frames_per_sequence"):
        generate_pain_cohort(tmp_path / "x", min_frames_per_sequence=0)
    assert list(tmp_path.iterdir()) == []


def test_synth_removes_only_its_own_dead_siblings_never_a_users_folder(tmp_path):
    """`data synth X OUT` deleted any `.OUT.*.old` / `.OUT.*.tmp` beside OUT (a user's
    `.mycohort.old/IMPORTANT.txt` was gone, exit 0): only folders with fedcare's owner file,
    made by a process that is gone, are removed."""
    import os
    import socket
    import subprocess
    import sys
    import time

    from typer.testing import CliRunner

    from fedcare.cli import app
    from fedcare.data.synthetic.output import MARKER, OWNER

    users = tmp_path / ".mycohort.old"
    users.mkdir()
    (users / "IMPORTANT.txt").write_text("keep me")
    os.utime(users, (time.time() - 3600, time.time() - 3600))  # an old folder, not one being made now
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    also_users = tmp_path / ".mycohort.backup.tmp"  # an owner-like file that is not fedcare's
    also_users.mkdir()
    (also_users / OWNER).write_text(json.dumps({"pid": dead, "host": socket.gethostname()}))
    ours = tmp_path / ".mycohort.abcd.tmp"
    ours.mkdir()
    (ours / OWNER).write_text(json.dumps({"made_by": MARKER, "pid": dead, "host": socket.gethostname()}))
    result = CliRunner().invoke(app, ["data", "synth", "pain", str(tmp_path / "mycohort"), "--subjects", "42",
                                      "--frame-scale", "0.01", "--image-size", "16"])
    assert result.exit_code == 0, result.output
    assert (users / "IMPORTANT.txt").read_text() == "keep me" and also_users.is_dir()
    assert not ours.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".mycohort.backup.tmp", ".mycohort.old", "mycohort"]

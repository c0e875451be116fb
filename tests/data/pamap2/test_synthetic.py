"""The synthetic PAMAP2 generator: the real layout, the same bytes for a seed, and activities a
model can learn across subjects."""

import json

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from fedcare.data.pamap2.reader import PAPER_ACTIVITIES, load_pamap2, load_pamap2_windows
from fedcare.data.pamap2.synthetic import generate_pamap2
from fedcare.data.common import SYNTHETIC_MARKER

from support import tree_hash


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("gen") / "pamap2"
    info = generate_pamap2(out, seed=3, subjects=5, seconds_per_activity=14)
    return out, info


def test_generator_writes_the_real_layout(generated):
    out, info = generated
    files = sorted(p.name for p in (out / "PAMAP2_Dataset" / "Protocol").iterdir())
    assert files == [f"subject{s}.dat" for s in range(101, 106)] and info["subjects"] == list(range(101, 106))
    marker = json.loads((out / SYNTHETIC_MARKER).read_text())
    assert marker["generator"] == "fedcare.data.synthetic.pamap2" and "SYNTHETIC" in marker["note"]
    lines = (out / "PAMAP2_Dataset" / "Protocol" / "subject101.dat").read_text().splitlines()
    rows = [line.split(" ") for line in lines]
    assert {len(r) for r in rows} == {54}
    assert info["rows"] == sum(len((out / "PAMAP2_Dataset" / "Protocol" / f).read_text().splitlines()) for f in files)
    ts = np.array([float(r[0]) for r in rows])
    assert all(len(r[0].split(".")[1]) == 2 for r in rows[:50])
    assert np.allclose(np.diff(ts), 0.01)
    activities = {r[1] for r in rows}
    assert activities == {"0"} | {str(a) for a in PAPER_ACTIVITIES}  # integer ids, transients included
    hr = [r[2] for r in rows]
    nan_share = hr.count("NaN") / len(hr)
    assert 0.85 < nan_share < 0.95  # ~9 Hz readings at 100 Hz
    assert all(v.isdigit() for v in hr if v != "NaN")
    assert all(r[16:20] == ["1", "0", "0", "0"] for r in rows if r[4] != "NaN")
    assert any(r[4] == "NaN" for r in rows)  # wireless drop-outs in IMU columns
    assert "nan" not in "".join(lines[:2000])  # the literal is NaN


def test_generator_is_deterministic_and_refuses_non_empty_out(generated, tmp_path):
    out, _ = generated
    again = tmp_path / "again"
    generate_pamap2(again, seed=3, subjects=5, seconds_per_activity=14)
    assert tree_hash(again) == tree_hash(out)
    with pytest.raises(FileExistsError, match=str(again)):
        generate_pamap2(again, seed=4, subjects=2, seconds_per_activity=3)
    calls = []
    info = generate_pamap2(again, seed=4, subjects=[104, 107], seconds_per_activity=3, overwrite=True,
                           progress=lambda done, total: calls.append((done, total)))
    assert calls == [(1, 2), (2, 2)] and info["subjects"] == [104, 107]
    assert sorted(p.name for p in (again / "PAMAP2_Dataset" / "Protocol").iterdir()) == ["subject104.dat", "subject107.dat"]
    assert tree_hash(again) != tree_hash(out)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary sibling left


def test_generated_data_loads_and_activities_are_learnable_across_subjects(generated):
    out, _ = generated
    w = load_pamap2_windows(out)
    assert w.synthetic is True and load_pamap2(out / "PAMAP2_Dataset", subjects=[101]).synthetic is True
    assert w.x.shape[1:] == (27, 200) and not np.isnan(w.x).any()
    assert sorted(set(w.y.tolist())) == list(range(10))
    assert min(w.class_counts().values()) >= 5 * 8  # ~14 s per activity and subject -> >= 8 windows
    feats = np.concatenate([w.x.mean(axis=2), w.x.std(axis=2)], axis=1)
    train, test = w.subject <= 103, w.subject > 103  # held-out subjects
    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(feats[train], w.y[train])
    accuracy = clf.score(feats[test], w.y[test])
    assert accuracy > 0.5  # chance is 0.1

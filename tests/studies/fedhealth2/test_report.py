"""The FedHealth 2 report on a small hand-made run directory: numbers against a hand computation,
files, HTML content and escaping, summary rows, and build_report's dispatch on run.json's study."""

import csv
import json
import math

import pytest


from fedcare.evaluation.statistics import read_records
from fedcare.report import SYNTHETIC_BANNER
from fedcare.studies.fedhealth2.report import aggregate_fedhealth2, format_summary_markdown, summary_rows
from fedcare.studies.run import build_report, summary_markdown

from support.pain_run import write_run as write_pain_run


METHODS = ["fedap", "a<b>"]
CLIENTS = [0, 1, 2]
N = {0: 10, 1: 30, 2: 60}
NAN = math.nan
# final-round (round 2) accuracy per method, seed and client; a<b> seed 0 client 1 is NaN
FINAL = {
    ("fedap", 0): [0.6, 0.8, 0.9],
    ("fedap", 1): [0.7, 0.9, 1.0],
    ("a<b>", 0): [0.5, NAN, 0.7],
    ("a<b>", 1): [0.4, 0.6, 0.8],
}
PNG = b"\x89PNG\r\n\x1a\n"


def accuracy(method, seed, rnd, client):
    final = FINAL[(method, seed)][client]
    return final - 0.1 * (2 - rnd)  # rounds 0 and 1 are worse; NaN stays NaN


def write_run(run_dir, synthetic=True, with_evals=True, study="fedhealth2"):
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for seed in (0, 1):
        for method in METHODS:
            for rnd in (0, 1, 2):
                if rnd:
                    lines.append({"type": "round", "study": "fedhealth2", "method": method, "seed": seed,
                                  "phase": "train", "round": rnd, "train_loss": 0.4, "clients": 3, "n_train": 300})
                if with_evals:
                    for client in CLIENTS:
                        lines.append({"type": "client_eval", "study": "fedhealth2", "method": method, "seed": seed,
                                      "round": rnd, "client": client, "n": N[client],
                                      "accuracy": accuracy(method, seed, rnd, client), "loss": 0.5})
    lines.append({"type": "future-record", "whatever": [1, 2]})
    # json.dumps writes the NaN accuracy as a bare NaN literal, as the study's writer does
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    info = {"title": "FH2 <test>", "dataset": "pamap2", "synthetic": synthetic,
            "config_file": "configs/fedhealth2/pamap2.toml", "seeds": [0, 1], "methods": METHODS, "clients": 3,
            "rounds": 2, "started": "2026-01-01T10:00:00+00:00", "finished": "2026-01-01T10:01:30+00:00",
            "fedcare_version": "0.1.0", "run_dir": run_dir.name, "notes": ["note with <tags> & more"]}
    if study is not None:
        info["study"] = study
    (run_dir / "run.json").write_text(json.dumps(info))
    return run_dir


def pop_sd(xs):
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


# hand computation: per seed over the clients with a number, then the mean over seeds
EXPECTED = {
    "fedap": {
        "mean": ((0.6 + 0.8 + 0.9) / 3 + (0.7 + 0.9 + 1.0) / 3) / 2,
        "sd": (pop_sd([0.6, 0.8, 0.9]) + pop_sd([0.7, 0.9, 1.0])) / 2,
        "weighted": ((6 + 24 + 54) / 100 + (7 + 27 + 60) / 100) / 2,
        "worst": (0.6 + 0.7) / 2,
        "best": (0.9 + 1.0) / 2,
        "seed_sd": 0.05,  # the per-seed means differ by 0.1
        "per_client": [0.65, 0.85, 0.95],
    },
    "a<b>": {
        "mean": ((0.5 + 0.7) / 2 + (0.4 + 0.6 + 0.8) / 3) / 2,  # NaN client skipped in seed 0
        "sd": (0.1 + pop_sd([0.4, 0.6, 0.8])) / 2,
        "weighted": ((5 + 42) / 70 + (4 + 18 + 48) / 100) / 2,
        "worst": (0.5 + 0.4) / 2,
        "best": (0.7 + 0.8) / 2,
        "seed_sd": 0.0,  # both seeds average 0.6
        "per_client": [0.45, 0.6, 0.75],  # client 1: seed 1 only
    },
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = write_run(tmp_path_factory.mktemp("fh2") / "synthetic", synthetic=True)
    return run_dir, build_report(run_dir)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_all_files_written(run):
    run_dir, report = run
    assert report == run_dir / "report.html" and report.stat().st_size > 0
    for name in ("summary", "per_client_accuracy"):
        for ext in ("csv", "md"):
            assert (run_dir / "tables" / f"{name}.{ext}").stat().st_size > 0
    for name in ("accuracy_per_round", "per_client_accuracy"):
        assert (run_dir / "plots" / f"{name}.png").read_bytes()[:8] == PNG
    assert not [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")]
    assert not (run_dir / "tables" / "rank_sums.csv").exists()  # not the pain report


def test_summary_equals_hand_computation(run):
    run_dir, _ = run
    rows = read_csv(run_dir / "tables" / "summary.csv")
    assert [r["method"] for r in rows] == METHODS
    for r in rows:
        e = EXPECTED[r["method"]]
        for key in ("mean", "sd", "weighted", "worst", "best", "seed_sd"):
            assert float(r[f"accuracy_{key}"]) == pytest.approx(e[key], abs=1e-12), (r["method"], key)
        assert r["seeds"] == "2" and r["final_round"] == "2"
    by = {r["method"]: r for r in rows}
    assert by["a<b>"]["final_evals"] == "5" and by["a<b>"]["final_nan_skipped"] == "1"  # 2 seeds x 3 clients - NaN
    assert by["fedap"]["final_evals"] == "6" and by["fedap"]["final_nan_skipped"] == "0"

    md = (run_dir / "tables" / "summary.md").read_text()
    f = EXPECTED["fedap"]
    cells = f"{100 * f['mean']:.1f} ± {100 * f['sd']:.1f} | {100 * f['weighted']:.1f} | 65.0 | 95.0 | 5.0 | 2 | 2"
    assert f"| fedap | {cells} |" in md


def test_per_client_equals_hand_values(run):
    run_dir, _ = run
    rows = read_csv(run_dir / "tables" / "per_client_accuracy.csv")
    assert list(rows[0]) == ["method", "0", "1", "2", "mean", "sd"]
    for r in rows:
        e = EXPECTED[r["method"]]
        assert [float(r[str(c)]) for c in CLIENTS] == pytest.approx(e["per_client"], abs=1e-12)
        assert float(r["mean"]) == pytest.approx(e["mean"], abs=1e-12)
        assert float(r["sd"]) == pytest.approx(e["sd"], abs=1e-12)
    md = (run_dir / "tables" / "per_client_accuracy.md").read_text()
    assert "| Method | 0 | 1 | 2 | mean ± SD |" in md
    assert "| a<b> | 45.0 | 60.0 | 75.0 | 60.0 ± " in md


def test_per_round_curve():
    records = []
    for seed in (0, 1):
        for rnd in (0, 1, 2):
            for c in CLIENTS:
                records.append({"type": "client_eval", "method": "fedap", "seed": seed, "round": rnd, "client": c,
                                "n": N[c], "accuracy": accuracy("fedap", seed, rnd, c)})
    agg = aggregate_fedhealth2(records)
    assert agg.rounds == [0, 1, 2]
    for rnd in (0, 1, 2):
        assert agg.per_round["fedap"][rnd] == pytest.approx(EXPECTED["fedap"]["mean"] - 0.1 * (2 - rnd))


def test_html_content(run):
    _, report = run
    page = report.read_text()
    assert SYNTHETIC_BANNER in page
    assert "FH2 &lt;test&gt;" in page
    assert "a&lt;b&gt;" in page and "a<b>" not in page  # method name escaped everywhere
    assert "&lt;tags&gt; &amp; more" in page and "<tags>" not in page
    assert page.count("data:image/png;base64,") == 2
    assert "How to read this" in page and "plain mean over clients" in page.lower()
    assert "pamap2" in page and "configs/fedhealth2/pamap2.toml" in page
    assert "36 (3 without accuracy, skipped)" in page  # the NaN client is NaN in all 3 rounds
    assert "Per test subject" not in page  # not the pain page


def test_real_data_has_no_banner(tmp_path):
    page = build_report(write_run(tmp_path / "real", synthetic=False)).read_text()
    assert SYNTHETIC_BANNER not in page and "a&lt;b&gt;" in page


def test_summary_rows_and_markdown(run):
    run_dir, _ = run
    rows = summary_rows(run_dir)
    assert [r["method"] for r in rows] == METHODS
    for r in rows:
        assert r["accuracy"] == pytest.approx(EXPECTED[r["method"]]["mean"], abs=1e-12)
        assert r["accuracy_sd"] == pytest.approx(EXPECTED[r["method"]]["sd"], abs=1e-12)
    text = format_summary_markdown(rows)
    assert text.count("\n") == len(METHODS) + 1
    assert text.splitlines()[0].startswith("| Method | ACC (mean ± SD across clients) |")
    assert "| a<b> | 60.0 ± " in text


def test_no_client_evals_is_a_clear_error(tmp_path):
    run_dir = write_run(tmp_path / "empty", with_evals=False)
    with pytest.raises(ValueError, match="metrics.jsonl"):
        build_report(run_dir)
    with pytest.raises(ValueError, match="metrics.jsonl"):
        summary_rows(run_dir)
    assert not (run_dir / "report.html").exists()


def test_unknown_study_is_a_clear_error(tmp_path):
    run_dir = write_run(tmp_path / "other", study="mystery")
    with pytest.raises(ValueError, match="run.json"):
        build_report(run_dir)


def test_run_json_without_study_is_the_pain_report(tmp_path):
    run_dir = write_pain_run(tmp_path / "pain")
    info = json.loads((run_dir / "run.json").read_text())
    del info["study"]
    (run_dir / "run.json").write_text(json.dumps(info))
    page = build_report(run_dir).read_text()
    assert "Table 7.1" in page and (run_dir / "tables" / "rank_sums.csv").is_file()
    assert summary_markdown(run_dir).startswith("| Method | ACC | PR-AUC | F1 |")


def test_fedhealth2_records_without_study_in_run_json_go_to_pain(tmp_path):
    # run.json decides: a FedHealth 2 metrics.jsonl under a run.json without "study" is read as pain
    run_dir = write_run(tmp_path / "nostudy", study=None)
    with pytest.raises(ValueError, match="no test records"):
        build_report(run_dir)


def test_records_read_back_with_nan(run):
    run_dir, _ = run
    records, _ = read_records(run_dir / "metrics.jsonl")
    assert sum(1 for r in records if r.get("type") == "client_eval" and math.isnan(r["accuracy"])) == 3

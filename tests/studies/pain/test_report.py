"""build_report on a small hand-made run directory: files, numbers, HTML content, escaping."""

import csv
import json
import math

import pytest

from fedcare.evaluation.statistics import read_records
from fedcare.report import SYNTHETIC_BANNER
from fedcare.studies.pain.aggregate import aggregate
from fedcare.studies.pain.report import format_summary_markdown, summary_markdown, summary_rows
from fedcare.studies.run import build_report

from support.pain_run import METHODS, write_run


TABLE_FILES = (
    ["summary", "rank_sums"]
    + [f"per_subject_{m}" for m in ("acc", "pr_auc", "f1")]
    + [f"per_session_{m}" for m in ("acc", "pr_auc", "f1")]
)
PLOT_FILES = ["per_session_f1", "per_session_pr_auc", "per_session_acc", "per_subject_f1", "val_loss"]


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory):
    run_dir = write_run(tmp_path_factory.mktemp("runs") / "synthetic", synthetic=True)
    return run_dir, build_report(run_dir)


def test_all_files_written(synthetic_run):
    run_dir, report = synthetic_run
    assert report == run_dir / "report.html"
    for name in TABLE_FILES:
        for ext in ("csv", "md"):
            path = run_dir / "tables" / f"{name}.{ext}"
            assert path.is_file() and path.stat().st_size > 0, path
    for name in PLOT_FILES:
        path = run_dir / "plots" / f"{name}.png"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    assert report.stat().st_size > 0
    leftovers = [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")]
    assert not leftovers  # atomic writes clean up


def test_csv_numbers_equal_statistics(synthetic_run):
    run_dir, _ = synthetic_run
    agg = aggregate(read_records(run_dir / "metrics.jsonl")[0])
    with open(run_dir / "tables" / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["method"] for r in rows] == METHODS
    for r in rows:
        s = agg.summary[r["method"]]
        for m in ("acc", "pr_auc", "f1", "precision", "roc_auc"):
            assert float(r[f"{m}_mean"]) == s.mean[m]
            assert float(r[f"{m}_sd"]) == s.sd[m]
            assert float(r[f"{m}_seed_sd"]) == s.seed_sd[m]
            assert float(r[f"{m}_session_sd"]) == s.session_sd[m]
        assert math.isnan(float(r["recall_mean"]))  # all null
        assert int(r["seeds"]) == 2 and int(r["masked_out"]) == 6

    with open(run_dir / "tables" / "per_session_f1.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        assert float(r["1"]) == agg.per_session["f1"][r["method"]][1]
        assert math.isnan(float(r["2"]))  # no positives in session 2
        assert float(r["sd"]) == agg.summary[r["method"]].session_sd["f1"]
    with open(run_dir / "tables" / "per_subject_acc.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[2]["48"]) == agg.per_subject["acc"]["F(C)"][48] == pytest.approx(0.75)
    with open(run_dir / "tables" / "rank_sums.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["method"]: float(r["subject_f1"]) for r in rows} == agg.rank_sums("subject", "f1")
    assert {r["method"]: float(r["session_acc"]) for r in rows} == agg.rank_sums("session", "acc")

    rows = summary_rows(run_dir)
    assert [r["method"] for r in rows] == METHODS
    assert rows[2]["acc"] == pytest.approx(0.75) and rows[2]["acc_sd"] == pytest.approx(0.0)
    assert set(rows[0]) == {"method", "acc", "acc_sd", "pr_auc", "pr_auc_sd", "f1", "f1_sd"}
    text = format_summary_markdown(rows)
    assert "| F(C) | 75.0 ± 0.0 |" in text and text.count("\n") == len(METHODS) + 1


def test_markdown_tables(synthetic_run):
    run_dir, _ = synthetic_run
    md = (run_dir / "tables" / "per_session_f1.md").read_text()
    assert "| Method | 1 | 2 | 3 | mean ± SD |" in md and "NA" in md
    assert "| F(C) | 75.0 ± 0.0 |" in (run_dir / "tables" / "summary.md").read_text()


def test_html_content(synthetic_run):
    _, report = synthetic_run
    page = report.read_text()
    assert SYNTHETIC_BANNER in page
    assert "75.0 ± 0.0" in page  # F(C)'s accuracy: 0.75 in every record
    for name in ("RANDOM", "F(C)", "A&lt;B&gt;"):
        assert name in page
    assert "A<B>" not in page  # escaped
    assert "&lt;tags&gt; &amp; ampersands" in page and "<tags>" not in page
    assert "Test run &lt;one&gt;" in page
    assert page.count("data:image/png;base64,") == len(PLOT_FILES)
    assert "How to read this" in page
    assert "configs/pain/demo.toml" in page


def test_real_data_has_no_banner(tmp_path):
    run_dir = write_run(tmp_path / "real", synthetic=False)
    page = build_report(run_dir).read_text()
    assert SYNTHETIC_BANNER not in page
    assert "A&lt;B&gt;" in page


def test_missing_run_json_still_reports(tmp_path):
    run_dir = write_run(tmp_path / "norunjson", run_json=False)
    page = build_report(run_dir).read_text()
    assert "run.json is missing" in page


def test_no_test_records_is_a_clear_error(tmp_path):
    run_dir = write_run(tmp_path / "empty", with_tests=False)
    with pytest.raises(ValueError, match="metrics.jsonl"):
        build_report(run_dir)
    assert not (run_dir / "report.html").exists()


def _eval(method, session, client, tp, fp, fn, tn, f1):
    n = tp + fp + fn + tn
    return {"type": "client_eval", "study": "pain", "method": method, "seed": 1, "session": session,
            "client": client, "n": n, "positives": tp + fn, "acc": (tp + tn) / n, "pr_auc": 0.5, "f1": f1,
            "precision": None, "recall": None, "roc_auc": 0.5, "tp": tp, "fp": fp, "fn": fn, "tn": tn}


def test_f1_threshold_table_and_finding_explain_a_trained_f1_below_random(tmp_path):
    # RANDOM calls almost everything pain; "M" ranks well but finds no pain frame in one record
    records = [
        _eval("RANDOM", 1, 43, tp=4, fp=12, fn=0, tn=4, f1=8 / 20),
        _eval("RANDOM", 2, 43, tp=9, fp=8, fn=1, tn=2, f1=18 / 28),
        _eval("M", 1, 43, tp=0, fp=1, fn=4, tn=15, f1=0.0),
        _eval("M", 2, 43, tp=8, fp=1, fn=2, tn=9, f1=16 / 19),
        _eval("M", 3, 43, tp=0, fp=3, fn=0, tn=17, f1=None),  # no pain in this record: masked out
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    build_report(tmp_path)
    rows = list(csv.DictReader((tmp_path / "tables" / "f1_threshold.csv").open()))
    assert [r["method"] for r in rows] == ["RANDOM", "M"]
    m = rows[1]
    assert (int(m["records"]), int(m["no_pain_predicted"])) == (2, 1)
    assert float(m["f1_pooled"]) == pytest.approx(2 * 8 / (2 * 8 + 2 + 6))  # tp 8, fp 2, fn 6 over both records
    assert float(m["predicted_pain"]) == pytest.approx(10 / 40)
    assert float(m["f1_weighted_mean"]) == pytest.approx((0 * 20 + 16 / 19 * 20) / 40)
    text = summary_markdown(tmp_path)
    assert "RANDOM's F1 (52.1) is above that of M" in text and "M found no pain frame in 1 of 2 records" in text
    assert "threshold 0.5" in (tmp_path / "report.html").read_text()


def test_no_f1_finding_when_the_trained_method_beats_random(tmp_path):
    records = [_eval("RANDOM", 1, 43, tp=4, fp=12, fn=0, tn=4, f1=8 / 20),
               _eval("M", 1, 43, tp=3, fp=0, fn=1, tn=16, f1=6 / 7)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    build_report(tmp_path)
    assert summary_markdown(tmp_path) == format_summary_markdown(summary_rows(tmp_path))
    assert (tmp_path / "tables" / "f1_threshold.md").exists()


def test_the_run_table_names_the_finished_directory_and_labels_every_key():
    """Surgical and face reports are written in `<out>.partial` just before the rename: the Run
    table names `<out>` (run.json's run_dir) and labels run.json's keys instead of printing them raw."""
    from fedcare.report.html import facts_table

    info = {"run_dir": "demo-surgical-1", "study": "surgical", "fedcare_version": "0.2.0", "training_seconds": 12.5,
            "frame_size": 64, "status": "finished"}
    html = facts_table(info, "demo-surgical-1.partial", [("study", "Study")])
    assert "<th>Run directory</th><td>demo-surgical-1</td>" in html
    assert ".partial" not in html
    for raw in ("fedcare_version", "training_seconds", "frame_size", "run_dir"):
        assert f"<th>{raw}</th>" not in html
    for label, value in (("fedcare version", "0.2.0"), ("Training time (s)", "12.5"), ("Frame size", "64"),
                         ("Status", "finished")):
        assert f"<th>{label}</th><td>{value}</td>" in html

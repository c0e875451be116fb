"""A run's report: paper-style tables, plots and one self-contained report.html.

``build_report(run_dir)`` reads ``run_dir/run.json`` (run facts; optional, missing keys are
fine) and ``run_dir/metrics.jsonl`` (the records) and builds the report of the run's study,
run.json's ``"study"``: ``"pain"`` (the default when run.json or the key is missing) or
``"fedhealth2"`` (see :mod:`fedcare.report.fedhealth2`). The pain report writes::

    tables/summary.{csv,md}                       Table 7.1
    tables/per_subject_{acc,pr_auc,f1}.{csv,md}   Table 7.4
    tables/per_session_{acc,pr_auc,f1}.{csv,md}   Table 7.5
    tables/rank_sums.{csv,md}                     Tables 7.6/7.7
    plots/per_session_{f1,pr_auc,acc}.png, plots/per_subject_f1.png, plots/val_loss.png
    report.html

How the numbers are aggregated is documented in :mod:`fedcare.evaluation.statistics`.
Every file is replaced atomically. It can be re-run on a finished run directory at any time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedcare.evaluation.statistics import PRIMARY_METRICS, RunAggregate, aggregate, read_records
from fedcare.report import fedhealth2
from fedcare.report.html import SYNTHETIC_BANNER, render_report_html
from fedcare.report.plots import build_plots
from fedcare.report.tables import atomic_write_bytes, atomic_write_text, build_tables, pct_pm, write_tables

__all__ = [
    "STUDIES", "SYNTHETIC_BANNER", "build_report", "format_summary_markdown", "load_run", "read_run_info",
    "study_of", "summary_rows",
]

METRICS_FILE = "metrics.jsonl"
RUN_FILE = "run.json"
STUDIES = ("pain", "fedhealth2")
DEFAULT_STUDY = "pain"


def read_run_info(run_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """(run.json as a dict, notes). A missing, unreadable or non-object run.json gives ``{}`` and
    a note saying so; it is never an error."""
    notes: list[str] = []
    run_info: dict[str, Any] = {}
    run_path = Path(run_dir) / RUN_FILE
    if run_path.is_file():
        try:
            loaded = json.loads(run_path.read_text())
            if isinstance(loaded, dict):
                run_info = loaded
            else:
                notes.append(f"{RUN_FILE} is not a JSON object; run facts are missing.")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            notes.append(f"{RUN_FILE} could not be read ({e}); run facts are missing.")
    else:
        notes.append(f"{RUN_FILE} is missing; run facts are unknown.")
    return run_info, notes


def study_of(run_info: dict[str, Any], run_dir: Path | None = None) -> str:
    """The study of a run from its run.json content: "pain" when not stated; ValueError (naming
    run.json) for a study this package has no report for."""
    study = run_info.get("study")
    if study is None or study == "":
        return DEFAULT_STUDY
    key = str(study).strip().lower()
    if key not in STUDIES:
        where = Path(run_dir) / RUN_FILE if run_dir is not None else RUN_FILE
        raise ValueError(f"{where}: unknown study {study!r}; reports exist for {', '.join(STUDIES)}")
    return key


def load_run(run_dir: Path) -> tuple[list[dict], dict[str, Any], RunAggregate, list[str]]:
    """(records, run_info, aggregate, notes) of a run directory.

    Raises FileNotFoundError if metrics.jsonl is missing and ValueError (naming the file) if it
    is malformed or holds no test records. A missing or unreadable run.json only adds a note.
    """
    run_dir = Path(run_dir)
    metrics_path = run_dir / METRICS_FILE
    if not metrics_path.is_file():
        raise FileNotFoundError(f"{metrics_path}: no such file (not a run directory?)")
    records, notes = read_records(metrics_path)
    if not any(r.get("type") == "test" for r in records):
        raise ValueError(f"{metrics_path}: no test records (\"type\": \"test\"); nothing to report")
    agg = aggregate(records, source=str(metrics_path))
    run_info, run_notes = read_run_info(run_dir)
    notes += run_notes
    if not agg.summary or all(s.records == 0 for s in agg.summary.values()):
        notes.append("No test record has positives: every record was masked out, all values are NA.")
    return records, run_info, agg, notes


def build_report(run_dir: Path) -> Path:
    """Write the tables, plots and report.html of ``run_dir`` for its study (run.json's "study",
    pain by default); returns the path of report.html."""
    run_dir = Path(run_dir)
    run_info, notes = read_run_info(run_dir)
    if study_of(run_info, run_dir) == "fedhealth2":
        return fedhealth2.build_fedhealth2_report(run_dir, run_info, notes)
    records, run_info, agg, notes = load_run(run_dir)
    tables = build_tables(agg)
    write_tables(tables, run_dir / "tables")
    plots = build_plots(agg, records)
    for name, png in plots.items():
        atomic_write_bytes(run_dir / "plots" / f"{name}.png", png)
    page = render_report_html(run_info, agg, tables, plots, run_dir_name=str(run_info.get("run_dir") or run_dir.name), notes=notes)
    return atomic_write_text(run_dir / "report.html", page)


def _rows(agg: RunAggregate) -> list[dict]:
    rows = []
    for method in agg.methods:
        s = agg.summary[method]
        row: dict[str, Any] = {"method": method}
        for m in PRIMARY_METRICS:
            row[m] = s.mean[m]
            row[f"{m}_sd"] = s.sd[m]
        rows.append(row)
    return rows


def summary_rows(run_dir: Path) -> list[dict]:
    """The summary of a run as dicts, in the order methods first appear; values are fractions,
    NaN where undefined, recomputed from metrics.jsonl.

    Pain: Table 7.1 (method, acc, acc_sd, pr_auc, pr_auc_sd, f1, f1_sd; seed-averaged weighted
    mean and SD across subjects). FedHealth 2: method, accuracy, accuracy_sd (plain mean over
    clients and SD across clients at the final round, seed-averaged) and accuracy_weighted,
    accuracy_worst, accuracy_best, accuracy_seed_sd, seeds (see
    :func:`fedcare.report.fedhealth2.summary_rows`)."""
    run_dir = Path(run_dir)
    if study_of(read_run_info(run_dir)[0], run_dir) == "fedhealth2":
        return fedhealth2.summary_rows(run_dir)
    return _rows(load_run(run_dir)[2])


def format_summary_markdown(rows: list[dict]) -> str:
    """A Markdown table of :func:`summary_rows`, "mean ± SD" in %: Method | ACC | PR-AUC | F1
    for pain rows; for FedHealth 2 rows (they have an "accuracy" key) Method | ACC (mean ± SD
    across clients) | weighted ACC | worst client | best client."""
    if any("accuracy" in r for r in rows):
        return fedhealth2.format_summary_markdown(rows)
    lines = ["| Method | ACC | PR-AUC | F1 |", "|---|---:|---:|---:|"]
    for r in rows:
        method = str(r.get("method", "")).replace("|", "\\|")
        cells = [pct_pm(r.get(m), r.get(f"{m}_sd")) for m in PRIMARY_METRICS]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

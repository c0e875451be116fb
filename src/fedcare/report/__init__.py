"""A run's report: paper-style tables, plots and one self-contained report.html.

``build_report(run_dir)`` reads ``run_dir/metrics.jsonl`` (the records) and ``run_dir/run.json``
(run facts; optional, missing keys are fine) and writes::

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
from fedcare.report.html import SYNTHETIC_BANNER, render_report_html
from fedcare.report.plots import build_plots
from fedcare.report.tables import atomic_write_bytes, atomic_write_text, build_tables, pct_pm, write_tables

__all__ = ["SYNTHETIC_BANNER", "build_report", "format_summary_markdown", "load_run", "summary_rows"]

METRICS_FILE = "metrics.jsonl"
RUN_FILE = "run.json"


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
    run_info: dict[str, Any] = {}
    run_path = run_dir / RUN_FILE
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
    if not agg.summary or all(s.records == 0 for s in agg.summary.values()):
        notes.append("No test record has positives: every record was masked out, all values are NA.")
    return records, run_info, agg, notes


def build_report(run_dir: Path) -> Path:
    """Write the tables, plots and report.html of ``run_dir``; returns the path of report.html."""
    run_dir = Path(run_dir)
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
    """Table 7.1 of a run as dicts (method, acc, acc_sd, pr_auc, pr_auc_sd, f1, f1_sd), in the
    order methods first appear. Values are fractions (seed-averaged weighted mean and SD across
    subjects); NaN where undefined. Recomputed from metrics.jsonl."""
    return _rows(load_run(Path(run_dir))[2])


def format_summary_markdown(rows: list[dict]) -> str:
    """A Markdown table of :func:`summary_rows`: Method | ACC | PR-AUC | F1, "mean ± SD" in %."""
    lines = ["| Method | ACC | PR-AUC | F1 |", "|---|---:|---:|---:|"]
    for r in rows:
        method = str(r.get("method", "")).replace("|", "\\|")
        cells = [pct_pm(r.get(m), r.get(f"{m}_sd")) for m in PRIMARY_METRICS]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

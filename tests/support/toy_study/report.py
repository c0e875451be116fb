"""The toy study's report: mean TAR over clients per method and round, one table and one plot."""

from __future__ import annotations

from pathlib import Path

from fedcare.evaluation.statistics import nanmean
from fedcare.report import write_report
from fedcare.report.html import render_run_page, table_block
from fedcare.report.plots import method_lines
from fedcare.report.tables import Table, pct
from fedcare.studies.rundir import read_run_records


def mean_tar(run_dir: Path) -> dict[str, dict[int, float]]:
    records, _ = read_run_records(run_dir)
    evals = [r for r in records if r["type"] == "client_eval"]
    if not evals:
        raise ValueError(f"{run_dir / 'metrics.jsonl'}: no client_eval records")
    methods = list(dict.fromkeys(r["method"] for r in evals))
    return {m: {rnd: nanmean(r["tar"] for r in evals if r["method"] == m and r["round"] == rnd)
                for rnd in sorted({r["round"] for r in evals})} for m in methods}


def build_report(run_dir: Path, run_info: dict, notes: list[str]) -> Path:
    tar = mean_tar(run_dir)
    last = {m: values[max(values)] for m, values in tar.items()}
    table = Table(name="summary", title="TAR@FAR=0.1 at the last round", caption="Mean over clients.",
                  columns=["Method", "TAR"], rows=[[m, pct(v)] for m, v in last.items()],
                  csv_header=["method", "tar"], csv_rows=[[m, v] for m, v in last.items()])
    rounds = sorted({r for values in tar.values() for r in values})
    plots = {"tar": method_lines(list(tar), rounds, tar, xlabel="round", ylabel="TAR (%)", title="TAR per round")}
    page = render_run_page(run_info, run_dir_name=Path(run_dir).name, known_facts=[("study", "Study")], notes=notes,
                           sections=[("summary", "Summary", "Summary", table_block(table))], plots=plots)
    return write_report(run_dir, {"summary": table}, plots, page)


def summary_markdown(run_dir: Path) -> str:
    return "\n".join(["| Method | TAR |", "|---|---:|"]
                     + [f"| {m} | {pct(v[max(v)])} |" for m, v in mean_tar(run_dir).items()])

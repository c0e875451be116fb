"""The paper-style tables of a run (Tobis thesis Tables 7.1, 7.4-7.7) as CSV, Markdown and HTML.

Each table is a :class:`Table`: display cells (percentages, "mean ± SD") for Markdown and
HTML, and raw numbers (fractions, full precision, ``nan`` for missing) for CSV. Every file is
written atomically (temp file in the same directory, then ``os.replace``).
"""

from __future__ import annotations

import csv
import html
import io
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedcare.evaluation.statistics import METRIC_LABELS, METRICS, PRIMARY_METRICS, RunAggregate, Unit

PCT_DIGITS = 1


# -- files ------------------------------------------------------------------------------
def atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temp file in the same directory and ``os.replace``, so
    readers see either the old file or the complete new one, never a partial write."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


# -- formatting -------------------------------------------------------------------------
def is_missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def pct(x: float | None, digits: int = PCT_DIGITS) -> str:
    """A fraction as a percentage without the sign ("75.3"); "NA" when missing."""
    return "NA" if is_missing(x) else f"{100 * x:.{digits}f}"


def pct_pm(mean: float | None, sd: float | None, digits: int = PCT_DIGITS) -> str:
    """"75.3 ± 12.9" (percentages); the SD part is dropped when missing."""
    if is_missing(mean):
        return "NA"
    return pct(mean, digits) if is_missing(sd) else f"{pct(mean, digits)} ± {pct(sd, digits)}"


def fmt_rank(x: float) -> str:
    """Rank sums are whole numbers unless ties split a rank (x.5)."""
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def unit_label(u: Unit) -> str:
    if isinstance(u, float) and u.is_integer():
        return str(int(u))
    if isinstance(u, tuple):
        return "/".join(map(str, u))
    return str(u)


def raw(x: Any) -> str:
    """A CSV cell: floats at full (round-trip) precision, missing values as "nan"."""
    if x is None:
        return "nan"
    if isinstance(x, float):
        return "nan" if math.isnan(x) else repr(x)
    return str(x)


def _md_cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


# -- the table object -------------------------------------------------------------------
@dataclass
class Table:
    name: str  # file stem, e.g. "per_subject_acc"
    title: str  # e.g. "Table 7.4 (ACC): per test subject"
    caption: str  # how the numbers were made
    columns: list[str]  # display header
    rows: list[list[str]]  # display cells
    csv_header: list[str]
    csv_rows: list[list[Any]]
    # scores[i][j]: the number behind rows[i][j] where "higher is better" makes sense (else NaN);
    # the HTML bolds each column's best.
    scores: list[list[float]] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [f"**{_md_cell(self.title)}**", ""]
        lines.append("| " + " | ".join(_md_cell(c) for c in self.columns) + " |")
        lines.append("|" + "|".join(["---"] + ["---:"] * (len(self.columns) - 1)) + "|")
        for row in self.rows:
            lines.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
        lines += ["", _md_cell(self.caption), ""]
        return "\n".join(lines)

    def csv(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(self.csv_header)
        for row in self.csv_rows:
            w.writerow([raw(x) for x in row])
        return buf.getvalue()

    def best_cells(self) -> set[tuple[int, int]]:
        best: set[tuple[int, int]] = set()
        if len(self.scores) < 2:
            return best
        for j in range(len(self.columns)):
            col = [(i, s[j]) for i, s in enumerate(self.scores) if j < len(s) and not is_missing(s[j])]
            if len(col) < 2:
                continue
            top = max(v for _, v in col)
            if all(v == top for _, v in col):
                continue  # everyone ties (e.g. session 1): nothing to highlight
            best |= {(i, j) for i, v in col if v == top}
        return best

    def html(self) -> str:
        """An HTML <table>; all text is escaped; each column's best value is bold."""
        esc = html.escape
        best = self.best_cells()
        out = ['<div class="table-wrap"><table>', "<thead><tr>"]
        out += [f"<th>{esc(c)}</th>" for c in self.columns]
        out.append("</tr></thead><tbody>")
        for i, row in enumerate(self.rows):
            cells = []
            for j, c in enumerate(row):
                tag = "th" if j == 0 else "td"
                cls = ' class="na"' if c == "NA" else ""
                text = f"<b>{esc(c)}</b>" if (i, j) in best else esc(c)
                cells.append(f"<{tag}{cls}>{text}</{tag}>")
            out.append("<tr>" + "".join(cells) + "</tr>")
        out.append("</tbody></table></div>")
        return "".join(out)


# -- the tables -------------------------------------------------------------------------
def summary_table(agg: RunAggregate) -> Table:
    """Table 7.1: method | ACC | PR-AUC | F1 as mean ± SD across subjects, plus the seed SDs."""
    multi_seed = any(len(agg.summary[m].seeds) > 1 for m in agg.methods)
    columns = ["Method"] + [METRIC_LABELS[m] for m in PRIMARY_METRICS]
    columns += [f"seed SD {METRIC_LABELS[m]}" for m in PRIMARY_METRICS] + ["seeds"]
    rows, scores, csv_rows = [], [], []
    for method in agg.methods:
        s = agg.summary[method]
        one = len(s.seeds) < 2
        rows.append(
            [method]
            + [pct_pm(s.mean[m], s.sd[m]) for m in PRIMARY_METRICS]
            + ["–" if one else pct(s.seed_sd[m]) for m in PRIMARY_METRICS]
            + [str(len(s.seeds))]
        )
        scores.append([math.nan] + [s.mean[m] for m in PRIMARY_METRICS] + [math.nan] * 4)
        csv_rows.append(
            [method, len(s.seeds), s.records, s.masked_out]
            + [x for m in METRICS for x in (s.mean[m], s.sd[m], s.session_sd[m], s.seed_sd[m])]
        )
    csv_header = ["method", "seeds", "records", "masked_out"] + [
        f"{m}_{k}" for m in METRICS for k in ("mean", "sd", "session_sd", "seed_sd")
    ]
    caption = (
        "Percentages. Example-weighted mean over all test records with positives ± SD across test subjects "
        "(population SD of the per-subject weighted means), each averaged over seeds."
    )
    if multi_seed:
        caption += " seed SD: population SD across seeds of the weighted mean."
    else:
        caption += " One seed, so no seed SD."
    return Table(
        name="summary", title="Table 7.1: all methods (sessions setting)", caption=caption,
        columns=columns, rows=rows, csv_header=csv_header, csv_rows=csv_rows, scores=scores,
    )


def _unit_table(agg: RunAggregate, metric: str, by: str) -> Table:
    units = agg.subjects if by == "subject" else agg.sessions
    values = (agg.per_subject if by == "subject" else agg.per_session)[metric]
    label = METRIC_LABELS[metric]
    columns = ["Method"] + [unit_label(u) for u in units] + ["mean ± SD"]
    rows, scores, csv_rows = [], [], []
    for method in agg.methods:
        s = agg.summary[method]
        sd = s.sd[metric] if by == "subject" else s.session_sd[metric]
        row_vals = [values[method].get(u, math.nan) for u in units]
        rows.append([method] + [pct(v) for v in row_vals] + [pct_pm(s.mean[metric], sd)])
        scores.append([math.nan] + row_vals + [s.mean[metric]])
        csv_rows.append([method] + row_vals + [s.mean[metric], sd])
    if by == "subject":
        title = f"Table 7.4 ({label}): per test subject"
        caption = (
            f"Percentages. Each cell: example-weighted mean {label} over that subject's sessions with positives, "
            "averaged over seeds. Last column: weighted mean over all records ± SD across subjects."
        )
    else:
        title = f"Table 7.5 ({label}): per session"
        caption = (
            f"Percentages. Each cell: example-weighted mean {label} over that session's subjects with positives, "
            "averaged over seeds; NA = no subject with positives in that session. "
            "Last column: weighted mean over all records ± SD across sessions."
        )
    return Table(
        name=f"per_{by}_{metric}", title=title, caption=caption, columns=columns, rows=rows,
        csv_header=["method"] + [unit_label(u) for u in units] + ["mean", "sd"], csv_rows=csv_rows, scores=scores,
    )


def per_subject_table(agg: RunAggregate, metric: str) -> Table:
    """Table 7.4 for one metric: rows methods, columns subjects, last column mean ± SD."""
    return _unit_table(agg, metric, "subject")


def per_session_table(agg: RunAggregate, metric: str) -> Table:
    """Table 7.5 for one metric: rows methods, columns sessions, last column mean ± SD."""
    return _unit_table(agg, metric, "session")


def rank_sum_table(agg: RunAggregate) -> Table:
    """Tables 7.6/7.7: rank sums by subject and by session for ACC, PR-AUC, F1."""
    keys = [(by, m) for by in ("subject", "session") for m in PRIMARY_METRICS]
    sums = {k: agg.rank_sums(*k) for k in keys}
    counts = {k: len(agg.rank_units(*k)) for k in keys}
    columns = ["Method"] + [f"{METRIC_LABELS[m]} by {by}" for by, m in keys]
    rows = [[method] + [fmt_rank(sums[k][method]) for k in keys] for method in agg.methods]
    scores = [[math.nan] + [sums[k][method] for k in keys] for method in agg.methods]
    csv_rows = [[method] + [sums[k][method] for k in keys] for method in agg.methods]

    def units_text(by: str) -> str:
        ns = sorted({counts[(by, m)] for m in PRIMARY_METRICS})
        return f"{'/'.join(map(str, ns))} {by}s"

    n = len(agg.methods)
    caption = (
        f"Per subject (Table 7.6) or per session (Table 7.7) the {n} methods are ranked from 0 (worst) to {n - 1} (best) "
        "on the seed-averaged values of Tables 7.4/7.5 (ties share the average rank), and the ranks are summed. "
        f"Ranked over {units_text('subject')} and {units_text('session')}: units where any method is NA are skipped."
    )
    return Table(
        name="rank_sums", title="Tables 7.6/7.7: rank sums", caption=caption, columns=columns, rows=rows,
        csv_header=["method"] + [f"{by}_{m}" for by, m in keys], csv_rows=csv_rows, scores=scores,
    )


def build_tables(agg: RunAggregate) -> dict[str, Table]:
    """All tables of the report keyed by file stem, in report order."""
    tables = [summary_table(agg)]
    tables += [per_subject_table(agg, m) for m in PRIMARY_METRICS]
    tables += [per_session_table(agg, m) for m in PRIMARY_METRICS]
    tables.append(rank_sum_table(agg))
    return {t.name: t for t in tables}


def write_tables(tables: dict[str, Table], out_dir: Path) -> list[Path]:
    """Write ``<name>.csv`` and ``<name>.md`` for every table into ``out_dir``."""
    paths = []
    for t in tables.values():
        paths.append(atomic_write_text(Path(out_dir) / f"{t.name}.csv", t.csv()))
        paths.append(atomic_write_text(Path(out_dir) / f"{t.name}.md", t.markdown()))
    return paths

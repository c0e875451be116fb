"""A run's paper-style tables as CSV, Markdown and HTML, for every study's report.

Each table is a :class:`Table`: display cells (percentages, "mean ± SD") for Markdown and
HTML, and raw numbers (fractions, full precision, ``nan`` for missing) for CSV. Every file is
written atomically (temp file in the same directory, then ``os.replace``).
"""

from __future__ import annotations

import csv
import html
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedcare.evaluation.statistics import Unit
from fedcare.files import atomic_write_text

PCT_DIGITS = 1


# -- files ------------------------------------------------------------------------------
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


def write_tables(tables: dict[str, Table], out_dir: Path) -> list[Path]:
    """Write ``<name>.csv`` and ``<name>.md`` for every table into ``out_dir``."""
    paths = []
    for t in tables.values():
        paths.append(atomic_write_text(Path(out_dir) / f"{t.name}.csv", t.csv()))
        paths.append(atomic_write_text(Path(out_dir) / f"{t.name}.md", t.markdown()))
    return paths

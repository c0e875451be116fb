"""What every study's report is made of: paper-style tables (`tables.Table`, written as CSV and
Markdown), plots (`plots`), and one self-contained report.html (`html.render_run_page`).

A study's report module (e.g. `fedcare.studies.pain.report`) aggregates its records, builds
its tables, plots and sections from these pieces, and writes them with `write_report`. Which
study's report a run directory gets is decided by `fedcare.studies.run.build_report`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fedcare.report.html import SYNTHETIC_BANNER
from fedcare.files import atomic_write_bytes, atomic_write_text
from fedcare.report.tables import Table, write_tables

__all__ = ["SYNTHETIC_BANNER", "write_report"]


def write_report(run_dir: Path, tables: Mapping[str, Table], plots: Mapping[str, bytes], page: str) -> Path:
    """Write ``tables/<name>.{csv,md}``, ``plots/<name>.png`` and ``report.html`` into `run_dir`,
    each file atomically; returns report.html's path."""
    run_dir = Path(run_dir)
    write_tables(dict(tables), run_dir / "tables")
    for name, png in plots.items():
        atomic_write_bytes(run_dir / "plots" / f"{name}.png", png)
    return atomic_write_text(run_dir / "report.html", page)

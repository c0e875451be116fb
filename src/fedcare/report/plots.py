"""Plots of a run as PNG bytes (matplotlib, Agg canvas; pyplot and the global backend are never
touched, so this is safe to call from any program or thread), for every study's report:

- :func:`method_lines`: one line per method over units (sessions, rounds);
- :func:`method_bars`: grouped bars per unit (subjects, clients), one bar per method;
- :func:`method_styles`, :func:`figure_png`, :func:`legend_right`, :func:`empty_panel`: the
  shared look.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedcare.report.tables import unit_label

DPI = 110
WIDE = (10.0, 4.6)
MARKERS = "osD^vP*Xh<>p"


def method_styles(methods: list[str]) -> dict[str, dict[str, Any]]:
    """A fixed colour and marker per method (same in every plot)."""
    cmap = colormaps["tab10" if len(methods) <= 10 else "tab20"]
    return {m: {"color": cmap(i % cmap.N), "marker": MARKERS[i % len(MARKERS)]} for i, m in enumerate(methods)}


def figure_png(fig: Figure) -> bytes:
    """A matplotlib Figure (made without pyplot) as PNG bytes at the report's DPI."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def legend_right(ax, n: int) -> None:
    """The legend outside the axes, top right (only if something was drawn)."""
    if n:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def empty_panel(ax, text: str) -> None:
    """An axes that says why it has nothing to show."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _positions(units: list) -> tuple[np.ndarray, list[str]]:
    numeric = all(isinstance(u, (int, float)) and not isinstance(u, bool) for u in units)
    x = np.asarray([float(u) for u in units]) if numeric else np.arange(len(units), dtype=float)
    return x, [unit_label(u) for u in units]


def method_lines(
    methods: list[str], units: list, values: Mapping[str, Mapping[Any, float]], *, xlabel: str, ylabel: str,
    title: str, scale: float = 100.0, tick_every_unit: bool = True, markersize: float = 5,
) -> bytes:
    """One line per method over ``units`` (``values[method][unit]``, missing = gap), times
    ``scale`` (fractions to percent). Numeric units are placed at their value; others evenly.
    ``tick_every_unit`` labels every unit, otherwise matplotlib picks integer ticks."""
    fig = Figure(figsize=WIDE, layout="constrained")
    ax = fig.add_subplot()
    styles = method_styles(methods)
    x, labels = _positions(units)
    for method in methods:
        y = np.asarray([values[method].get(u, math.nan) for u in units], dtype=float) * scale
        ax.plot(x, y, label=method, linewidth=1.6, markersize=markersize, **styles[method])
    if tick_every_unit:
        ax.set_xticks(x, labels)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    legend_right(ax, len(methods))
    return figure_png(fig)


def method_bars(
    methods: list[str], units: list, values: Mapping[str, Mapping[Any, float]], *, xlabel: str, ylabel: str,
    title: str, scale: float = 100.0,
) -> bytes:
    """Grouped bars: per unit one bar per method (``values[method][unit]`` times ``scale``;
    missing values are drawn as 0)."""
    fig = Figure(figsize=WIDE, layout="constrained")
    ax = fig.add_subplot()
    styles = method_styles(methods)
    n = max(1, len(methods))
    width = 0.8 / n
    x = np.arange(len(units), dtype=float)
    for i, method in enumerate(methods):
        y = np.asarray([values[method].get(k, math.nan) for k in units], dtype=float) * scale
        ax.bar(x - 0.4 + width * (i + 0.5), np.nan_to_num(y, nan=0.0), width, label=method,
               color=styles[method]["color"])
    ax.set_xticks(x, [unit_label(k) for k in units])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    legend_right(ax, len(methods))
    return figure_png(fig)


__all__ = ["empty_panel", "figure_png", "legend_right", "method_bars", "method_lines", "method_styles"]

"""The pain study's validation-loss plot: validation loss per round from the "round" records,
one panel for the single phases (pre-training) and one per sequential phase group
("session-1", "session-2", ... laid out left to right, each phase as wide as its longest run),
one line per method, mean over seeds."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedcare.report.plots import empty_panel, figure_png, legend_right, method_styles

_SEQUENTIAL = re.compile(r"^(.*?)-(\d+)$")


def _val_loss_curves(records: Iterable[Mapping[str, Any]]):
    """(method order, {(method, phase): {round: mean val_loss over seeds}})."""
    sums: dict[tuple[str, str], dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    methods: dict[str, None] = {}
    for r in records:
        if r.get("type") != "round":
            continue
        try:
            rnd = float(r["round"])
            loss = float(r["val_loss"])
        except (KeyError, TypeError, ValueError):
            continue
        if not math.isfinite(loss) or r.get("method") is None or r.get("phase") is None:
            continue
        method, phase = str(r["method"]), str(r["phase"])
        methods.setdefault(method, None)
        sums[(method, phase)][rnd].append(loss)
    curves = {k: {rnd: float(np.mean(v)) for rnd, v in sorted(d.items())} for k, d in sums.items()}
    return list(methods), curves


def plot_val_loss(records: Iterable[Mapping[str, Any]], method_order: list[str] | None = None) -> bytes:
    """Validation loss per round (mean over seeds) from the run's "round" records.

    ``method_order`` (the tables' methods) fixes the colours so a method looks the same as in
    the other plots; labels only found in round records (e.g. "pretrain C") come after."""
    methods, curves = _val_loss_curves(records)
    order = list(method_order or [])
    styles = method_styles(order + [m for m in methods if m not in order])
    single = sorted({p for _, p in curves if not _SEQUENTIAL.match(p)})
    groups: dict[str, list[str]] = defaultdict(list)
    for _, p in curves:
        m = _SEQUENTIAL.match(p)
        if m and p not in groups[m.group(1)]:
            groups[m.group(1)].append(p)
    for prefix in groups:
        groups[prefix].sort(key=lambda p: int(_SEQUENTIAL.match(p).group(2)))
    panels = (["single"] if single else []) + sorted(groups)
    fig = Figure(figsize=(12.0, 4.6), layout="constrained")
    if not panels:
        empty_panel(fig.add_subplot(), "no round records in metrics.jsonl")
        return figure_png(fig)
    ratios = [1.0 if p == "single" else 3.0 for p in panels]
    axes = fig.subplots(1, len(panels), width_ratios=ratios, squeeze=False)[0]
    for ax, panel in zip(axes, panels):
        drawn = 0
        if panel == "single":
            phases_of = defaultdict(list)
            for method, phase in curves:
                if phase in single:
                    phases_of[method].append(phase)
            for method in methods:
                for phase in sorted(phases_of[method]):
                    c = curves[(method, phase)]
                    label = method if len(phases_of[method]) == 1 else f"{method} · {phase}"
                    ax.plot(list(c), list(c.values()), label=label, linewidth=1.5, markersize=4, **styles[method])
                    drawn += 1
            ax.set_title("single phases (pre-training)", fontsize=10)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("round")
            ax.set_ylabel("validation loss")
        else:
            phases = groups[panel]
            rounds = {p: sorted({r for (m, q), c in curves.items() if q == p for r in c}) for p in phases}
            offsets, pos = {}, 0
            for p in phases:
                offsets[p] = pos
                pos += len(rounds[p]) + 1
            for method in methods:
                labelled = False
                for p in phases:
                    c = curves.get((method, p))
                    if not c:
                        continue
                    xs = [offsets[p] + rounds[p].index(r) for r in c]
                    ax.plot(xs, list(c.values()), label=None if labelled else method, linewidth=1.4,
                            markersize=3, **styles[method])
                    labelled = True
                    drawn += 1
            for p in phases[1:]:
                ax.axvline(offsets[p] - 1, color="0.75", linewidth=0.8, linestyle="--")
            ax.set_xticks([offsets[p] + (len(rounds[p]) - 1) / 2 for p in phases],
                          [_SEQUENTIAL.match(p).group(2) for p in phases])
            ax.set_xlabel(f"training phase {panel}-s (its rounds left to right; {panel}-s validates on {panel} s)")
            ax.set_title(f"{panel} phases: validation loss per round, mean over seeds", fontsize=10)
            ax.set_ylabel("validation loss")
        ax.grid(True, alpha=0.3)
        if drawn and panel == "single":
            ax.legend(fontsize=7, frameon=False)
        elif drawn:
            legend_right(ax, drawn)
    return figure_png(fig)

"""Statistics every study's report uses: example-weighted means with the spread between units,
NaN-skipping means, rank sums, and reading a run's metrics.jsonl. Each study aggregates its
own records with them (e.g. `fedcare.studies.pain.aggregate`)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Hashable

import numpy as np
from scipy.stats import rankdata

from fedcare.errors import InputError

Unit = Hashable  # a test subject, a session, a client, a round: whatever a table has a column for


# -- basic statistics -------------------------------------------------------------------


def weighted_mean_sd(values: Iterable[float], weights: Iterable[float]) -> tuple[float, float]:
    """Example-weighted mean of ``values`` and the plain population SD of ``values``.

    The SD is deliberately *not* weighted: it is the spread between the units (test subjects
    or sessions) the values belong to, the thesis's "SD between test subjects"
    (``np.std(values, ddof=0)``). NaN values are dropped together with their weights. Returns
    ``(nan, nan)`` when nothing is left; the mean is NaN if the remaining weights sum to 0.
    """
    v = np.asarray(list(values), dtype=np.float64).reshape(-1)
    w = np.asarray(list(weights), dtype=np.float64).reshape(-1)
    if v.shape != w.shape:
        raise ValueError(f"{v.size} values but {w.size} weights")
    keep = ~np.isnan(v)
    v, w = v[keep], w[keep]
    if v.size == 0:
        return math.nan, math.nan
    if (w < 0).any():
        raise ValueError("weights must be non-negative")
    total = w.sum()
    mean = float((v * w).sum() / total) if total > 0 else math.nan
    return mean, float(v.std(ddof=0))


def nanmean(values: Iterable[float]) -> float:
    v = np.asarray(list(values), dtype=np.float64)
    v = v[~np.isnan(v)]
    return float(v.mean()) if v.size else math.nan


def nanstd(values: Iterable[float]) -> float:
    v = np.asarray(list(values), dtype=np.float64)
    v = v[~np.isnan(v)]
    return float(v.std(ddof=0)) if v.size else math.nan


def _table_units(table: Mapping[str, Mapping[Unit, float]]) -> list[Unit]:
    units: list[Unit] = []
    for row in table.values():
        for u in row:
            if u not in units:
                units.append(u)
    return units


def rank_units(table: Mapping[str, Mapping[Unit, float]]) -> list[Unit]:
    """The units :func:`rank_sums` ranks: those where every method has a (non-NaN) value."""
    return [u for u in _table_units(table) if not any(is_nan(row.get(u)) for row in table.values())]


def rank_sums(table: Mapping[str, Mapping[Unit, float]]) -> dict[str, float]:
    """Rank sums of Tables 7.6/7.7.

    ``table[method][unit]`` is a score (higher is better) of a method on a unit (a test
    subject or a session). For every unit the methods are ranked from 0 (worst) to n-1 (best);
    tied methods share the average of their ranks (``scipy.stats.rankdata``, minus 1). Units
    where any method's value is NaN or missing are skipped. Returns the sum of each method's
    ranks over the remaining units, in the table's method order.
    """
    methods = list(table)
    sums = {m: 0.0 for m in methods}
    for u in rank_units(table):
        values = [float(table[m][u]) for m in methods]
        for m, r in zip(methods, rankdata(values, method="average") - 1.0):
            sums[m] += float(r)
    return sums


def is_nan(x: Any) -> bool:
    if x is None:
        return True
    try:
        return math.isnan(float(x))
    except (TypeError, ValueError):
        return True


# -- records ----------------------------------------------------------------------------


def as_float(x: Any) -> float:
    if x is None:
        return math.nan
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def as_fraction(x: Any, where: str) -> float:
    """A metric that is a fraction (accuracy, F1, an AUC) as a record holds it: NaN when missing,
    an InputError naming `where` for a number outside 0..1 (accuracy 7.5 was reported as 750.0)."""
    value = as_float(x)
    if not math.isnan(value) and not 0.0 <= value <= 1.0:
        raise InputError(f"{where} = {value:g}: not a fraction (0 to 1); not a value fedcare computed")
    return value


def read_records(path: Path) -> tuple[list[dict], list[str]]:
    """Parse a metrics.jsonl file: one JSON object per line (``NaN``/``Infinity`` literals and
    ``null`` accepted). Blank lines are skipped; so is a malformed *last* line without a
    trailing newline (a write cut short by a crash), which is reported in the returned notes.
    Any other malformed line raises ValueError naming the file and line.
    """
    path = Path(path)
    text = path.read_text()
    lines = text.split("\n")
    records: list[dict] = []
    notes: list[str] = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) and not text.endswith("\n"):
                notes.append(f"{path.name}: skipped an incomplete last line (line {i}).")
                continue
            raise InputError(f"{path}: line {i} is not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise InputError(f"{path}: line {i} is not a JSON object")
        records.append(obj)
    return records, notes


def as_unit(x: Any) -> Unit:
    if isinstance(x, list):
        return tuple(x)
    return x


def sort_units(units: Iterable[Unit]) -> list[Unit]:
    """Numbers in numeric order, then everything else by its text."""
    def key(u: Unit):
        if isinstance(u, bool):
            return (1, str(u), 0.0)
        if isinstance(u, (int, float)):
            return (0, "", float(u))
        return (1, str(u), 0.0)

    return sorted(set(units), key=key)


def first_appearance(items: Iterable) -> list:
    seen: dict = {}
    for x in items:
        seen.setdefault(x, None)
    return list(seen)

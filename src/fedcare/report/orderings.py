"""A paper's orderings checked on a run: one table for every study that has them.

An ordering is one of the paper's findings stated as a comparison of two numbers of this run
("HF-MAML tuned > FedAvg tuned, trained clients"): whether it holds here, the two numbers, and
the p-value of the study's own test of the difference (Mann-Whitney U for the surgical study,
the paired t-test for the face study), with the number of samples or pairs it rests on. The
study says what its numbers and its test are; this module only lays them out the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from fedcare.report.tables import Table


class Ordering(NamedTuple):
    claim: str  # the paper's finding as a comparison, e.g. "FedAvg > ALTV"
    left: float  # the claim's left-hand number on this run
    right: float  # its right-hand number
    holds: bool  # whether the comparison holds on these numbers
    p: float = math.nan  # the study's test of the difference (NaN: none)
    n: int | None = None  # samples or pairs behind `p`


def fmt_p(p: float, n: int | None = None, min_n: int = 0) -> str:
    """A p-value, "NA" when there is none, marked when it rests on fewer than `min_n` samples."""
    if p is None or not math.isfinite(p):
        return "NA"
    text = f"{p:.2e}" if p < 1e-3 else f"{p:.3f}"
    return text + (f" (only {n})" if n is not None and n < min_n else "")


def orderings_table(checks: Sequence[Ordering], *, caption: str, number: Callable[[float], str],
                    test: str = "p", title: str = "The paper's orderings on this run", min_n: int = 0) -> Table:
    """The orderings as a Table (orderings.csv/.md, and in report.html): claim, the two
    numbers (`number` formats them), holds, the test's p (`test` names the column) and n."""
    rows = [[c.claim, number(c.left), number(c.right), "yes" if c.holds else "no", fmt_p(c.p, c.n, min_n),
             "" if c.n is None else str(c.n)] for c in checks]
    return Table(name="orderings", title=title, caption=caption,
                 columns=["Ordering", "Left", "Right", "Holds", test, "n"], rows=rows,
                 csv_header=["ordering", "left", "right", "holds", "p", "n"],
                 csv_rows=[[c.claim, c.left, c.right, c.holds, c.p, "" if c.n is None else c.n] for c in checks])


__all__ = ["Ordering", "fmt_p", "orderings_table"]

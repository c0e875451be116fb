"""Privacy auditing with one training run (Steinke, Nasr & Jagielski, NeurIPS 2023, "Privacy
Auditing with One (1) Training Run", arXiv 2305.08846): a lower bound on epsilon from the run
itself, at a stated confidence.

m canaries are each included in training independently with probability 1/2 (the auditor keeps
the draw). After training every canary has a score (higher: more likely included). The auditor
guesses "in" for the k+ highest scores and "out" for the k- lowest and abstains on the rest:
r = k+ + k- guesses, v of them correct. If training is (eps, delta)-DP with respect to each
canary, the paper's Theorem 3.1 bounds the chance of v or more correct guesses:

    P[V >= v] <= P[Binomial(r, q) >= v] + 2 m delta * max_{i=1..v} P[v > Binomial(r, q) >= v - i] / i,
    q = e^eps / (1 + e^eps).

epsilon-hat is the largest eps whose bound is below 1 - confidence: the run was not (eps, delta)-DP
for any eps below it, unless an event of probability 1 - confidence happened. It is a lower bound:
a weak attack (poorly chosen scores) only makes it small, never wrong. An epsilon-hat above the
accountant's epsilon means the implementation or its accounting is wrong, or that the event of
probability 1 - confidence happened: a run audits many clients and federations, so its verdict
tests every accountant's claim at once (`contradicted`: Bonferroni over the claims), and an honest
run is called unsound with probability at most 1 - confidence.

Choices written down:
- The guesses are symmetric, k+ = k- = r / 2 (the paper's Figure 1 reports both sides). The
  auditor tries a fixed grid of r (`GUESS_GRID`, up to m) and keeps the best: the confidence is
  split over the grid (Bonferroni), so the best of them still holds at the stated confidence.
  The paper's experiments report the best r without the correction.
- Checked against the authors' code (the paper's appendix, as o1_audit.py of
  ubc-systopia/panoramia-privacy-measurement, delta = 0: its delta term is commented out there)
  and Google DeepMind's jax_privacy (`auditing._epsilon_one_run`, delta > 0) in
  tests/privacy/test_one_run.py.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import brentq
from scipy.special import bdtrc, expit, gammaln

# the number of guesses r tried, as fractions of m (each r = 2 k, k >= 1), best kept under Bonferroni
GUESS_GRID = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def p_value(m: int, r: int, v: int, eps: float, delta: float = 0.0) -> float:
    """The paper's bound on P[V >= v] for v correct guesses of r among m canaries under an
    (eps, delta)-DP training (Theorem 3.1 with its delta term)."""
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got m={m}, r={r}, v={v}")
    q = float(expit(eps))
    beta = float(bdtrc(v - 1, r, q)) if v > 0 else 1.0  # P[Binomial(r, q) >= v] (binom.sf, without its overhead)
    if delta == 0 or v == 0:
        return beta
    # P[v > B >= v - i] = pmf(v - 1) + ... + pmf(v - i), i = 1..v (the pmf from log-gammas: scipy's
    # binom.cdf over thousands of points cost 1 ms a call, the search calls it a hundred times)
    k = np.arange(v, dtype=np.float64)
    log_q, log_not_q = -math.log1p(math.exp(-eps)), -eps - math.log1p(math.exp(-eps))  # log q, log(1 - q), stably
    log_pmf = gammaln(r + 1) - gammaln(k + 1) - gammaln(r - k + 1) + k * log_q + (r - k) * log_not_q
    between = np.cumsum(np.exp(log_pmf)[::-1])  # i = 1, ..., v
    alpha = float(np.max(between / np.arange(1, v + 1)))
    return min(1.0, beta + 2 * m * delta * alpha)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float = 0.0, confidence: float = 0.95) -> float:
    """epsilon-hat: the largest eps at which v correct guesses out of r would still have had
    probability at most 1 - confidence under (eps, delta)-DP; 0 when no eps is ruled out."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    significance = 1 - confidence
    if r == 0 or p_value(m, r, v, 0.0, 0.0) >= significance:  # not even eps = 0 is ruled out
        return 0.0

    def gap(eps: float) -> float:  # > 0 while (eps, delta)-DP is ruled out
        return significance - p_value(m, r, v, eps, delta)

    if gap(0.0) <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    while gap(hi) > 0:
        lo, hi = hi, 2 * hi
    return float(brentq(gap, lo, hi, xtol=1e-6))


@dataclass(frozen=True)
class OneRunAudit:
    """The audit of m canaries: r guesses, v correct, epsilon-hat at `confidence` and `delta`;
    `p_value`: how likely guesses this good are under the accountant's (epsilon, delta) claim
    (None without a claim), the test the soundness check makes."""

    m: int
    r: int
    v: int
    epsilon_hat: float
    confidence: float
    delta: float
    p_value: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def guess(scores: np.ndarray, included: np.ndarray, k: int) -> tuple[int, int]:
    """(r, v): "in" for the k highest scores, "out" for the k lowest (ties broken by index:
    the order is the auditor's, fixed before it looks at the bits)."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    included = np.asarray(included, dtype=bool)
    k = min(k, len(order) // 2)
    return 2 * k, int(included[order[:k]].sum() + (~included[order[len(order) - k:]]).sum())


def audit(scores: np.ndarray, included: np.ndarray, delta: float, confidence: float = 0.95,
          epsilon: float | None = None) -> OneRunAudit:
    """The one-run audit of canaries with these scores and inclusion bits: the best epsilon-hat
    over the guess grid, the confidence split over the grid (so the best still holds at
    `confidence`); with the accountant's `epsilon`, the p-value of its claim over the grid
    (Bonferroni: the smallest p times the grid's size)."""
    scores, included = np.asarray(scores, dtype=np.float64), np.asarray(included, dtype=bool)
    if scores.shape != included.shape or scores.ndim != 1:
        raise ValueError(f"one score per canary: {scores.shape} scores, {included.shape} bits")
    m = len(scores)
    claim = epsilon is not None and math.isfinite(epsilon)
    ks = sorted({max(1, int(f * m) // 2) for f in GUESS_GRID} & set(range(1, m // 2 + 1)))
    if not ks:
        return OneRunAudit(m, 0, 0, 0.0, confidence, delta, 1.0 if claim else None)
    split = 1 - (1 - confidence) / len(ks)  # Bonferroni over the grid
    found, p_claim, best = [], 1.0, 0.0
    for k in ks:
        r, v = guess(scores, included, k)
        eps = 0.0
        # no better than a coin rules nothing out; guesses that cannot rule out the best so far even
        # at delta = 0 cannot beat it (the search is skipped)
        if 2 * v > r and (best == 0 or p_value(m, r, v, best, 0.0) < 1 - split):
            eps = epsilon_lower_bound(m, r, v, delta, split)
            best = max(best, eps)
        found.append((eps, r, v))
        if claim and 2 * v > r:
            p_claim = min(p_claim, p_value(m, r, v, epsilon, delta))
    eps, r, v = max(found)  # ties (all 0 among them): the most guesses, the run's overall accuracy
    return OneRunAudit(m, r, v, eps, confidence, delta, min(1.0, p_claim * len(ks)) if claim else None)


def is_sound(epsilon_hat: float, epsilon: float | None) -> bool:
    """Whether the audit agrees with the accountant: epsilon-hat <= epsilon (no epsilon, i.e. no
    DP: nothing to contradict). A small tolerance absorbs the bound's search (1e-6)."""
    return epsilon is None or math.isinf(epsilon) or epsilon_hat <= epsilon + 1e-6


def contradicted(p_values: list[float | None], confidence: float) -> list[bool]:
    """Which accountant claims a run's audits contradict, at `confidence` for the run as a whole:
    a claim falls when its p-value is below (1 - confidence) / the number of claims tested
    (Bonferroni), so an honest run is called unsound with probability at most 1 - confidence
    however many clients and federations it audits."""
    tested = sum(p is not None for p in p_values)
    return [p is not None and p < (1 - confidence) / tested for p in p_values]

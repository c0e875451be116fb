"""The one-run audit of client-level DP (`[privacy.audit] canary_clients = k`), after Andrew,
Kairouz, Oh, Oprea, McMahan & Suriyakumar (ICLR 2024), "One-shot empirical privacy estimation
for federated learning", arXiv 2302.03098.

The server (`fedcare.privacy.client_dp.ClientDPServer`) simulates k canary clients. Canary i's
update is a fixed random direction u_i (uniform on the unit sphere of the shared floating-point
tensors, drawn from (run seed, "canary-clients", i)) at the clipping norm C. Each canary is in the
federation independently with probability 1/2 (run seed, "canary-clients", "included"); an
included one takes part in every round: its C u_i joins the sum of the clipped real updates
before the noise, divided by the same number of replies (a participant like the others, within
the clipping). After each round the auditor takes the cosine between the model's total change
since the first round and every canary's direction. Two numbers from them:

- **epsilon-hat**, a lower bound at a confidence (`fedcare.privacy.one_run`, Steinke et al.): the
  cosines are the scores, the inclusion bits the truth. Valid whatever the model does: with the
  p-value of the accountant's claim, it is what the soundness check tests.
- **the paper's estimate**: the included canaries' cosines fitted by a Gaussian N(mu, s^2),
  against the null distribution of a direction the model never saw, centred at 0 (a uniform
  direction in d dimensions has mean cosine 0 with any fixed vector) with the same spread; the
  estimate is the epsilon at delta of the Gaussian mechanism that separates N(0, s^2) from
  N(mu, s^2) (`estimate`). When the noise dominates the model's change, s^2 = 1/d and mu sqrt(d)
  = sqrt(rounds) / sigma: the estimate approaches the mechanism's exact epsilon, which the RDP
  accountant bounds from above. It is an estimate, not a bound: it can fall either side.
  (Fitting the null's variance 1/d separately from s^2 makes the privacy loss quadratic, and its
  epsilon at delta = 1e-5 then follows the tails of two variance estimates from a few dozen
  canaries: it overshot the exact epsilon 2-fold on pure noise, so the spread is shared.)
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedcare.privacy.one_run import audit
from fedcare.seeding import numpy_rng, torch_generator

CACHED = 1 << 25  # the directions are kept (k d float64 values, 256 MiB at most), else drawn each time
AUDIT_PREFIX = "client_dp_audit_"  # the round's scalars (the federation copies "client_dp_*" into its info)


def estimate(cosines: np.ndarray, delta: float) -> float:
    """The paper's estimate from the included canaries' cosines: a Gaussian N(mu, s^2) fitted to
    them against N(0, s^2), the Gaussian mechanism whose epsilon at `delta` separates them
    (dp-accounting's `get_epsilon_gaussian` at noise s / mu); 0 when mu <= 0."""
    from dp_accounting import get_epsilon_gaussian

    if len(cosines) < 2:
        return math.nan
    mu, s = float(np.mean(cosines)), float(np.std(cosines, ddof=1))
    if mu <= 0:
        return 0.0
    if s == 0:
        return math.inf
    return float(get_epsilon_gaussian(s / mu, delta))


class CanaryClients:
    """k canary clients of one federation: what they add each round, and the audit of their
    cosines with the model's change."""

    def __init__(self, k: int, seed: int, delta: float, confidence: float):
        self.k, self.seed, self.delta, self.confidence = k, seed, delta, confidence
        self.included = numpy_rng(seed, "canary-clients", "included").random(k) < 0.5
        self.start: torch.Tensor | None = None  # the shared floating-point tensors before the first round
        self._directions: dict[int, torch.Tensor] = {}

    def direction(self, i: int, d: int) -> torch.Tensor:
        if i in self._directions:
            return self._directions[i]
        u = torch.randn(d, generator=torch_generator(self.seed, "canary-clients", i), dtype=torch.float64)
        u /= u.norm()
        if self.k * d <= CACHED:  # drawn again each round otherwise (memory over time)
            self._directions[i] = u
        return u

    def added(self, flat: torch.Tensor, clipping_norm: float, replies: int) -> torch.Tensor:
        """`flat` (the averaged update, float64) with the included canaries' C u_i / replies added."""
        if self.start is None:
            raise RuntimeError("canary clients: `begin` before the first round")
        out = flat.clone()
        for i in np.flatnonzero(self.included):
            out += clipping_norm / replies * self.direction(int(i), len(flat))
        return out

    def begin(self, flat: torch.Tensor) -> None:
        if self.start is None:
            self.start = flat.clone()

    def audit(self, flat: torch.Tensor, epsilon: float | None) -> dict[str, float]:
        """After a round: epsilon-hat (the bound), the paper's estimate, m, r, v and the p-value
        of the accountant's claim `epsilon` (NaN without one), as message scalars."""
        change = flat - self.start
        size = float(change.norm())
        d = len(flat)
        cosines = np.array([float(change @ self.direction(i, d)) / size if size > 0 else 0.0 for i in range(self.k)])
        bound = audit(cosines, self.included, self.delta, self.confidence, epsilon)
        return {AUDIT_PREFIX + "epsilon_hat": bound.epsilon_hat,
                AUDIT_PREFIX + "estimate": estimate(cosines[self.included], self.delta),
                AUDIT_PREFIX + "m": float(bound.m), AUDIT_PREFIX + "r": float(bound.r), AUDIT_PREFIX + "v": float(bound.v),
                AUDIT_PREFIX + "confidence": self.confidence,
                AUDIT_PREFIX + "p_value": math.nan if bound.p_value is None else bound.p_value}

"""The one-run audit of client-level DP (`[privacy.audit] canary_clients = k`), after Andrew,
Kairouz, Oh, Oprea, McMahan & Suriyakumar (ICLR 2024), "One-shot empirical privacy estimation
for federated learning", arXiv 2302.03098.

The server (`fedcare.privacy.client_dp.ClientDPServer`) simulates k canary clients. Canary i's
update is a fixed random direction u_i (uniform on the unit sphere of the shared floating-point
tensors, drawn in turn from one generator of (run seed, "canary-clients", "directions")) at the
clipping norm C. Each canary is in the federation independently with probability 1/2 (run
seed, "canary-clients", "included"); an included one takes part in every round: its C u_i
joins the sum of the clipped real updates before the noise, divided by the same number of
replies (a participant like the others, within the clipping). After each round the auditor takes the cosine between the model's total change
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
from collections.abc import Iterator

import numpy as np
import torch

from fedcare.privacy.one_run import audit
from fedcare.seeding import numpy_rng

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
        self._directions: torch.Tensor | None = None  # (k, d), kept when small enough (`CACHED`)

    def _rows(self, d: int) -> Iterator[torch.Tensor]:
        """Every canary's unit direction in d dimensions, in order, from one generator."""
        rng = numpy_rng(self.seed, "canary-clients", "directions")
        for _ in range(self.k):
            u = torch.from_numpy(rng.standard_normal(d))
            yield u / u.norm()

    def directions(self, d: int) -> torch.Tensor | None:
        """The (k, d) directions, drawn once and kept when small enough (`CACHED`); None otherwise
        (they are drawn again each round: memory over time). One draw of k x d normals gives the
        rows `_rows` draws one by one (numpy fills in order)."""
        if self._directions is None and self.k * d <= CACHED:
            u = torch.from_numpy(numpy_rng(self.seed, "canary-clients", "directions").standard_normal((self.k, d)))
            self._directions = u / u.norm(dim=1, keepdim=True)
        return self._directions

    def projections(self, vector: torch.Tensor) -> torch.Tensor:
        """<vector, u_i> for every canary i."""
        kept = self.directions(len(vector))
        if kept is not None:
            return kept @ vector
        return torch.stack([u @ vector for u in self._rows(len(vector))])

    def added(self, flat: torch.Tensor, clipping_norm: float, replies: int) -> torch.Tensor:
        """`flat` (the averaged update, float64) with the included canaries' C u_i / replies added."""
        if self.start is None:
            raise RuntimeError("canary clients: `begin` before the first round")
        weights = torch.from_numpy(self.included.astype(np.float64)) * (clipping_norm / replies)
        kept = self.directions(len(flat))
        if kept is not None:
            return flat + weights @ kept
        out = flat.clone()
        for w, u in zip(weights, self._rows(len(flat))):
            out += w * u
        return out

    def begin(self, flat: torch.Tensor) -> None:
        if self.start is None:
            self.start = flat.clone()

    def audit(self, flat: torch.Tensor, epsilon: float | None) -> dict[str, float]:
        """After a round: epsilon-hat (the bound), the paper's estimate, m, r, v and the p-value
        of the accountant's claim `epsilon` (NaN without one), as message scalars."""
        change = flat - self.start
        size = float(change.norm())
        cosines = (self.projections(change) / size).numpy() if size > 0 else np.zeros(self.k)
        bound = audit(cosines, self.included, self.delta, self.confidence, epsilon)
        return {AUDIT_PREFIX + "epsilon_hat": bound.epsilon_hat,
                AUDIT_PREFIX + "estimate": estimate(cosines[self.included], self.delta),
                AUDIT_PREFIX + "m": float(bound.m), AUDIT_PREFIX + "r": float(bound.r),
                AUDIT_PREFIX + "v": float(bound.v),
                AUDIT_PREFIX + "confidence": self.confidence,
                AUDIT_PREFIX + "p_value": math.nan if bound.p_value is None else bound.p_value}

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
  cosines are the scores, the inclusion bits the truth. Valid whatever the model does: it is
  what the soundness check compares with the accountant's epsilon.
- **the paper's estimate**: the included canaries' cosines fitted by a Gaussian N(mu, s^2),
  against the null distribution of a direction the model never saw, N(0, 1/d) (exact in mean and
  variance for a uniform direction in d dimensions, whatever the model); the estimate is the
  epsilon at delta that separates the two Gaussians (`gaussians_epsilon`). When the noise
  dominates the model's change it approaches the Gaussian mechanism's own epsilon; it is an
  estimate, not a bound: it can fall either side.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.optimize import brentq
from scipy.stats import norm

from fedcare.privacy.one_run import audit, is_sound
from fedcare.seeding import numpy_rng, torch_generator

CACHED = 1 << 25  # the directions are kept (k d float64 values, 256 MiB at most), else drawn each time
AUDIT_PREFIX = "client_dp_audit_"  # the round's scalars (the federation copies "client_dp_*" into its info)


def gaussians_epsilon(mu0: float, s0: float, mu1: float, s1: float, delta: float) -> float:
    """The smallest epsilon such that N(mu0, s0^2) and N(mu1, s1^2) are (epsilon, delta)-
    indistinguishable both ways: delta(eps) = max over the two orders of P[L > eps] - e^eps Q[L > eps],
    L the log-likelihood ratio (a quadratic in x, so its sets are intervals); 0 when delta(0) <= delta."""
    if s0 <= 0 or s1 <= 0:
        return math.inf

    def one_way(m_p: float, s_p: float, m_q: float, s_q: float, eps: float) -> float:
        # {x: log p(x) - log q(x) > eps} = {a x^2 + b x + c > 0}
        a = 1 / (2 * s_q**2) - 1 / (2 * s_p**2)
        b = m_p / s_p**2 - m_q / s_q**2
        c = math.log(s_q / s_p) - m_p**2 / (2 * s_p**2) + m_q**2 / (2 * s_q**2) - eps

        def mass(m: float, s: float) -> float:
            if abs(a) < 1e-12 * max(abs(b), 1e-300):  # equal variances: a half-line
                if b == 0:
                    return 1.0 if c > 0 else 0.0
                t = -c / b
                return float(norm.sf(t, m, s) if b > 0 else norm.cdf(t, m, s))
            disc = b * b - 4 * a * c
            if disc <= 0:
                return 1.0 if a > 0 else 0.0
            lo, hi = sorted(((-b - math.sqrt(disc)) / (2 * a), (-b + math.sqrt(disc)) / (2 * a)))
            inside = float(norm.cdf(hi, m, s) - norm.cdf(lo, m, s))
            return 1.0 - inside if a > 0 else inside

        return mass(m_p, s_p) - math.exp(eps) * mass(m_q, s_q)

    def gap(eps: float) -> float:
        return max(one_way(mu1, s1, mu0, s0, eps), one_way(mu0, s0, mu1, s1, eps)) - delta

    if gap(0.0) <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    while gap(hi) > 0:
        lo, hi = hi, 2 * hi
        if hi > 1e4:
            return math.inf
    return float(brentq(gap, lo, hi, xtol=1e-6))


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
        """After a round: epsilon-hat (the bound), the paper's estimate, m, r, v and whether the
        bound is within `epsilon` (1.0) or above it (0.0), as message scalars."""
        change = flat - self.start
        size = float(change.norm())
        d = len(flat)
        cosines = np.array([float(change @ self.direction(i, d)) / size if size > 0 else 0.0 for i in range(self.k)])
        bound = audit(cosines, self.included, self.delta, self.confidence)
        seen = cosines[self.included]
        estimate = (gaussians_epsilon(0.0, 1 / math.sqrt(d), float(seen.mean()), float(seen.std(ddof=1)), self.delta)
                    if len(seen) >= 2 else math.nan)
        return {AUDIT_PREFIX + "epsilon_hat": bound.epsilon_hat, AUDIT_PREFIX + "estimate": estimate,
                AUDIT_PREFIX + "m": float(bound.m), AUDIT_PREFIX + "r": float(bound.r), AUDIT_PREFIX + "v": float(bound.v),
                AUDIT_PREFIX + "confidence": self.confidence,
                AUDIT_PREFIX + "sound": float(is_sound(bound.epsilon_hat, epsilon))}

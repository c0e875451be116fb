"""The likelihood-ratio attack of membership inference (LiRA, Carlini et al. 2022, "Membership
Inference Attacks From First Principles"), in its offline form.

The attacker trains a few *shadow* models by the target's own protocol on data it holds, none
of which contains the examples it attacks: for each example, the shadow models show how
confident a model is on it when it was *not* trained on it (the "out" distribution). The
target model's confidence on the example is then compared with that distribution: the further
above it, the likelier a member. This calibrates every example on its own (a hard example with
a high loss is no longer mistaken for a non-member), which is what makes LiRA much stronger
than the loss attack at low false-positive rates.

Choices, as the paper makes them unless said:
- Confidence: the logit-scaled probability of the true label, φ = log(p / (1 − p)) (§IV-B:
  it makes the out distribution close to Gaussian). From the per-example loss ℓ = −log p of a
  (binary) cross-entropy task: φ = −ℓ − log(1 − e^(−ℓ)).
- Offline test (§VI-C): one-sided, score = log Pr[Z ≤ φ_target], Z ~ N(μ_out, σ_out²).
- Variance: with few shadow models (the paper: fewer than 64) a per-example variance is
  unreliable and a global one is used (the paper's "fixed variance"); here the pooled
  within-example variance (the mean over examples of each example's variance across shadows),
  which leaves out the spread of the examples' means.
- μ_out: the mean of the shadow confidences (the paper's code takes the median; with 4
  shadows they differ little and the mean is the Gaussian fit).
"""

from __future__ import annotations

import numpy as np
from scipy.stats import norm

MIN_LOSS = 1e-12  # a loss of exactly 0 (float32 underflow) would give an infinite confidence


def logit_confidence(losses: np.ndarray) -> np.ndarray:
    """φ = log(p / (1 − p)) of the true label, from per-example losses ℓ = −log p."""
    loss = np.maximum(np.asarray(losses, np.float64), MIN_LOSS)
    return -loss - np.log(-np.expm1(-loss))


def offline_scores(target: np.ndarray, shadows: np.ndarray) -> np.ndarray:
    """Offline LiRA's membership score of each example (higher: more likely a member):
    log Pr[Z ≤ φ], Z ~ N(μ_out, σ_out²). `target`: (n,) confidences φ of the target model;
    `shadows`: (S, n) confidences of S ≥ 2 shadow models that never trained on the examples."""
    target, shadows = np.asarray(target, np.float64), np.asarray(shadows, np.float64)
    if shadows.ndim != 2 or shadows.shape[0] < 2 or shadows.shape[1] != len(target):
        raise ValueError(f"offline LiRA needs (>= 2 shadow models, {len(target)} examples) confidences, "
                         f"got shape {shadows.shape}")
    mean = shadows.mean(axis=0)
    std = float(np.sqrt(shadows.var(axis=0, ddof=1).mean()))
    return norm.logcdf(target, loc=mean, scale=max(std, 1e-30))

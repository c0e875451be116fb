"""The robust membership inference attack (RMIA; Zarifzadeh, Liu & Shokri, ICML 2024, "Low-Cost
High-Power Membership Inference Attacks"), offline, with one reference model.

For an example x, the likelihood ratio of the target model against the population,
LR(x) = Pr(x | target) / Pr(x), is compared with the same ratio of population examples z the
target never trained on: x's score is the fraction of z it beats, Pr_z[LR(x) / LR(z) > gamma].
Pr(x | model) is the model's probability of x's true label; Pr(x), the probability averaged over
models with and without x, is approximated from reference models that never trained on x (the
paper's offline approximation): Pr(x) = ((1 + a) Pr_out(x) + (1 - a)) / 2. Unlike offline LiRA it
needs no per-example variance, so one reference model is enough.

Choices written down:
- a = 0.3 (`OFFLINE_A`, Privacy Meter's default; the paper tunes it on a reference model);
  gamma = 1 (the paper's default for its AUC).
- Pr(x | model) = exp(-loss) of a cross-entropy task (binary or multi-class): the probability of
  the true label.
"""

from __future__ import annotations

import numpy as np

OFFLINE_A = 0.3
GAMMA = 1.0


def probabilities(losses: np.ndarray) -> np.ndarray:
    """The true label's probability from per-example cross-entropy losses (-log p)."""
    return np.exp(-np.asarray(losses, dtype=np.float64))


def ratios(target: np.ndarray, reference: np.ndarray, a: float = OFFLINE_A) -> np.ndarray:
    """LR = Pr(x | target) / Pr(x), Pr(x) from one reference model's out-probabilities."""
    return np.asarray(target, np.float64) / ((1 + a) / 2 * np.asarray(reference, np.float64) + (1 - a) / 2)


def scores(target: np.ndarray, reference: np.ndarray, population_target: np.ndarray,
           population_reference: np.ndarray, a: float = OFFLINE_A, gamma: float = GAMMA) -> np.ndarray:
    """RMIA's score of each example (higher: more likely a member): the fraction of population
    examples z with LR(x) / LR(z) > gamma. Arguments are true-label probabilities of the
    examples and of the population, under the target and the reference model."""
    x = ratios(target, reference, a)
    z = ratios(population_target, population_reference, a)
    if len(z) == 0:
        raise ValueError("RMIA needs population examples the target never trained on")
    return (x[:, None] / z[None, :] > gamma).mean(axis=1)

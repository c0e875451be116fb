"""Face verification: the true accept rate at a fixed false accept rate (TAR@FAR), from
cosine similarities of embedding pairs (facerec thesis §4.9, Algorithm 7).

The threshold is read from the ROC curve as scikit-learn's `roc_curve` draws it: the point
with the highest TAR whose FAR is at most the one asked for. Of n impostor scores,
k = ⌊FAR·n⌋ may be accepted, so the threshold is the (k+1)-th highest impostor score and a
pair is accepted when its score is strictly above it: exactly k impostors pass (FAR reached =
the one asked for when FAR·n is whole), fewer only when impostor scores tie at the threshold.
(fedcare 0.2.0 took the threshold as numpy's "higher" (1 − FAR) quantile, which accepted one impostor
fewer: FAR 0.099 instead of 0.1 at 1,000 impostor pairs, and a lower TAR.) TAR is the share of
genuine scores strictly above the threshold."""

from __future__ import annotations

import math

import numpy as np
import torch


def tar_at_far(genuine: np.ndarray, impostor: np.ndarray, far: float = 0.1) -> tuple[float, float, float]:
    """(TAR, FAR reached, threshold) for genuine and impostor similarity scores."""
    if not 0 < far < 1:
        raise ValueError(f"far must be in (0, 1), got {far}")
    genuine, impostor = np.asarray(genuine, np.float64), np.asarray(impostor, np.float64)
    if len(genuine) == 0 or len(impostor) == 0:
        return math.nan, math.nan, math.nan
    if not (np.isfinite(genuine).all() and np.isfinite(impostor).all()):  # a diverged model's: no TAR (NA), not 0
        return math.nan, math.nan, math.nan
    accepted = math.floor(far * len(impostor) + 1e-9)  # impostors the FAR allows (1e-9: 0.29 * 100 is 28.999...)
    threshold = float(np.sort(impostor)[len(impostor) - 1 - accepted])
    return float((genuine > threshold).mean()), float((impostor > threshold).mean()), threshold


def all_pairs_tar_at_far(embeddings: torch.Tensor, labels: torch.Tensor, far: float = 0.1) -> dict[str, float]:
    """TAR@FAR over every unordered pair of examples: same label = genuine, different =
    impostor; the score is the cosine similarity (embeddings are normalised here)."""
    e = torch.nn.functional.normalize(embeddings.double(), dim=1)
    similarity = (e @ e.T).numpy()
    y = labels.numpy()
    upper = np.triu_indices(len(y), k=1)
    same = (y[:, None] == y[None, :])[upper]
    scores = similarity[upper]
    tar, reached, threshold = tar_at_far(scores[same], scores[~same], far)
    return {"tar": tar, "far": reached, "threshold": threshold, "genuine_pairs": int(same.sum()),
            "impostor_pairs": int((~same).sum())}


def sample_pairs(labels: np.ndarray, rng: np.random.Generator, genuine: int = 1000,
                 impostor: int = 1000, pool: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The thesis's Algorithm 7 pairs over one client's test set: `genuine` draws of an image
    d (among those whose identity has another image) with a different image e of the same
    identity, and `impostor` draws of d with an image e of another identity: from the same
    set ("local testing"), or from `pool`, the labels of another set ("global testing"; e then
    indexes the pool, whose labels are comparable with `labels`). Drawn with replacement, so a
    pair can repeat (the thesis draws 1,000 of each whatever the set's size). Returns (genuine
    pairs, impostor pairs), each an (n, 2) array of indices; empty when there is no such pair."""
    y = np.asarray(labels)
    idx = np.arange(len(y))
    same = y[:, None] == y[None, :]
    partners = same.sum(axis=1) - 1

    def draw(count: int, candidates: np.ndarray, partners_of) -> np.ndarray:
        if len(candidates) == 0:
            return np.zeros((0, 2), np.int64)
        d = rng.choice(candidates, size=count)
        e = np.array([rng.choice(partners_of(i)) for i in d])
        return np.stack([d, e], axis=1).astype(np.int64)

    genuine_pairs = draw(genuine, idx[partners > 0], lambda i: np.flatnonzero(same[i] & (idx != i)))
    if pool is None:
        return genuine_pairs, draw(impostor, idx[partners < len(y) - 1], lambda i: np.flatnonzero(~same[i] & (idx != i)))
    pool = np.asarray(pool)
    has_other = np.array([(pool != label).any() for label in y], bool)
    return genuine_pairs, draw(impostor, idx[has_other], lambda i: np.flatnonzero(pool != y[i]))


def pairs_tar_at_far(embeddings: torch.Tensor, genuine: np.ndarray, impostor: np.ndarray,
                     far: float = 0.1) -> dict[str, float]:
    """TAR@FAR from the cosine similarities of the given index pairs (`sample_pairs`)."""
    e = torch.nn.functional.normalize(embeddings.double(), dim=1).numpy()

    def scores(pairs: np.ndarray) -> np.ndarray:
        return (e[pairs[:, 0]] * e[pairs[:, 1]]).sum(axis=1)

    tar, reached, threshold = tar_at_far(scores(genuine), scores(impostor), far)
    return {"tar": tar, "far": reached, "threshold": threshold}

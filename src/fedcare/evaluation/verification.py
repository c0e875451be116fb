"""Face verification: the true accept rate at a fixed false accept rate (TAR@FAR), from
cosine similarities of embedding pairs (facerec thesis §4.9, Algorithm 7).

The threshold is the (1 − FAR) quantile of the impostor scores (the thesis's t_0.1 for
FAR = 0.1: the 90th percentile), taken as an impostor score itself (numpy's "higher"
quantile), so the FAR actually reached, the share of impostor scores strictly above the
threshold, is at most `far`; TAR is the share of genuine scores strictly above it."""

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
    threshold = float(np.quantile(impostor, 1.0 - far, method="higher"))
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

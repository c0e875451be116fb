"""The metrics a client computes on its own data and sends back (never its data or predictions).

Each study asks for one kind by name, so a site can compute it without knowing the study:
- "loss": the mean task loss and the example count (validation under early stopping);
- "binary": the pain study's test metrics (ACC, PR-AUC, F1, ... of `binary_metrics`);
- "accuracy": multiclass accuracy (FedHealth 2).
"""

from __future__ import annotations

import torch

from fedcare.algorithms.training import ClientData
from fedcare.evaluation.metrics import binary_metrics

METRIC_KINDS = ("loss", "binary", "accuracy")


def client_metrics(kind: str, probabilities: torch.Tensor, loss: float, data: ClientData) -> dict:
    out = {"loss": loss, "n": len(data)}
    if kind == "loss":
        return out
    if kind == "binary":
        return {**out, **binary_metrics(data.y.numpy(), probabilities.numpy())}
    if kind == "accuracy":
        correct = (probabilities.argmax(dim=1) == data.y).float().mean().item() if len(data) else float("nan")
        return {**out, "accuracy": correct}
    raise ValueError(f"unknown metrics kind {kind!r}: choose one of {', '.join(METRIC_KINDS)}")

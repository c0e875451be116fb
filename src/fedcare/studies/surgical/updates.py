"""The thesis's training statistics (§4.2.2), measured by the server on every aggregation.

With w_t the global model a round started from, w_k the model client k sent back and
w_{t+1} the new global model (after the server's AdamW step):

    CosSim_k  = cos(w_k − w_t, w_{t+1} − w_t)      the client's update against the global update
    GradDiff_k = ‖w_k − w_{t+1}‖²                   how far the client's model lies from the new global one

and, for the round as a whole (as shares of the norm of w_t),

    server_step  = ‖w_{t+1} − w_t‖ / ‖w_t‖            how far the server moved the global model
    mean_update  = ‖Σ_k n_k (w_k − w_t) / Σ_k n_k‖ / ‖w_t‖   how far the clients' weighted average moved it

Their ratio is what the server's optimizer adds: with the thesis's AdamW at a constant learning
rate the step does not shrink with the clients' updates (Adam divides by their running size),
which is why the FL losses keep moving after the local learning rate has annealed.

All run over every floating-point tensor the clients send (FedRep: the shared body only,
the thesis's φ), in float64, in sorted tensor-name order. The thesis's ω_{t+1} is read as the
new global model, as its notation says; with the server's AdamW that is the optimizer's step,
not the plain weighted average. The report takes their WAVG over clients (weights: training
frames). CosSim is NaN when either update is zero.

`UpdateStatistics` is a `Federation.observer`: it runs where aggregation runs (in this
process or on the Flower ServerApp), on the messages alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from fedcare.algorithms.base import NUM_EXAMPLES, ClientId
from fedcare.algorithms.messages import Message


def update_statistics(before: Message, replies: Mapping[ClientId, Message], after: Message) -> dict[ClientId, dict]:
    """{client: {"cossim", "graddiff", "n"}} for one aggregation (see the module docstring)."""
    return _statistics(before, replies, after)[0]


def server_statistics(before: Message, replies: Mapping[ClientId, Message], after: Message) -> dict[str, float]:
    """{"server_step", "mean_update"} of one aggregation (see the module docstring)."""
    return _statistics(before, replies, after)[1]


def _statistics(before: Message, replies: Mapping[ClientId, Message], after: Message) -> tuple[dict, dict]:
    names = sorted(n for n, t in after.tensors.items()
                   if t.is_floating_point() and n in before.tensors and all(n in r.tensors for r in replies.values()))
    clients = sorted(replies)
    dot = {c: 0.0 for c in clients}
    local = {c: 0.0 for c in clients}
    diff = {c: 0.0 for c in clients}
    n = {c: float(replies[c].scalars.get(NUM_EXAMPLES, math.nan)) for c in clients}
    total = sum(n.values())
    step = start = average = 0.0
    for name in names:
        w0 = before.tensors[name].double()
        w1 = after.tensors[name].double()
        g = w1 - w0
        step += float((g * g).sum())
        start += float((w0 * w0).sum())
        mean = torch.zeros_like(w0)
        for c in clients:
            wk = replies[c].tensors[name].double()
            u = wk - w0
            dot[c] += float((u * g).sum())
            local[c] += float((u * u).sum())
            diff[c] += float(((wk - w1) ** 2).sum())
            mean += u * (n[c] / total if total else math.nan)
        average += float((mean * mean).sum())
    out = {}
    for c in clients:
        norm = math.sqrt(local[c] * step)
        out[c] = {"cossim": dot[c] / norm if norm > 0 else math.nan, "graddiff": diff[c], "n": n[c]}
    size = math.sqrt(start)
    server = {"server_step": math.sqrt(step) / size if size > 0 else math.nan,
              "mean_update": math.sqrt(average) / size if size > 0 else math.nan}
    return out, server


class UpdateStatistics:
    """Observer of a federation's aggregations: `last` holds the latest round's per-client
    statistics, `server` its whole-round ones."""

    def __init__(self) -> None:
        self.last: dict[ClientId, dict] = {}
        self.server: dict[str, float] = {}

    def __call__(self, before: Message, replies: Mapping[ClientId, Message], after: Message) -> None:
        self.last, self.server = _statistics(before, replies, after)

"""The thesis's training statistics (§4.2.2), measured by the server on every aggregation.

With w_t the global model a round started from, w_k the model client k sent back and
w_{t+1} the new global model (after the server's AdamW step):

    CosSim_k  = cos(w_k − w_t, w_{t+1} − w_t)      the client's update against the global update
    GradDiff_k = ‖w_k − w_{t+1}‖²                   how far the client's model lies from the new global one

Both run over every floating-point tensor the clients send (FedRep: the shared body only,
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

from fedcare.algorithms.base import NUM_EXAMPLES, ClientId
from fedcare.algorithms.messages import Message


def update_statistics(before: Message, replies: Mapping[ClientId, Message], after: Message) -> dict[ClientId, dict]:
    """{client: {"cossim", "graddiff", "n"}} for one aggregation (see the module docstring)."""
    names = sorted(n for n, t in after.tensors.items()
                   if t.is_floating_point() and n in before.tensors and all(n in r.tensors for r in replies.values()))
    clients = sorted(replies)
    dot = {c: 0.0 for c in clients}
    local = {c: 0.0 for c in clients}
    diff = {c: 0.0 for c in clients}
    step = 0.0
    for name in names:
        w0 = before.tensors[name].double()
        w1 = after.tensors[name].double()
        g = w1 - w0
        step += float((g * g).sum())
        for c in clients:
            wk = replies[c].tensors[name].double()
            u = wk - w0
            dot[c] += float((u * g).sum())
            local[c] += float((u * u).sum())
            diff[c] += float(((wk - w1) ** 2).sum())
    out = {}
    for c in clients:
        norm = math.sqrt(local[c] * step)
        out[c] = {"cossim": dot[c] / norm if norm > 0 else math.nan, "graddiff": diff[c],
                  "n": float(replies[c].scalars.get(NUM_EXAMPLES, math.nan))}
    return out


class UpdateStatistics:
    """Observer of a federation's aggregations; `last` holds the latest round's statistics."""

    def __init__(self) -> None:
        self.last: dict[ClientId, dict] = {}

    def __call__(self, before: Message, replies: Mapping[ClientId, Message], after: Message) -> None:
        self.last = update_statistics(before, replies, after)

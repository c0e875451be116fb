"""q-FedAvg (Li, Sanjabi, Beirami, Smith, "Fair Resource Allocation in Federated Learning",
ICLR 2020), the facerec thesis's fairness baseline ("Fair"; its §2.5, Algorithm 3).

Client k receives w^t, evaluates its training loss there, F_k(w^t) (before any local
training, on all of its training data, model in inference mode: the function w^t defines;
the settings' batch loss, so a study's own loss such as an ArcFace head counts),
runs E epochs of SGD as FedAvg does to get w_k, and sends w_k with F_k(w^t) under the scalar
`LOSS_AT_GLOBAL` (its usual `train_loss`, the last local epoch's mean, still goes along for
the runtime's round log). The server, with L the Lipschitz estimate:

    Δ_k = L (w^t − w_k)
    h_k = q F_k^{q−1} ‖Δ_k‖² + L F_k^q
    w^{t+1} = w^t − Σ_k F_k^q Δ_k / Σ_k h_k

‖·‖² is the squared norm over every floating-point shared tensor at once (q-FFL's norm_grad;
the thesis prints ‖Δw‖ without the square, the reference note flags that as a slip).
F_k is the loss + 1e-10, as the authors' code and Flower add. Integer tensors
(`num_batches_tracked`) take the plain (weighted) average. q = 0 gives the uniform average
(FedAvg) exactly. Defaults: q = 0.001, L = 100 (facerec thesis; L = 1/client lr, i.e. lr 0.01).

`weighting`: "uniform" (default) sums over the participating clients unweighted, as q-FFL's
Algorithm 3 (which samples clients with probability p_k instead), its code (p_k uniform),
Flower and FedLab do; "examples" scales Δ_k and h_k by p_k = n_k / n, the full-participation
form of the objective Σ_k p_k F_k^{q+1} / (q + 1).

How Flower 1.41 and FedLab differ from this definition
------------------------------------------------------
- **Flower's `QFedAvg`** runs the same server formula on whatever loss the client put under
  `train_loss` (its `train_loss_key`): the strategy does not say at which weights the loss
  is taken, and the name (and Flower's quickstart ClientApps, which report the mean loss of
  local training) points to the loss *during* local training, not F_k(w^t) as q-FFL
  defines it. So with Flower the definition of F_k is left to the client; here the client
  half fixes it. Its L is `1 / client_learning_rate`. It also applies the
  update to every array, integer ones included (num_batches_tracked becomes a float and its
  L·(n_t − n_k) enters ‖Δ_k‖²). Given the same F_k, L and only floating-point tensors, its
  aggregate equals ours (tests/algorithms/test_server_optimizers.py checks it to 1e-6).
- **FedLab's `qFedAvgClientTrainer`** computes Δ_k and h_k on the client from `ret_loss`,
  the **sum** of the batch losses of the **last local epoch** (reset each epoch, accumulated
  while the weights move), instead of the mean loss at w^t; L is 1/lr; only
  `model.parameters()` are exchanged (no buffers). Its server sums Δ_k / Σh unweighted,
  as here. Because the sum scales with the number of batches, F_k^q and h_k there depend on
  the client's data size and batch size, not just its loss.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

from fedcare.algorithms.base import Algorithm, ClientHalf, ClientId, ServerHalf
from fedcare.algorithms.messages import ClientState, Message
from fedcare.algorithms.split import SHARE_ALL, ParameterSplit
from fedcare.algorithms.training import ClientData, Randomness, TrainSettings, as_float
from fedcare.device import autocast, device_of

LOSS_AT_GLOBAL = "loss_at_global"  # F_k(w^t): the client's training loss at the model it received
EPSILON = 1e-10  # added to the loss before powers, as the q-FFL code and Flower do

DEFAULT_Q = 0.001  # facerec thesis §2.5
DEFAULT_LIPSCHITZ = 100.0  # facerec thesis §2.5


@torch.no_grad()
def loss_at(model: nn.Module, data: ClientData, settings: TrainSettings, batch_size: int = 512) -> float:
    """F_k(w): the settings' training loss (the task's, or the study's own such as an ArcFace
    head's) over all of `data`, example-weighted, in inference mode (BatchNorm statistics
    untouched). Not `predict`'s evaluation loss: an embedding task has none (NaN)."""
    was_training = model.training
    model.eval()
    loss_fn = settings.batch_loss(data)
    total, device = 0.0, device_of(model)
    for i in range(0, len(data), batch_size):
        x, y = as_float(data.x[i : i + batch_size].to(device)), data.y[i : i + batch_size].to(device)
        with autocast(device, settings.precision):
            total += float(loss_fn(model, x, y)) * len(y)
    model.train(was_training)
    return total / len(data) if len(data) else math.nan


class QFedAvgClient(ClientHalf):
    """FedAvg's client plus F_k(w^t), measured before training."""

    batched_fit = False  # a fit of its own: not the library's to batch over clients

    def fit(
        self, model: nn.Module, message: Message, state: ClientState, data: ClientData, rng: Randomness
    ) -> tuple[Message, ClientState]:
        self.load(model, message, state)
        loss_at_global = loss_at(model, data, self.settings)
        reply, new_state = super().fit(model, message, state, data, rng)
        reply.scalars[LOSS_AT_GLOBAL] = float(loss_at_global)
        return reply, new_state


class QFedAvgServer(ServerHalf):
    needs = "each"  # weighs each update by its client's loss at the global model

    def __init__(
        self,
        q: float = DEFAULT_Q,
        lipschitz: float = DEFAULT_LIPSCHITZ,
        weighting: str = "uniform",
        split: ParameterSplit = SHARE_ALL,
        loss_key: str = LOSS_AT_GLOBAL,
    ):
        super().__init__(split, weighting)
        if not q >= 0:
            raise ValueError(f"q must be >= 0, got {q}")
        if not lipschitz > 0:
            raise ValueError(f"lipschitz must be positive, got {lipschitz}")
        self.q = float(q)
        self.lipschitz = float(lipschitz)
        self.loss_key = loss_key

    def reply_problem(self, reply: Message) -> str | None:
        """F_k(w^t), the client's loss at the global model: present, and not negative."""
        if self.loss_key not in reply.scalars:
            return f"no {self.loss_key} (q-FedAvg weighs each update by it)"
        return None if reply.scalars[self.loss_key] >= 0 else f"{self.loss_key} is {reply.scalars[self.loss_key]:g}"

    def aggregate(self, current: Message, replies: Mapping[ClientId, Message]) -> Message:
        plain = super().aggregate(current, replies)  # integer tensors keep the average
        if not replies or plain is current:
            return plain
        floats = [n for n, t in current.tensors.items() if t.is_floating_point()]
        if not floats:
            return plain
        q, L = self.q, self.lipschitz
        p = self.weights(replies) if self.weighting == "examples" else {c: 1.0 for c in replies}
        w = {n: current.tensors[n].double() for n in floats}
        sum_delta = {n: torch.zeros_like(w[n]) for n in floats}
        sum_h = 0.0
        for client in sorted(replies):  # a fixed order: float sums depend on it
            reply = replies[client]
            if self.loss_key not in reply.scalars:
                raise KeyError(f"client {client!r} sent no {self.loss_key!r}: q-FedAvg needs F_k(w^t)")
            loss = float(reply.scalars[self.loss_key]) + EPSILON
            if not loss > 0:
                raise ValueError(f"client {client!r}: q-FedAvg needs a positive loss, got {loss - EPSILON}")
            delta = {n: L * (w[n] - reply.tensors[n].double()) for n in floats}
            norm2 = sum(float(d.pow(2).sum()) for d in delta.values())
            fq = loss**q
            h = q * loss ** (q - 1) * norm2 + L * fq
            for n in floats:
                sum_delta[n] += (p[client] * fq) * delta[n]
            sum_h += p[client] * h
        tensors = dict(plain.tensors)
        for n in floats:
            tensors[n] = (w[n] - sum_delta[n] / sum_h).to(current.tensors[n].dtype)
        return Message(tensors, dict(plain.scalars))


def qfedavg(
    settings: TrainSettings,
    q: float = DEFAULT_Q,
    lipschitz: float = DEFAULT_LIPSCHITZ,
    weighting: str = "uniform",
    split: ParameterSplit = SHARE_ALL,
) -> Algorithm:
    """q-FedAvg with the facerec thesis's q = 0.001 and L = 100 by default; `split` chooses
    the shared tensors (e.g. keep an ArcFace head private)."""
    return Algorithm("qfedavg", QFedAvgClient(settings, split), QFedAvgServer(q, lipschitz, weighting, split))


"""Simulated attackers (`[robustness.attack]`, docs/robustness.md): chosen clients that train
as usual and then send a poisoned update, so a study shows what a robust rule
(`fedcare.algorithms.robust`) buys against them. A simulation option: a deployed site runs
its own code, so `fedcare flower run` refuses the table.

- "sign_flip": the update u = reply - received is sent as received - scale * u;
- "scaled_update": as received + scale * u (a boosted update, model replacement);
- "label_flip": the client trains on flipped labels (binary and multi-label: 1 - y;
  multiclass: C - 1 - y, C the model's output width) and sends what it learnt.

Only the model's trainable parameters are poisoned; its buffers (BatchNorm's statistics) are
sent as trained, since a flipped variance would be negative and stop the run rather than
poison it. An attacker's own evaluation and fine-tuning use its true data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch
from torch import nn

from fedcare.algorithms.base import Algorithm, ClientHalf, DelegatingClient
from fedcare.algorithms.messages import ClientState, Message
from fedcare.algorithms.training import ClientData, Randomness, as_float
from fedcare.config import Attack
from fedcare.device import device_of
from fedcare.errors import UserError
from fedcare.tasks import BinaryTask, MulticlassTask, MultilabelTask


class AttackError(UserError, ValueError):
    """An attack that cannot apply to this experiment; the message says why."""


class AttackingClient(DelegatingClient):
    """`inner`, except that the clients of `attack` poison what they send."""

    def __init__(self, inner: ClientHalf, attack: Attack):
        super().__init__(inner)
        self.attackers = frozenset(map(str, attack.clients))  # ids compared as text: 3 and "3" are one client
        self.kind, self.scale = attack.kind, attack.effective_scale

    def fit(self, model: nn.Module, message: Message, state: ClientState, data: ClientData,
            rng: Randomness) -> tuple[Message, ClientState]:
        if str(rng.client) not in self.attackers:
            return self.inner.fit(model, message, state, data, rng)
        if self.kind == "label_flip":
            return self.inner.fit(model, message, state, flipped_labels(data, model, self.settings.task), rng)
        reply, new_state = self.inner.fit(model, message, state, data, rng)
        factor = -self.scale if self.kind == "sign_flip" else self.scale
        trainable = {name for name, _ in model.named_parameters()}
        tensors = dict(reply.tensors)
        for name, sent in reply.tensors.items():
            received = message.tensors.get(name)
            if name in trainable and received is not None and sent.is_floating_point():
                update = sent.double() - received.double()
                tensors[name] = (received.double() + factor * update).to(sent.dtype)
        return Message(tensors, dict(reply.scalars)), new_state


def check_flippable(task: object) -> None:
    """Refuse a label flip for a task without class labels (an embedding's identities)."""
    if not isinstance(task, (BinaryTask, MulticlassTask, MultilabelTask)):
        raise AttackError(f"robustness.attack: label_flip needs class labels, and this study's task "
                          f"({getattr(task, 'name', type(task).__name__)}) has none to flip (an identity has no "
                          f"opposite); use sign_flip or scaled_update")


def flipped_labels(data: ClientData, model: nn.Module, task: object) -> ClientData:
    """`data` with its labels flipped (see the module docstring), the rest of it as it was."""
    check_flippable(task)
    y = output_width(model, data) - 1 - data.y if isinstance(task, MulticlassTask) else 1 - data.y
    return dataclasses.replace(data, y=y) if dataclasses.is_dataclass(data) else ClientData(data.x, y)


def output_width(model: nn.Module, data: ClientData) -> int:
    """The number of classes a multiclass model scores (its output's width on one example)."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        width = model(as_float(data.x[:1]).to(device_of(model))).shape[1]
    model.train(was_training)
    return int(width)


def attacking_algorithm(algorithm: Algorithm, attack: Attack | None) -> Algorithm:
    """`algorithm` whose attacking clients poison their replies (None: unchanged)."""
    if attack is None or algorithm.pooled:  # centralized: no client sends an update
        return algorithm
    if attack.kind == "label_flip":
        check_flippable(algorithm.client.settings.task)
    return dataclasses.replace(algorithm, client=AttackingClient(algorithm.client, attack))


def unknown_attackers(attack: Attack | None, clients: Iterable[object]) -> str | None:
    """Why `attack` cannot run among `clients` (None: it can)."""
    if attack is None:
        return None
    known = {str(c) for c in clients}
    missing = [c for c in attack.clients if str(c) not in known]
    if not missing:
        return None
    return (f"robustness.attack.clients: {', '.join(map(str, missing))} not among this experiment's clients "
            f"({', '.join(sorted(known, key=lambda c: (len(c), c)))})")

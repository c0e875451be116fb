"""The in-process simulator: one working model, the server half, and every client's state.

Clients train one after another on the single working model (no per-client model copies, the
memory trap of PFLlib#130): before a client runs, its model is assembled from the global
message and its private state; afterwards its new private state is read back out.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from fedcare.algorithms.base import TRAIN_LOSS, Algorithm, ClientId
from fedcare.algorithms.messages import ClientState, Message, clone_state
from fedcare.algorithms.training import ClientData, Randomness, predict
from fedcare.seeding import numpy_rng

POOLED = "pooled"


@dataclass
class PhaseResult:
    rounds: int
    best_round: int
    best_val_loss: float
    history: list[dict] = field(default_factory=list)


class Federation:
    def __init__(self, model: nn.Module, algorithm: Algorithm, seed: int, *, client_fraction: float = 1.0):
        if not 0 < client_fraction <= 1:
            raise ValueError(f"client_fraction must be in (0, 1], got {client_fraction}")
        self.model = model
        self.algorithm = algorithm
        self.seed = seed
        self.client_fraction = client_fraction
        self.server = algorithm.server  # its state (optimizer moments, FedAP weights) is snapshotted too
        self.global_message = self.server.initial_message(model)
        self._initial_state = algorithm.client.init_state(model)
        self.states: dict[ClientId, ClientState] = {}

    def state_of(self, client: ClientId) -> ClientState:
        if client not in self.states:
            self.states[client] = clone_state(self._initial_state)
        return self.states[client]

    def sample(self, phase: str, rnd: int, clients: list[ClientId]) -> list[ClientId]:
        """Clients for this round: all by default, else a fraction drawn from its own generator."""
        ordered = sorted(clients)
        if self.client_fraction >= 1:
            return ordered
        m = max(1, round(self.client_fraction * len(ordered)))
        picked = numpy_rng(self.seed, phase, rnd, "sampling").choice(len(ordered), size=m, replace=False)
        return [ordered[i] for i in sorted(picked)]

    def message_for(self, client: ClientId) -> Message:
        return self.server.message_for(client, self.global_message)

    def run_setup(self, phase: str, data: Mapping[ClientId, ClientData]) -> None:
        """The algorithm's one-off setup exchange (a round 0), for the clients holding `data`."""
        client = self.algorithm.client
        replies = {}
        for cid in sorted(data):
            rng = Randomness(self.seed, phase, cid, 0)
            reply = client.setup(self.model, self.message_for(cid), self.state_of(cid), data[cid], rng)
            if reply is not None:
                replies[cid] = reply
        answers = self.server.setup(replies) if replies else None
        for cid, answer in sorted((answers or {}).items()):
            self.states[cid] = client.receive_setup(answer, self.state_of(cid))

    def run_round(self, phase: str, rnd: int, train: Mapping[ClientId, ClientData]) -> dict:
        client = self.algorithm.client
        participants = self.sample(phase, rnd, list(train))
        replies: dict[ClientId, Message] = {}
        for cid in participants:
            rng = Randomness(self.seed, phase, cid, rnd)
            replies[cid], self.states[cid] = client.fit(self.model, self.message_for(cid), self.state_of(cid), train[cid], rng)
        self.global_message = self.server.aggregate(self.global_message, replies)
        for cid in participants:
            rng = Randomness(self.seed, phase, cid, rnd)
            self.states[cid] = client.after_aggregation(self.model, self.message_for(cid), self.states[cid], train[cid], rng)
        n = sum(len(train[c]) for c in participants)
        loss = sum(replies[c].scalars[TRAIN_LOSS] * len(train[c]) for c in participants) / max(n, 1)
        return {"train_loss": loss, "clients": len(participants), "n_train": n}

    def personal_model(self, client: ClientId) -> nn.Module:
        """The model this client would actually use: shared parts + its own private parts."""
        return self.algorithm.client.load(self.model, self.message_for(client), self.state_of(client))

    def predict(self, client: ClientId, data: ClientData) -> tuple[torch.Tensor, float]:
        return predict(self.personal_model(client), data)

    def validation_loss(self, val: Mapping[ClientId, ClientData]) -> tuple[float, int]:
        """Example-weighted mean validation loss over the clients that hold validation data."""
        total, n = 0.0, 0
        for cid in sorted(val):
            if len(val[cid]):
                _, loss = self.predict(cid, val[cid])
                total += loss * len(val[cid])
                n += len(val[cid])
        return (total / n if n else float("nan")), n

    def snapshot(self) -> tuple:
        states = {c: clone_state(s) for c, s in self.states.items()}
        return self.global_message.clone(), states, copy.deepcopy(self.server)

    def restore(self, snap: tuple) -> None:
        message, states, server = snap
        self.global_message = message.clone()
        self.states = {c: clone_state(s) for c, s in states.items()}
        self.server = copy.deepcopy(server)

    def train_phase(
        self,
        phase: str,
        train: Mapping[ClientId, ClientData],
        val: Mapping[ClientId, ClientData],
        *,
        max_rounds: int,
        patience: int,
        on_round: Callable[[dict], None] | None = None,
    ) -> PhaseResult:
        """Rounds until the weighted validation loss has not improved for `patience` rounds,
        then restore the best round's global message and every client's best private state.
        Centralized algorithms see one participant holding all the training data."""
        if self.algorithm.pooled:
            train = {POOLED: ClientData.concat(train[c] for c in sorted(train))} if train else {}
        result = PhaseResult(rounds=0, best_round=0, best_val_loss=math.inf)
        best = None
        for rnd in range(1, max_rounds + 1):
            info = self.run_round(phase, rnd, train)
            info["val_loss"], info["n_val"] = self.validation_loss(val)
            info["round"] = rnd
            result.rounds = rnd
            result.history.append(info)
            if on_round:
                on_round(info)
            if not math.isnan(info["val_loss"]) and info["val_loss"] < result.best_val_loss:
                result.best_val_loss, result.best_round = info["val_loss"], rnd
                best = self.snapshot()
            elif math.isnan(info["val_loss"]):
                best = self.snapshot()  # no validation data: keep the latest model
                result.best_round = rnd
            elif rnd - result.best_round >= patience:
                break
        if best is not None:
            self.restore(best)
        return result

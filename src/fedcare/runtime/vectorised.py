"""In-process clients trained many at a time (`fedcare.algorithms.vectorised.train_stacked`):
`LocalClients` whose fit, and PFDL's fine-tuning of the private layers, step up to `chunk`
clients in one batched step. For many clients with small models (the 1,000-client regime,
benchmarks/many_clients.py); the numbers equal `LocalClients`' to float tolerance, not bit for
bit, so no study uses it by default.

A client half it cannot batch (its own `fit`, settings `vectorisable` refuses, a model with
dropout) runs one client after another, as in `LocalClients`.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn

from fedcare.algorithms.base import ClientHalf, ClientId
from fedcare.algorithms.messages import Message
from fedcare.algorithms.pfdl import PFDLClient
from fedcare.algorithms.split import load_tensors
from fedcare.algorithms.training import Randomness
from fedcare.algorithms.vectorised import train_stacked, vectorisable
from fedcare.runtime.clients import DataResolver, LocalClients, Work


class VectorisedClients(LocalClients):
    def __init__(self, model: nn.Module, half: ClientHalf, seed: int, resolve: DataResolver | None = None,
                 chunk: int = 64):
        super().__init__(model, half, seed, resolve)
        self.chunk = chunk
        self.why_not = vectorisable(half.settings, model)  # None: batched
        if self.why_not is None and type(half).fit is not ClientHalf.fit:
            self.why_not = f"{type(half).__name__} trains by its own fit"

    def _chunks(self, work: Work) -> Iterator[list[tuple[ClientId, Message, object]]]:
        items = [(c, m, d) for c, (m, d) in sorted(work.items())]
        for i in range(0, len(items), self.chunk):
            yield items[i:i + self.chunk]

    def fit(self, phase: str, rnd: int, work: Work) -> dict[ClientId, Message]:
        if self.why_not is not None:
            return super().fit(phase, rnd, work)
        replies = {}
        for chunk in self._chunks(work):  # ClientHalf.fit, for `chunk` clients at once
            starts = []
            for c, message, _ in chunk:
                self.half.load(self.model, message, self.runner(c).state).train()
                starts.append({k: v.clone() for k, v in self.model.state_dict().items()})
            data = [self.data(c, d) for c, _, d in chunk]
            generators = [Randomness(self.seed, phase, c, rnd).torch("fit-order") for c, _, _ in chunk]
            trained, losses = train_stacked(self.model, starts, data, self.half.settings, generators)
            for (c, _, _), state, loss, d in zip(chunk, trained, losses, data):
                load_tensors(self.model, state)
                replies[c], self.runner(c).state = self.half.outgoing(self.model, len(d), loss)
        return replies

    def after_aggregation(self, phase: str, rnd: int, work: Work) -> None:
        half = self.half
        if self.why_not is not None or type(half) is not PFDLClient:
            return super().after_aggregation(phase, rnd, work)
        for chunk in self._chunks(work):  # PFDLClient.after_aggregation, for `chunk` clients at once
            starts = []
            for c, message, _ in chunk:
                half.load(self.model, message, self.runner(c).state).train()
                starts.append({k: v.clone() for k, v in self.model.state_dict().items()})
            data = [self.data(c, d) for c, _, d in chunk]
            generators = [Randomness(self.seed, phase, c, rnd).torch("finetune-order") for c, _, _ in chunk]
            with half.frozen_shared(self.model) as private:  # the shared blocks: the global message's, alike for all
                trained, _ = train_stacked(self.model, starts, data, half.settings, generators,
                                           epochs=half.finetune_epochs, lr=half.finetune_lr, trainable=private,
                                           common=set(half.split.shared_keys(self.model)))
            for (c, _, _), state in zip(chunk, trained):
                load_tensors(self.model, state)
                self.runner(c).state = half.split.private_tensors(self.model)

"""In-process clients trained many at a time (`fedcare.algorithms.vectorised.train_stacked`):
`LocalClients` whose fit, and PFDL's fine-tuning of the private layers, step up to `chunk`
clients in one batched step. For many clients with small models (the 1,000-client regime,
benchmarks/many_clients.py); the numbers equal `LocalClients`' to float tolerance, not bit for
bit, so no study uses it by default.

What it batches, a client half declares (`ClientHalf.batched_fit`, and `batched_finetune`:
PFDL's fine-tuning of its private part after aggregation). A client half it cannot batch (its
own `fit`, settings `vectorisable` refuses, a model with dropout) runs one client after
another, as in `LocalClients`.

A declared fine-tuning (PFDL's) runs the frozen shared blocks forward on every batch of every
epoch; when the model declares how its forward splits (`forward(x) = forward_head(features(x))`,
e.g. `PainCNN`) and the shared part is exactly `features`, each client's features are computed
once per fine-tuning instead (frozen blocks in inference mode: an example's features do not
depend on its batch) and only the head trains on them, many clients at a time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import nn

from fedcare.algorithms.base import ClientHalf, ClientId
from fedcare.algorithms.messages import Message
from fedcare.algorithms.split import load_tensors
from fedcare.algorithms.training import ClientData, Randomness, TrainingDiverged, as_float, check_finite
from fedcare.algorithms.vectorised import train_stacked, vectorisable
from fedcare.device import device_of
from fedcare.runtime.clients import DataResolver, LocalClients, Work, diverges_as


class _Head(nn.Module):
    """`model.forward_head` as a module of its own: the model's children but `features`, the
    same module objects under the same names, so `train_stacked` (`functional_call`) trains them."""

    def __init__(self, model: nn.Module):
        super().__init__()
        for name, child in model.named_children():
            if name != "features":
                self.add_module(name, child)
        self.forward = model.forward_head  # reads the children above, swapped in by functional_call


def head_of(model: nn.Module, shared_keys: set[str]) -> _Head | None:
    """The layers after `model.features` as a module, when the model declares its forward as
    `forward_head(features(x))` and `shared_keys` (the frozen part) are exactly the features'
    tensors and the head holds all the others; else None."""
    features = getattr(model, "features", None)
    if not isinstance(features, nn.Module) or not callable(getattr(type(model), "forward_head", None)):
        return None
    if shared_keys != {f"features.{k}" for k in features.state_dict()}:
        return None
    head = _Head(model)
    if shared_keys | {k for k in head.state_dict()} != set(model.state_dict()):
        return None  # tensors of the model's own (not in a child): forward_head may not cover them
    return head


@torch.no_grad()
def features_of(features: nn.Module, data: list[ClientData], batch_size: int) -> list[ClientData]:
    """Each client's examples through the frozen `features` (in inference mode), in batches of
    `batch_size` across clients (the settings' evaluation batch: it bounds the activations'
    memory); the labels kept."""
    everyone, device = ClientData.concat(data), device_of(features)
    z = torch.cat([features(as_float(everyone.x[i:i + batch_size].to(device))) for i in range(0, len(everyone), batch_size)])
    return [ClientData(part, d.y) for part, d in zip(z.split([len(d) for d in data]), data)]


class VectorisedClients(LocalClients):
    def __init__(self, model: nn.Module, half: ClientHalf, seed: int, resolve: DataResolver | None = None,
                 chunk: int = 64):
        super().__init__(model, half, seed, resolve)
        self.chunk = chunk
        self.why_not = vectorisable(half.settings, model)  # None: batched
        if self.why_not is None and not half.batched_fit:
            self.why_not = f"{type(half).__name__} trains by its own fit"
        self.finetune = half.batched_finetune()  # None: after_aggregation runs client by client
        # the head fine-tuned on features computed once (None: the whole model, frozen blocks run every batch)
        self.head = head_of(model, set(half.split.shared_keys(model))) if self.finetune is not None else None

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
                with diverges_as(c):  # as `train_epochs` checks a client's loss and weights
                    if not math.isfinite(loss):
                        raise TrainingDiverged(f"training diverged: its last epoch's loss is {loss}")
                    check_finite(state.values(), "local training")
                load_tensors(self.model, state)
                replies[c], self.runner(c).state = self.half.outgoing(self.model, len(d), loss)
        return replies

    def after_aggregation(self, phase: str, rnd: int, work: Work) -> None:
        half, finetune = self.half, self.finetune
        if self.why_not is not None or finetune is None:
            return super().after_aggregation(phase, rnd, work)
        for chunk in self._chunks(work):  # the half's declared after_aggregation, for `chunk` clients at once
            starts = []
            for c, message, _ in chunk:
                half.load(self.model, message, self.runner(c).state).train()
                starts.append({k: v.clone() for k, v in self.model.state_dict().items()})
            data = [self.data(c, d) for c, _, d in chunk]
            generators = [Randomness(self.seed, phase, c, rnd).torch("finetune-order") for c, _, _ in chunk]
            with finetune.frozen(self.model) as private:  # the shared blocks: the global message's, alike for all
                common = set(half.split.shared_keys(self.model))
                if self.head is not None and not any(m.training for m in self.model.features.modules()):
                    # the head alone, on each example's features (the same in every batch and epoch)
                    trained, _ = train_stacked(self.head, [{k: s[k] for k in s if k not in common} for s in starts],
                                               features_of(self.model.features, data, half.settings.eval_batch_size),
                                               half.settings, generators,
                                               epochs=finetune.epochs, lr=finetune.lr, trainable=private)
                else:
                    trained, _ = train_stacked(self.model, starts, data, half.settings, generators,
                                               epochs=finetune.epochs, lr=finetune.lr, trainable=private,
                                               common=common)
            for (c, _, _), state in zip(chunk, trained):
                load_tensors(self.model, state)
                self.runner(c).state = half.split.private_tensors(self.model)

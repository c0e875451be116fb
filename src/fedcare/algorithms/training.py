"""Local training and prediction on one client's data: plain minibatch SGD, as the papers use."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from fedcare.seeding import torch_generator


@dataclass
class ClientData:
    """One client's examples: images as uint8 (N, 1, H, W), labels as float (N,)."""

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"{len(self.x)} images but {len(self.y)} labels")

    def __len__(self) -> int:
        return len(self.y)

    @staticmethod
    def concat(parts: Iterable["ClientData"]) -> "ClientData":
        parts = list(parts)
        return ClientData(torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts]))


def as_float(x: torch.Tensor) -> torch.Tensor:
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x


def task_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Binary tasks: logits (N,) and float labels, BCE. Multiclass: logits (N, C) and integer
    labels, cross-entropy. The label dtype tells which."""
    if y.is_floating_point():
        return F.binary_cross_entropy_with_logits(logits, y)
    return F.cross_entropy(logits, y)


def task_probabilities(logits: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(logits) if logits.ndim == 1 else torch.softmax(logits, dim=1)


@dataclass(frozen=True)
class TrainSettings:
    lr: float = 1e-3
    batch_size: int = 32
    local_epochs: int = 5


@dataclass(frozen=True)
class Randomness:
    """Hands out generators derived from (run seed, phase, client, round, purpose)."""

    seed: int
    phase: str
    client: object
    round: int

    def torch(self, purpose: str) -> torch.Generator:
        return torch_generator(self.seed, self.phase, self.client, self.round, purpose)


def train_epochs(
    model: nn.Module,
    params: Iterable[nn.Parameter],
    data: ClientData,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    generator: torch.Generator,
    batch_transform: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None,
    penalty: Callable[[], torch.Tensor | None] | None = None,
) -> float:
    """Vanilla SGD (no momentum: the thesis avoids optimizer state that goes stale after
    averaging) on `task_loss`; returns the mean task loss of the last epoch.
    `batch_transform` (e.g. FedDG's amplitude augmentation) maps each float batch before use;
    `penalty` (FedProx's proximal term, FedDyn's regulariser) is called once per batch on the
    current weights and added to the objective (None: no term on this batch).
    A trailing batch of one example is skipped: BatchNorm cannot train on it."""
    optimizer = torch.optim.SGD(list(params), lr=lr)
    n = len(data)
    last_loss = float("nan")
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)
        total, count = 0.0, 0
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            if len(idx) < 2:
                continue
            optimizer.zero_grad(set_to_none=True)
            x = as_float(data.x[idx])
            if batch_transform is not None:
                x = batch_transform(x, generator)
            loss = task_loss(model(x), data.y[idx])
            extra = penalty() if penalty is not None else None
            (loss if extra is None else loss + extra).backward()
            optimizer.step()
            total += loss.item() * len(idx)
            count += len(idx)
        last_loss = total / max(count, 1)
    return last_loss


@torch.no_grad()
def predict(model: nn.Module, data: ClientData, batch_size: int = 512) -> tuple[torch.Tensor, float]:
    """Class probabilities (pain probability for binary tasks) and the mean loss, with the
    model in inference mode."""
    was_training = model.training
    model.eval()
    logits = torch.cat([model(as_float(data.x[i : i + batch_size])) for i in range(0, len(data), batch_size)])
    model.train(was_training)
    loss = task_loss(logits, data.y).item() if len(data) else float("nan")
    return task_probabilities(logits), loss

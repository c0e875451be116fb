"""The learning task a study declares: what its model's outputs mean, the training loss, the
per-example scores evaluation returns, and the metrics a client computes on its own data.

A task is declared by the study (``BINARY`` for pain, ``MULTICLASS`` for FedHealth 2,
``MultilabelTask`` for surgical tool presence, ``EmbeddingTask`` for face verification) and
travels inside `TrainSettings`; nothing is guessed from tensor dtypes or shapes.

- ``loss(outputs, y)``: the mean loss of a batch of model outputs.
- ``batch_loss(data)``: the training loss for one client's data, as a function of
  (model, x, y): it sees the labels and the model, so a margin head (ArcFace) can be applied
  inside it, and it may take constants from the client's labels (multi-label ``pos_weight``).
- ``scores(outputs)``: what evaluation keeps per example: probabilities (binary: P(y = 1);
  multiclass: softmax; multi-label: sigmoid per label) or L2-normalised embeddings.
- ``metrics(kind, scores, loss, data)``: the metrics of one kind, computed where the data
  are (at the client); every task knows ``"loss"`` (mean loss and example count).
- ``output_problem(outputs, y)``: why a model's outputs do not fit the task (checked on a few
  examples before training, `fedcare.studies.checks`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from fedcare.client_data import ClientData

# (model, float input batch, labels) -> the batch's mean loss (a scalar with a graph)
BatchLoss = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


class Task:
    """What every task shares; subclasses define the loss, the scores and their metric kinds."""

    name: ClassVar[str] = "task"
    metric_kinds: ClassVar[tuple[str, ...]] = ("loss",)

    def loss(self, outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def batch_loss(self, data: ClientData) -> BatchLoss:
        """The training loss for this client's data (default: `loss` on the model's outputs)."""
        return lambda model, x, y: self.loss(model(x), y)

    def evaluation_loss(self, outputs: torch.Tensor, y: torch.Tensor) -> float:
        """The mean loss reported by evaluation (validation under early stopping)."""
        return float(self.loss(outputs, y)) if len(y) else math.nan

    def scores(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs

    def output_problem(self, outputs: torch.Tensor, y: torch.Tensor) -> str | None:
        """Why `outputs` (a model's, for examples labelled `y`) do not fit this task; None: they do."""
        return None

    def metrics(self, kind: str, scores: torch.Tensor, loss: float, data: ClientData) -> dict:
        """Metrics of `kind` on this client's data; plain Python numbers (JSON-ready)."""
        if kind == "loss":
            return {"loss": loss, "n": len(data)}
        raise ValueError(f"the {self.name} task has no metrics {kind!r}: choose one of {', '.join(self.metric_kinds)}")


@dataclass(frozen=True)
class BinaryTask(Task):
    """One logit per example (N,), float labels 0/1; BCE on the logits; scores P(y = 1)."""

    threshold: float = 0.5  # for ACC, F1, precision and recall
    name: ClassVar[str] = "binary"
    metric_kinds: ClassVar[tuple[str, ...]] = ("loss", "binary")

    def loss(self, outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(outputs, y)

    def scores(self, outputs: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(outputs)

    def output_problem(self, outputs: torch.Tensor, y: torch.Tensor) -> str | None:
        if outputs.shape != y.shape:
            return f"one logit per example, shaped as the labels {tuple(y.shape)}, but the outputs are {tuple(outputs.shape)}"
        return None

    def metrics(self, kind: str, scores: torch.Tensor, loss: float, data: ClientData) -> dict:
        if kind == "binary":
            from fedcare.evaluation.metrics import binary_metrics

            return {"loss": loss, "n": len(data),
                    **binary_metrics(data.y.numpy(), scores.numpy(), threshold=self.threshold)}
        return super().metrics(kind, scores, loss, data)


@dataclass(frozen=True)
class MulticlassTask(Task):
    """C logits per example (N, C), integer labels; cross-entropy; scores softmax."""

    name: ClassVar[str] = "multiclass"
    metric_kinds: ClassVar[tuple[str, ...]] = ("loss", "accuracy")

    def loss(self, outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, y)

    def scores(self, outputs: torch.Tensor) -> torch.Tensor:
        return torch.softmax(outputs, dim=1)

    def output_problem(self, outputs: torch.Tensor, y: torch.Tensor) -> str | None:
        if outputs.dim() != 2 or len(outputs) != len(y):
            return f"(examples, classes) logits for {len(y)} examples, but the outputs are {tuple(outputs.shape)}"
        if len(y) and int(y.max()) >= outputs.shape[1]:
            return f"{outputs.shape[1]} logits per example, but a label is {int(y.max())}"
        return None

    def metrics(self, kind: str, scores: torch.Tensor, loss: float, data: ClientData) -> dict:
        if kind == "accuracy":  # a diverged model's scores are not finite: no accuracy (NA), not argmax's pick
            scored = len(data) and bool(torch.isfinite(scores).all())
            correct = (scores.argmax(dim=1) == data.y).float().mean().item() if scored else math.nan
            return {"loss": loss, "n": len(data), "accuracy": correct}
        return super().metrics(kind, scores, loss, data)


def positive_weights(y: torch.Tensor) -> torch.Tensor:
    """Per label: negatives / positives (the weight BCE gives a positive); 1 where a label has
    no positive (its positive term never occurs, so any weight gives the same loss)."""
    positives = y.sum(dim=0)
    negatives = len(y) - positives
    return torch.where(positives > 0, negatives / positives.clamp_min(1), torch.ones_like(positives))


@dataclass(frozen=True)
class MultilabelTask(Task):
    """L logits per example (N, L), float 0/1 labels (N, L); BCE per label; scores sigmoid.

    `pos_weight`: "none" (plain BCE), "client" (negatives/positives per label from each
    client's own training labels, the surgical thesis's weighted BCE computed per client) or a
    fixed tensor (e.g. computed once over all clients' training labels)."""

    labels: tuple[str, ...] = ()  # label names, for per-label metrics
    pos_weight: str | torch.Tensor = "none"
    threshold: float = 0.5
    name: ClassVar[str] = "multilabel"
    metric_kinds: ClassVar[tuple[str, ...]] = ("loss", "multilabel")

    def __post_init__(self) -> None:
        if isinstance(self.pos_weight, str) and self.pos_weight not in ("none", "client"):
            raise ValueError(f"pos_weight must be 'none', 'client' or a tensor, got {self.pos_weight!r}")

    def loss(self, outputs: torch.Tensor, y: torch.Tensor, pos_weight: torch.Tensor | None = None) -> torch.Tensor:
        if pos_weight is not None:
            pos_weight = pos_weight.to(outputs.device)  # computed from the labels, on the host
        return F.binary_cross_entropy_with_logits(outputs, y, pos_weight=pos_weight)

    def batch_loss(self, data: ClientData) -> BatchLoss:
        weight = self._weight(data)
        return lambda model, x, y: self.loss(model(x), y, weight)

    def evaluation_loss(self, outputs: torch.Tensor, y: torch.Tensor) -> float:
        return float(self.loss(outputs, y)) if len(y) else math.nan  # unweighted: comparable across clients

    def _weight(self, data: ClientData) -> torch.Tensor | None:
        if isinstance(self.pos_weight, torch.Tensor):
            return self.pos_weight
        return positive_weights(data.y) if self.pos_weight == "client" else None

    def scores(self, outputs: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(outputs)

    def output_problem(self, outputs: torch.Tensor, y: torch.Tensor) -> str | None:
        if outputs.shape != y.shape:
            return f"one logit per label, shaped as the labels {tuple(y.shape)}, but the outputs are {tuple(outputs.shape)}"
        if self.labels and outputs.shape[1] != len(self.labels):
            return f"{len(self.labels)} labels ({', '.join(self.labels)}), but {outputs.shape[1]} logits per example"
        return None

    def metrics(self, kind: str, scores: torch.Tensor, loss: float, data: ClientData) -> dict:
        if kind == "multilabel":
            from fedcare.evaluation.metrics import multilabel_metrics

            return {"loss": loss, "n": len(data),
                    **multilabel_metrics(data.y.numpy(), scores.numpy(), self.labels, self.threshold)}
        return super().metrics(kind, scores, loss, data)


@dataclass(frozen=True)
class EmbeddingTask(Task):
    """The model returns an embedding per example (N, D); verification compares them by
    cosine similarity. The training loss needs the labels and usually a margin head
    (ArcFace), so the study gives it as `head_loss(model, x, y)`; evaluation has no loss
    (NaN) and scores are the L2-normalised embeddings.

    Metrics ``"verification"``: TAR at FAR = `far` over every pair of the client's examples
    (same label: genuine, different labels: impostor), see `fedcare.evaluation.verification`."""

    head_loss: BatchLoss | None = None
    far: float = 0.1
    name: ClassVar[str] = "embedding"
    metric_kinds: ClassVar[tuple[str, ...]] = ("loss", "verification")

    def loss(self, outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise TypeError("an embedding task's loss needs the model (a margin head): use batch_loss")

    def batch_loss(self, data: ClientData) -> BatchLoss:
        if self.head_loss is None:
            raise ValueError("EmbeddingTask needs head_loss(model, x, y) to train")
        return self.head_loss

    def evaluation_loss(self, outputs: torch.Tensor, y: torch.Tensor) -> float:
        return math.nan

    def scores(self, outputs: torch.Tensor) -> torch.Tensor:
        return F.normalize(outputs, dim=1)

    def output_problem(self, outputs: torch.Tensor, y: torch.Tensor) -> str | None:
        if outputs.dim() != 2 or len(outputs) != len(y):
            return f"(examples, dimensions) embeddings for {len(y)} examples, but the outputs are {tuple(outputs.shape)}"
        return None

    def metrics(self, kind: str, scores: torch.Tensor, loss: float, data: ClientData) -> dict:
        if kind == "verification":
            from fedcare.evaluation.verification import all_pairs_tar_at_far

            return {"loss": loss, "n": len(data), **all_pairs_tar_at_far(scores, data.y, self.far)}
        return super().metrics(kind, scores, loss, data)


BINARY = BinaryTask()
MULTICLASS = MulticlassTask()

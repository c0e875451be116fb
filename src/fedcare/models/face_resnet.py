"""The facerec thesis's model (Table 4.4): torchvision ResNet-18 (its 1000-d output kept) ->
Linear 1000 -> 512 (the embedding) -> ArcFace head (s = 8, m = 0.5) over the identities.

`forward` returns the embedding; the head is used by the loss only (`arcface_loss`), so
verification compares embeddings by cosine similarity. The head's weight has one row per
identity: the global head (every client's identities, shared) or a client's local head (its
own identities, private). A local head's size differs per client, so the model declares it in
`client_sized`: `fedcare.algorithms.split.load_tensors` lets those tensors take the shape a
client's state gives them, on every runtime.

ArcFace (Deng et al. 2019) with the standard non-target logits s·cos θ_j: the thesis's Eq. 2.4
also adds the margin to the non-target classes, a typo (reference note §3)."""

from __future__ import annotations

import math
import pickle

import torch
import torchvision
from torch import nn
from torch.nn import functional as F

from fedcare.errors import InputError

EMBEDDING = 512
HEAD_WEIGHT = "head.weight"
BINARY_WEIGHT = "binary_head.weight"  # FedFR's private binary (SphereFace2-style) head


class ArcFaceHead(nn.Module):
    """One unit-normalised direction per identity (rows of `weight`).

    Its weights are read only in `forward` (the cosines), never directly by a loss: DP-SGD's
    per-example gradients (Opacus) come from hooks on the layer whose forward uses them, here
    computed with functorch (no grad sampler is registered for this layer)."""

    def __init__(self, classes: int, dim: int = EMBEDDING, generator: torch.Generator | None = None):
        super().__init__()
        self.weight = nn.Parameter(init_head(classes, dim, generator))

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        """cos θ (B, classes) between each embedding and each identity's direction."""
        return F.linear(F.normalize(embeddings), F.normalize(self.weight))


def init_head(classes: int, dim: int = EMBEDDING, generator: torch.Generator | None = None) -> torch.Tensor:
    """Xavier-uniform rows (ArcFace implementations' choice), drawn from `generator`."""
    bound = math.sqrt(6.0 / (classes + dim)) if classes else 0.0
    host = generator.device if generator is not None else torch.device("cpu")  # a client's head rests on the host
    return (torch.rand(classes, dim, generator=generator, device=host) * 2 - 1) * bound


class BinaryHead(nn.Module):
    """FedFR's decoupled feature customisation: one direction per local identity and a bias b,
    trained with one-vs-all binary losses (`binary_loss`); unused (0 rows) by other methods."""

    def __init__(self, classes: int, dim: int = EMBEDDING):
        super().__init__()
        self.weight = nn.Parameter(init_head(classes, dim))
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        """(B, classes + 1): cos θ to each direction, then the bias in the last column (read
        here, in the layer, for DP-SGD's per-example gradients: see `ArcFaceHead`)."""
        cosine = F.linear(F.normalize(embeddings), F.normalize(self.weight))
        return torch.cat([cosine, self.bias.expand(len(embeddings), 1)], dim=1)


class FaceResNet(nn.Module):
    client_sized = (HEAD_WEIGHT, BINARY_WEIGHT)  # state-dict keys whose shape is a client's (local heads)

    def __init__(self, classes: int, weights: str | None = None):
        super().__init__()
        self.backbone = torchvision.models.resnet18()  # random init; `weights`: a local file to start from
        if weights:
            try:
                self.backbone.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
            except (OSError, RuntimeError, KeyError, pickle.UnpicklingError) as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise InputError(f"{weights}: not a ResNet-18 state dict ({first})") from None
        out_of_place(self.backbone)
        self.embedding = nn.Linear(1000, EMBEDDING)
        self.head = ArcFaceHead(classes)
        self.binary_head = BinaryHead(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embedding(self.backbone(x))


class _BasicBlock(torchvision.models.resnet.BasicBlock):
    """torchvision's block with the residual added out of place (the same numbers)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


def out_of_place(backbone: nn.Module) -> None:
    """No in-place ReLU or residual addition in `backbone`: DP-SGD's per-example gradients
    (Opacus's backward hooks) wrap each layer's output, which an in-place operation would
    overwrite ("a view ... is being modified inplace"). The values are the same."""
    for module in backbone.modules():
        if isinstance(module, nn.ReLU):
            module.inplace = False
        if type(module) is torchvision.models.resnet.BasicBlock:
            module.__class__ = _BasicBlock


def arcface_logits(embeddings: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, scale: float = 8.0,
                   margin: float = 0.5, present: torch.Tensor | None = None) -> torch.Tensor:
    """s·cos(θ_y + m) for the true class, s·cos θ_j for the others; classes not in `present`
    (a bool mask: the global head's classes absent from this client) get −∞ (thesis Eq. 3.2-3.3)."""
    return margin_logits(F.linear(F.normalize(embeddings), F.normalize(weight)), y, scale, margin, present)


def margin_logits(cosine: torch.Tensor, y: torch.Tensor, scale: float = 8.0, margin: float = 0.5,
                  present: torch.Tensor | None = None) -> torch.Tensor:
    """`arcface_logits` from the cosines (`ArcFaceHead.forward`)."""
    cosine = cosine.clamp(-1 + 1e-7, 1 - 1e-7)
    target = F.one_hot(y, cosine.shape[1]).bool()
    logits = scale * torch.where(target, torch.cos(torch.acos(cosine) + margin), cosine)
    if present is not None:
        logits = logits.masked_fill(~present.to(logits.device), float("-inf"))
    return logits


class ArcFaceLoss:
    """(model, x, y) -> the ArcFace cross-entropy of a batch (a `BatchLoss`); `embedded` takes
    embeddings already computed (a loss that adds a term on the same embeddings)."""

    def __init__(self, scale: float = 8.0, margin: float = 0.5, present: torch.Tensor | None = None):
        self.scale, self.margin, self.present = scale, margin, present

    def embedded(self, model: nn.Module, embeddings: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = margin_logits(model.head(embeddings), y, self.scale, self.margin, self.present)
        return F.cross_entropy(logits, y)

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.embedded(model, model(x), y)


def arcface_loss(scale: float = 8.0, margin: float = 0.5, present: torch.Tensor | None = None) -> ArcFaceLoss:
    return ArcFaceLoss(scale, margin, present)


def binary_loss(embeddings: torch.Tensor, head: BinaryHead, y: torch.Tensor, scale: float = 8.0, margin: float = 0.4,
                lam: float = 0.7) -> torch.Tensor:
    """FedFR's Eq. 2.7 (SphereFace2's binary losses, g = identity): per example
    (λ/s) log(1 + exp(−s(cos θ_y − m) − b)) + ((1 − λ)/s) Σ_{j≠y} log(1 + exp(s(cos θ_j + m) + b)),
    averaged over the batch. s, m, λ are not reported (thesis §2.6): 8 (the ArcFace scale), 0.4
    and 0.7 (SphereFace2's defaults)."""
    out = head(embeddings)
    cosine, bias = out[:, :-1], out[:, -1:]
    target = F.one_hot(y, cosine.shape[1]).bool()
    positive = F.softplus(-scale * (cosine - margin) - bias)
    negative = F.softplus(scale * (cosine + margin) + bias)
    per = torch.where(target, lam * positive, (1 - lam) * negative).sum(dim=1) / scale
    return per.mean()


def moon_contrastive(local: torch.Tensor, global_: torch.Tensor, previous: torch.Tensor,
                     tau: float = 0.5) -> torch.Tensor:
    """FedFR's Eq. 2.6 (MOON): −log(e^{cos(f, f_glob)/τ} / (e^{cos(f, f_glob)/τ} + e^{cos(f, f_prev)/τ}));
    τ is not reported: MOON's 0.5."""
    logits = torch.stack([F.cosine_similarity(local, global_, dim=1), F.cosine_similarity(local, previous, dim=1)], 1)
    return F.cross_entropy(logits / tau, torch.zeros(len(local), dtype=torch.long, device=local.device))

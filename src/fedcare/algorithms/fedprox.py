"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", 2018/2020).

Each client minimises its task loss plus a proximal term that ties it to the global weights
w_g it received this round:

    squared=True  (default, the paper and the surgical thesis §4.1.4):  (μ/2) ‖w − w_g‖²
    squared=False (FedHealth 2's code, microsoft/PersonalizedFL):       (μ/2) ‖w − w_g‖

‖·‖ is one Euclidean norm over every trainable parameter the server sent (parameters with
`requires_grad`; BatchNorm running statistics and other buffers are not in it), not a sum of
per-tensor norms: the PersonalizedFL code takes sqrt(Σ_tensors ‖w − w_g‖²). Aggregation is
FedAvg's (weighted by example count by default, as the surgical thesis's WAVG).

μ defaults to 1e-2 (surgical thesis); the FedHealth 2 code used 1e-3 (the study's config sets it).

Choices where the papers are silent or the code differs
-------------------------------------------------------
- The unsquared norm has no gradient at w = w_g (sqrt at 0: torch gives NaN). Where the distance
  is exactly zero (the first batch of a round) the term is left out, i.e. its subgradient 0 is
  taken. The PersonalizedFL code instead skips the term on the first batch of *every* local
  epoch and in the whole first round; we apply it on every batch of every round, as the paper.
- The reported `train_loss` is the task loss alone (the last epoch's mean), so that it is
  comparable with FedAvg's; the code's log included the proximal term.
- μ = 0 is FedAvg's client exactly (the term is not even built), bit for bit.
- Batch order is `train_epochs`'s: a fresh `randperm` per epoch from the round's "fit-order"
  generator, trailing batches of one example skipped.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from fedcare.algorithms.base import Algorithm, ClientHalf, ServerHalf
from fedcare.algorithms.messages import ClientState, Message
from fedcare.algorithms.split import SHARE_ALL, ParameterSplit
from fedcare.algorithms.training import ClientData, Randomness, TrainSettings, train_epochs

DEFAULT_MU = 1e-2  # surgical thesis §4.1.4 (FedHealth 2 code: 1e-3)


def trainable_pairs(model: nn.Module, reference: Mapping[str, torch.Tensor]) -> list[tuple[nn.Parameter, torch.Tensor]]:
    """(parameter, detached copy of its reference value) for every trainable parameter the
    reference holds, in the model's parameter order."""
    return [
        (p, reference[name].detach().to(p.device, p.dtype, copy=True))
        for name, p in model.named_parameters()
        if p.requires_grad and name in reference
    ]


def proximal_term(pairs: list[tuple[nn.Parameter, torch.Tensor]], mu: float, squared: bool = True) -> torch.Tensor | None:
    """(μ/2)‖w − w_g‖² (squared) or (μ/2)‖w − w_g‖ over all pairs at once. None where the
    unsquared norm sits at zero (no gradient there; its subgradient 0 is used)."""
    if not pairs:
        return None
    sq = sum((p - g).pow(2).sum() for p, g in pairs)
    if squared:
        return (mu / 2) * sq
    if float(sq.detach()) == 0.0:
        return None
    return (mu / 2) * sq.sqrt()


class FedProxClient(ClientHalf):
    """FedAvg's client with the proximal term towards the received global weights."""

    batched_fit = False  # a fit of its own: not the library's to batch over clients

    def __init__(self, settings: TrainSettings, mu: float = DEFAULT_MU, squared: bool = True,
                 split: ParameterSplit = SHARE_ALL):
        super().__init__(settings, split)
        if not mu >= 0:
            raise ValueError(f"mu must be >= 0, got {mu}")
        self.mu = float(mu)
        self.squared = bool(squared)

    def fit(
        self, model: nn.Module, message: Message, state: ClientState, data: ClientData, rng: Randomness
    ) -> tuple[Message, ClientState]:
        self.load(model, message, state).train()
        penalty = None
        if self.mu > 0:
            pairs = trainable_pairs(model, message.tensors)
            penalty = lambda: proximal_term(pairs, self.mu, self.squared)
        loss = train_epochs(model, model.parameters(), data, self.settings, generator=rng.torch("fit-order"), round=rng.round,
                            penalty=penalty)
        return self.outgoing(model, len(data), loss)


class FedProxServer(ServerHalf):
    """FedAvg's aggregation (FedProx changes only the client)."""


def fedprox(settings: TrainSettings, mu: float = DEFAULT_MU, squared: bool = True, weighting: str = "examples") -> Algorithm:
    """FedProx with μ = 1e-2 (surgical thesis) and the paper's squared norm by default;
    `squared=False` is the FedHealth 2 / PersonalizedFL code's (μ/2)‖w − w_g‖."""
    return Algorithm("fedprox", FedProxClient(settings, mu, squared), FedProxServer(SHARE_ALL, weighting))

"""FedDyn (Acar, Zhao, Matas, Mattina, Whatmough, Saligrama, "Federated Learning Based on
Dynamic Regularization", ICLR 2021), as the surgical thesis writes it (§4.1.5, eqs. 4.11-4.14).

Client k keeps g_k = ∇L_k(θ_k^{t−1}), its gradient-correction term (one tensor per trainable
shared parameter, zero at the start), in its ClientState. Given the global θ^{t−1} it minimises

    L_k(θ) − ⟨g_k, θ⟩ + (α/2) ‖θ − θ^{t−1}‖²                              (4.11)

with plain SGD for E epochs (`train_epochs`' batch order), sends θ_k, and updates

    g_k ← g_k − α (θ_k − θ^{t−1})                                         (4.12)

The server keeps h (zero at the start, one tensor per trainable parameter) and sets

    h   ← h − α (1/m) Σ_{k ∈ P_t} (θ_k − θ^{t−1})                          (4.13)
    θ^t = mean_{k ∈ P_t} θ_k − (1/α) h                                      (4.14)

with the freshly updated h, as Acar et al.'s Algorithm 1 (the thesis prints h_t in 4.14; the
reference notes flag it). α is the thesis's μ, 1e-2 by default.

Choices where the papers are silent
-----------------------------------
- m is the number of *all* clients in Acar et al. The server does not know it, so it is the
  constructor argument `num_clients`; None (default) takes the number of clients that replied
  this round, which is exact under full participation (the surgical thesis's C = 1).
- mean_k θ_k follows `weighting`: "uniform" (default, 1/|P_t| as Acar et al. and the thesis's
  eq. 4.14) or "examples". The h update is always the unweighted sum / m.
- Which tensors are "parameters" the server learns from the model given to
  `initial_message` (its trainable `named_parameters()`), never from names. Buffers
  (BatchNorm running statistics, num_batches_tracked) are not in h: they take the plain
  (weighted) average, as FedAvg.
- The server's arithmetic runs in float64 (h is stored in float64), the result is cast back
  to each tensor's dtype. Under a server optimizer (`OptimizedServer`), θ^t is the target
  the optimizer moves towards and θ^{t−1} is the optimizer's current global model.
- The reported `train_loss` is the task loss alone (last epoch's mean).
- A client whose state lacks g_k for a parameter (e.g. a state created before that parameter
  was shared) starts it at zero.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from fedcare.algorithms.base import EXTRA, Algorithm, ClientHalf, ClientId, ServerHalf
from fedcare.algorithms.fedprox import trainable_pairs
from fedcare.algorithms.messages import ClientState, Message
from fedcare.algorithms.split import SHARE_ALL, ParameterSplit
from fedcare.algorithms.training import ClientData, Randomness, TrainSettings, train_epochs

DEFAULT_ALPHA = 1e-2  # surgical thesis: μ = 1e-2 for FedProx and FedDyn
GRADIENT = EXTRA + "feddyn.grad/"  # state key prefix of g_k, followed by the parameter name


def gradient_key(name: str) -> str:
    return GRADIENT + name


def _trainable_shared(model: nn.Module, split: ParameterSplit) -> list[str]:
    shared = set(split.shared_keys(model))
    return [name for name, p in model.named_parameters() if p.requires_grad and name in shared]


class FedDynClient(ClientHalf):
    batched_fit = False  # a fit of its own: not the library's to batch over clients

    def __init__(self, settings: TrainSettings, alpha: float = DEFAULT_ALPHA, split: ParameterSplit = SHARE_ALL):
        super().__init__(settings, split)
        if not alpha > 0:
            raise ValueError(f"alpha must be positive, got {alpha}")
        self.alpha = float(alpha)

    def init_state(self, model: nn.Module) -> ClientState:
        state = super().init_state(model)
        params = dict(model.named_parameters())
        for name in _trainable_shared(model, self.split):
            state[gradient_key(name)] = torch.zeros_like(params[name].detach(), device="cpu")  # state rests on the host
        return state

    def fit(
        self, model: nn.Module, message: Message, state: ClientState, data: ClientData, rng: Randomness
    ) -> tuple[Message, ClientState]:
        self.load(model, message, state).train()
        names = [n for n in _trainable_shared(model, self.split) if n in message.tensors]  # model order
        pairs = trainable_pairs(model, {n: message.tensors[n] for n in names})  # (θ, θ^{t−1}), same order
        grads = [
            state[gradient_key(n)].detach().to(p.device, p.dtype, copy=True) if gradient_key(n) in state else torch.zeros_like(prev)
            for n, (p, prev) in zip(names, pairs)
        ]
        alpha = self.alpha

        def penalty() -> torch.Tensor | None:
            if not pairs:
                return None
            linear = sum((g * p).sum() for g, (p, _) in zip(grads, pairs))
            proximal = sum((p - prev).pow(2).sum() for p, prev in pairs)
            return (alpha / 2) * proximal - linear

        loss = train_epochs(model, model.parameters(), data, self.settings, generator=rng.torch("fit-order"), round=rng.round,
                            penalty=penalty)
        reply, private = self.outgoing(model, len(data), loss)
        new_state = {k: v for k, v in state.items() if k.startswith(EXTRA) and not k.startswith(GRADIENT)}
        new_state.update(private)
        with torch.no_grad():
            for name, g, (p, prev) in zip(names, grads, pairs):
                new_state[gradient_key(name)] = (g - alpha * (p.detach() - prev)).to("cpu", copy=True)  # state rests on the host
        return reply, new_state


class FedDynServer(ServerHalf):
    needs = "each"  # the h correction sums the replies' drifts and counts them (m)

    def __init__(self, alpha: float = DEFAULT_ALPHA, num_clients: int | None = None, weighting: str = "uniform",
                 split: ParameterSplit = SHARE_ALL):
        super().__init__(split, weighting)
        if not alpha > 0:
            raise ValueError(f"alpha must be positive, got {alpha}")
        if num_clients is not None and num_clients < 1:
            raise ValueError(f"num_clients must be >= 1, got {num_clients}")
        self.alpha = float(alpha)
        self.num_clients = num_clients
        self.parameter_names: tuple[str, ...] | None = None  # learnt in initial_message
        self.h: dict[str, torch.Tensor] = {}  # float64, one per trainable shared parameter

    def initial_message(self, model: nn.Module) -> Message:
        message = super().initial_message(model)
        names = [n for n in _trainable_shared(model, self.split) if message.tensors[n].is_floating_point()]
        self.parameter_names = tuple(names)
        self.h = {n: torch.zeros(message.tensors[n].shape, dtype=torch.float64, device=message.tensors[n].device)
                  for n in names}
        return message

    def aggregate(self, current: Message, replies: Mapping[ClientId, Message]) -> Message:
        if self.parameter_names is None:
            raise RuntimeError("FedDyn's server learns which tensors are parameters in initial_message(model); "
                               "call it before aggregate")
        plain = super().aggregate(current, replies)  # buffers: the plain (weighted) average
        if not replies or plain is current:
            return plain
        m = self.num_clients if self.num_clients is not None else len(replies)
        weights = self.weights(replies)
        order = sorted(replies)
        tensors = dict(plain.tensors)
        for name in self.parameter_names:
            previous = current.tensors[name].double()
            drift = torch.zeros_like(previous)
            mean = torch.zeros_like(previous)  # mean_k θ_k by `weighting`
            for client in order:  # a fixed order: float sums depend on it
                theta = replies[client].tensors[name].double()
                drift += theta - previous
                mean += weights[client] * theta
            self.h[name] = self.h[name] - self.alpha * drift / m
            tensors[name] = (mean - self.h[name] / self.alpha).to(current.tensors[name].dtype)
        return Message(tensors, dict(plain.scalars))


def feddyn(
    settings: TrainSettings,
    alpha: float = DEFAULT_ALPHA,
    weighting: str = "uniform",
    num_clients: int | None = None,
) -> Algorithm:
    """FedDyn with α = 1e-2 (the surgical thesis's μ); `num_clients` is m in the h update
    (None: the clients that replied this round)."""
    return Algorithm("feddyn", FedDynClient(settings, alpha), FedDynServer(alpha, num_clients, weighting))

"""FedAP / FedHealth 2 (Chen, Lu, Wang, Qin 2021; Lu et al., "Personalized Federated Learning
with Adaptive Batchnorm for Healthcare"): similarity-weighted aggregation with private BatchNorm.

Setup (one exchange before round 1): each client runs the model it received (a pretrained
model) over its data and sends per-channel means and variances of the inputs of every
BatchNorm layer (FedAP) or of the classifier's input (d-FedAP, ``statistics="classifier"``).
The server turns them into distances

    d_ij = Σ_l sqrt(‖μ_il − μ_jl‖² + ‖√v_il − √v_jl‖²)      (the code's non-squared W2 sum)

and weights w̃_ij = 1/d_ij, w_ii = λ, off-diagonal rows normalised to 1 − λ (Eq. 7; the code
uses w̃ = 1e14 where d_ij = 0). Each round client i receives its own aggregate
ψ_i = Σ_j w_ij ψ_j of the non-BatchNorm tensors; BatchNorm (found by module type) stays private.

Choices where the paper is silent:
- Before the setup has run, the server averages like FedBN. f-FedAP ("weights from a model
  after several FedBN rounds") is therefore: run k rounds, then `Federation.run_setup`.
- With partial participation, row i uses only the clients that replied this round, its
  off-diagonal part renormalised to 1 − λ; a client without statistics gets the plain average.
- Statistics are population moments over every example (and spatial position) of the client's
  data, accumulated in float64 over batches of the evaluation size.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from fedcare.algorithms.base import NUM_EXAMPLES, Algorithm, ClientHalf, ClientId, ServerHalf
from fedcare.algorithms.messages import ClientState, Message
from fedcare.algorithms.fedbn import BATCHNORM, FEDBN_SPLIT
from fedcare.algorithms.split import is_kind
from fedcare.algorithms.training import ClientData, Randomness, TrainSettings, as_float
from fedcare.device import device_of

NO_DISTANCE_WEIGHT = 1e14  # the authors' code: w̃ for a zero distance


def fedap_weights(distances: np.ndarray, lam: float) -> np.ndarray:
    """The N x N aggregation matrix from pairwise distances: w_ii = λ, w_ij ∝ 1/d_ij, rows sum to 1."""
    d = np.asarray(distances, dtype=np.float64)
    n = len(d)
    if n == 1:
        return np.ones((1, 1))
    with np.errstate(divide="ignore"):
        inverse = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), NO_DISTANCE_WEIGHT)
    np.fill_diagonal(inverse, 0.0)
    weights = (1.0 - lam) * inverse / inverse.sum(axis=1, keepdims=True)
    np.fill_diagonal(weights, lam)
    return weights


def statistics_distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    layers = sorted(k[: -len(".mean")] for k in a if k.endswith(".mean"))
    total = 0.0
    for layer in layers:
        dm = (a[f"{layer}.mean"].double() - b[f"{layer}.mean"].double()).pow(2).sum()
        ds = (a[f"{layer}.var"].double().sqrt() - b[f"{layer}.var"].double().sqrt()).pow(2).sum()
        total += float((dm + ds).sqrt())
    return total


def _observed_modules(model: nn.Module, statistics: str) -> dict[str, nn.Module]:
    if statistics == "bn":
        return {path: m for path, m in model.named_modules() if is_kind(m, (BATCHNORM,))}  # DP-SGD's GroupNorm too
    linears = [(path, m) for path, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("d-FedAP needs a Linear classification layer")
    path, module = linears[-1]
    return {path: module}


@torch.no_grad()
def input_statistics(model: nn.Module, data: ClientData, statistics: str = "bn", batch_size: int = 256) -> dict[str, torch.Tensor]:
    """Per-channel mean and variance of the inputs of the observed layers over all of `data`."""
    sums: dict[str, tuple] = {}  # layer -> (sum, sum of squares, count) per channel

    def hook_for(path: str):
        def hook(_module, inputs):
            x = inputs[0].to("cpu", torch.float64)  # summed on the host in fp64 (which MPS lacks)
            channels = x.movedim(1, 0).reshape(x.shape[1], -1)
            s, sq, n = sums.get(path, (0.0, 0.0, 0))
            sums[path] = (s + channels.sum(1), sq + channels.pow(2).sum(1), n + channels.shape[1])

        return hook

    handles = [m.register_forward_pre_hook(hook_for(p)) for p, m in _observed_modules(model, statistics).items()]
    was_training = model.training
    model.eval()
    device = device_of(model)
    try:
        for start in range(0, len(data), batch_size):
            model(as_float(data.x[start : start + batch_size].to(device)))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    out = {}
    for path, (s, sq, n) in sums.items():
        mean = s / n
        out[f"{path}.mean"] = mean.float()
        out[f"{path}.var"] = (sq / n - mean.pow(2)).clamp_min(0).float()
    return out


class FedAPClient(ClientHalf):
    def __init__(self, settings: TrainSettings, statistics: str):
        super().__init__(settings, FEDBN_SPLIT)
        self.statistics = statistics

    def setup(self, model: nn.Module, message: Message, state: ClientState, data: ClientData, rng: Randomness) -> Message:
        self.load(model, message, state)
        return Message(input_statistics(model, data, self.statistics), {NUM_EXAMPLES: float(len(data))})


def _channels(module: nn.Module) -> int:
    """How many channels an observed layer's input has (`input_statistics` gives one value each)."""
    for name in ("num_features", "num_channels", "in_features"):  # BatchNorm, DP-SGD's GroupNorm, Linear
        if isinstance(getattr(module, name, None), int):
            return getattr(module, name)
    raise ValueError(f"FedAP cannot tell the channels of a {type(module).__name__}")


class FedAPServer(ServerHalf):
    needs = "each"  # a personal aggregate per client, from the others' replies by similarity
    has_setup = True  # each client's feature statistics

    def __init__(self, lam: float, weighting: str, statistics: str = "bn"):
        super().__init__(FEDBN_SPLIT, weighting)
        if not 0 <= lam <= 1:
            raise ValueError(f"lambda must be in [0, 1], got {lam}")
        self.lam = lam
        self.observes = statistics
        self.expected: dict[str, tuple[int, ...]] = {}  # each statistic's shape, from the model (initial_message)
        self.statistics: dict[ClientId, dict[str, torch.Tensor]] = {}
        self.personal: dict[ClientId, Message] = {}

    def initial_message(self, model: nn.Module) -> Message:
        self.expected = {f"{path}.{kind}": (_channels(module),)
                         for path, module in _observed_modules(model, self.observes).items() for kind in ("mean", "var")}
        return super().initial_message(model)

    def setup_reply_problem(self, reply: Message) -> str | None:
        """The statistics of the model's observed layers, one value per channel; no negative variance."""
        names = set(reply.tensors)
        if names != set(self.expected):
            wrong = sorted(names ^ set(self.expected))[0]
            return f"{'unexpected' if wrong in names else 'missing'} statistic {wrong!r}"
        for name, shape in self.expected.items():
            tensor = reply.tensors[name]
            if tuple(tensor.shape) != shape:
                return f"statistic {name!r} has shape {tuple(tensor.shape)}, expected {shape}"
            if name.endswith(".var") and bool((tensor < 0).any()):
                return f"statistic {name!r} holds a negative variance"
        return None

    def setup(self, replies: Mapping[ClientId, Message]) -> None:
        self.statistics = {c: dict(m.tensors) for c, m in replies.items()}
        return None

    def weight_matrix(self, clients: list[ClientId]) -> np.ndarray:
        d = np.array([[statistics_distance(self.statistics[a], self.statistics[b]) for b in clients] for a in clients])
        return fedap_weights(d, self.lam)

    def aggregate(self, current: Message, replies: Mapping[ClientId, Message]) -> Message:
        average = super().aggregate(current, replies)  # FedBN's average: before setup, and for outsiders
        known = [c for c in sorted(replies) if c in self.statistics]
        if len(known) > 0:
            weights = self.weight_matrix(known)
            for i, client in enumerate(known):
                tensors = {}
                for name, old in current.tensors.items():
                    acc = torch.zeros(old.shape, dtype=torch.float64, device=old.device)  # messages are on the CPU
                    for j, other in enumerate(known):
                        acc += float(weights[i, j]) * replies[other].tensors[name].double()
                    tensors[name] = acc.to(old.dtype) if old.is_floating_point() else acc.round().to(old.dtype)
                self.personal[client] = Message(tensors)
        return average

    def message_for(self, client: ClientId, message: Message) -> Message:
        return self.personal.get(client, message)


def fedap(settings: TrainSettings, lam: float = 0.5, statistics: str = "bn", weighting: str = "uniform") -> Algorithm:
    """FedAP (statistics="bn") or d-FedAP (statistics="classifier"); λ = 0.5 as the authors' code."""
    if statistics not in ("bn", "classifier"):
        raise ValueError(f"statistics must be 'bn' or 'classifier', got {statistics!r}")
    name = "fedap" if statistics == "bn" else "d-fedap"
    return Algorithm(name, FedAPClient(settings, statistics), FedAPServer(lam, weighting, statistics))

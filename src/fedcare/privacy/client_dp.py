"""Client-level DP at the server (DP-FedAvg: McMahan et al. 2018; adaptive clipping: Andrew
et al. 2021), as Flower 1.41's DifferentialPrivacyServerSideFixedClipping and
...AdaptiveClipping do it, checked against them in tests/privacy/test_client_dp.py.

Each reply's update (its shared floating-point tensors minus the current global ones) is
clipped to the clipping norm C (one L2 norm over all tensors); the clipped replies are
averaged uniformly (every reply's weight is set to 1: with example weights the sensitivity
would be the largest weight times C, not C / m); Gaussian noise of std noise_multiplier * C / m
is added to the average. Adaptive clipping moves C geometrically towards the target quantile
of the update norms, from a noisy count of *unclipped* replies (Andrew et al. 2021, eq. 1 and
Algorithm 1: b_i = 1 when ||Delta_i|| <= C, C <- C * exp(-eta (b_bar - gamma))): when fewer than
the target fraction fit under C, C grows; when more do, it shrinks.

Choices written down:
- Only a server half whose rule is the weighted mean (`needs = "mean"`) is wrapped: the noise
  goes onto the mean. Under a server optimizer (FedAdam, AdamW) the wrapper goes inside it, on
  the mean the optimizer steps from: the step is post-processing of the noised mean, so the
  guarantee holds. A personalised aggregation (FedAP, FedDyn, q-FedAvg) is refused with the
  reason (`fedcare.privacy.private_algorithm`, `fedcare.algorithms.capabilities`).
- Adaptive: Flower updates C before adding the round's noise, so the noise is scaled by the
  next round's norm; here the noise uses the norm the updates were clipped to (the one the
  sensitivity is), and C moves afterwards.
- Adaptive, the count: Flower 1.41 counts the *clipped* replies and applies the paper's update
  to that fraction, which moves C away from its target (all clipped: C shrinks further). Here
  the paper's count of unclipped replies is used; docs/privacy.md gives a reproduction of
  Flower's behaviour. Fixed clipping equals Flower's (tests/privacy/test_client_dp.py).
- Integer tensors (BatchNorm's counter) carry no gradient: they are averaged, never clipped or
  noised (Flower fixed its client-level DP touching them in 1.45, flwr #8381).
- The one-run audit (`[privacy.audit] canary_clients`): canary clients' updates join the
  clipped ones before the noise (`fedcare.privacy.canary_clients`); each round's scalars carry
  its epsilon-hat, the paper's estimate and the p-value the soundness check tests.
- Accounting: the Gaussian mechanism composed over rounds with Opacus's RDP accountant at
  sampling rate 1 (no amplification, as Flower's accounting requires): conservative when a
  round samples a fraction of the clients. The ledger is never rolled back by snapshots.
  `client_dp_epsilon` composes every release; per client, only the releases it took part in.
- Budget (`target_epsilon`): the noise multiplier is calibrated before the first round so that
  `budget_rounds` releases spend the target (Opacus's get_noise_multiplier, rate 1); a client
  whose next release would cross it is left out of the round (`over_budget`; the round's
  record lists it as skipped).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from fedcare.algorithms.base import NUM_EXAMPLES, ClientId, DelegatingServer, ServerHalf
from fedcare.algorithms.messages import Message
from fedcare.config import ClientDP
from fedcare.privacy.canary_clients import CanaryClients
from fedcare.privacy.dp_sgd import PrivacyError, budget_problem, calibrate, epsilon
from fedcare.seeding import numpy_rng, torch_generator

CLIENT_DP_EPSILON = "client_dp_epsilon"
KEY = "privacy.client_dp"  # the config table, named in errors
CLIPPING_NORM = "client_dp_clipping_norm"


def adaptive_noise(noise_multiplier: float, clients: int, clipped_count_stddev: float | None) -> tuple[float, float]:
    """(std of the clipped count, noise multiplier left for the update) under adaptive
    clipping: the count's noise uses part of the budget (Andrew et al., Flower's formula)."""
    if noise_multiplier == 0:
        return (clipped_count_stddev or 0.0), 0.0
    count_std = clients / 20 if clipped_count_stddev is None else clipped_count_stddev
    if noise_multiplier >= 2 * count_std:
        raise PrivacyError(f"privacy.client_dp: noise_multiplier {noise_multiplier} needs clipped_count_stddev "
                           f"above {noise_multiplier / 2} (it is {count_std}; the default is clients / 20)")
    return count_std, (noise_multiplier ** -2 - (2 * count_std) ** -2) ** -0.5


class Ledger:
    """Noise multipliers of the releases made, and per client those it took part in. Shared,
    not copied, by a snapshot of the server (deepcopy): early stopping going back to a round
    does not unspend privacy."""

    def __init__(self) -> None:
        self.releases: list[float] = []
        self.clients: dict[ClientId, list[float]] = {}

    def __deepcopy__(self, memo: dict) -> "Ledger":
        return self

    def epsilon(self, delta: float, releases: list[float] | None = None) -> float:
        releases = self.releases if releases is None else releases
        rows = torch.tensor([[s, 1.0, 1] for s in releases], dtype=torch.float64, device="cpu").reshape(-1, 3)
        return epsilon(rows, delta)


def calibrated_noise(config: ClientDP) -> float:
    """The noise multiplier with which `budget_rounds` releases (sampling rate 1, the
    accounting used here) spend exactly `target_epsilon` at `delta` (Opacus)."""
    why = budget_problem(KEY, config.target_epsilon, config.delta, "rdp")
    if why:
        raise PrivacyError(why)
    return calibrate(KEY, config.target_epsilon, config.delta, "rdp", 1.0, config.budget_rounds)


class ClientDPServer(DelegatingServer):
    """A server half whose rule is the weighted mean (`inner`), with client-level DP on it."""

    needs = "each"  # each update is clipped here

    def __init__(self, inner: ServerHalf, config: ClientDP, algorithm: str, canary_clients: int = 0,
                 confidence: float = 0.95):
        if inner.needs != "mean":  # `fedcare.privacy.private_algorithm` refuses it first, saying why
            raise ValueError(f"ClientDPServer noises a mean; {algorithm}'s {type(inner).__name__} needs {inner.needs!r}")
        if config.target_epsilon is not None:  # the budget fixes the noise before the first round
            config = config.model_copy(update={"noise_multiplier": calibrated_noise(config)})
        super().__init__(inner)
        self.config = config
        self.clipping_norm = config.clipping_norm
        self.seed = 0
        self.ledger = Ledger()
        # the one-run audit's canary clients (`fedcare.privacy.canary_clients`), drawn from the run seed
        self.canary_clients, self.confidence = canary_clients, confidence
        self.canaries: CanaryClients | None = None

    def bind_seed(self, seed: int) -> None:
        """The run seed the noise derives from (set by the federation)."""
        self.seed = seed

    def over_budget(self, clients: list[ClientId]) -> list[ClientId]:
        """The clients whose taking part in one more release would cross target_epsilon."""
        cfg = self.config
        if cfg.target_epsilon is None:
            return []
        return [c for c in clients
                if self.ledger.epsilon(cfg.delta, [*self.ledger.clients.get(c, []), cfg.noise_multiplier])
                > cfg.target_epsilon]

    def spent_per_client(self) -> dict[str, float]:
        """Each client's epsilon so far: the releases it took part in, composed."""
        return {str(c): self.ledger.epsilon(self.config.delta, r) for c, r in sorted(self.ledger.clients.items())}

    def aggregate(self, current: Message, replies: Mapping[ClientId, Message]) -> Message:
        if not replies or not current.tensors:
            return current
        c, m, release = self.clipping_norm, len(replies), len(self.ledger.releases)
        clipped, n_unclipped = {}, 0
        for client in sorted(replies):
            tensors, was_clipped = clip_update(current.tensors, replies[client].tensors, c)
            n_unclipped += not was_clipped  # the paper's b_i: the update fits under C
            clipped[client] = Message(tensors, {**replies[client].scalars, NUM_EXAMPLES: 1.0})
        cfg = self.config
        sigma = cfg.noise_multiplier
        if cfg.adaptive:
            count_std, sigma = adaptive_noise(cfg.noise_multiplier, m, cfg.clipped_count_stddev)
            noisy = numpy_rng(self.seed, "client-dp-count", release).normal(n_unclipped, count_std) if count_std else n_unclipped
            self.clipping_norm = next_clipping_norm(c, noisy / m, cfg.target_quantile, cfg.clip_norm_lr)
        averaged = self.inner.aggregate(current, clipped)
        if self.canary_clients:  # the canary clients' updates join the clipped ones, before the noise
            averaged = Message(self._with_canaries(current.tensors, averaged.tensors, c, m), averaged.scalars)
        generator = torch_generator(self.seed, "client-dp-noise", release)
        std = sigma * c / m
        # floating-point tensors only: an integer one (BatchNorm's counter) is averaged, never noised (flwr #8381)
        noised = {k: (v + torch.normal(0.0, std, v.shape, generator=generator, dtype=torch.float64,
                                                  device=generator.device).to(v.dtype))
                  if v.is_floating_point() and std > 0 else v for k, v in averaged.tensors.items()}
        self.ledger.releases.append(cfg.noise_multiplier)
        for client in replies:
            self.ledger.clients.setdefault(client, []).append(cfg.noise_multiplier)
        scalars = {**averaged.scalars, CLIPPING_NORM: self.clipping_norm,
                   CLIENT_DP_EPSILON: self.ledger.epsilon(cfg.delta)}
        if self.canaries is not None:  # every canary took part in every release: the whole run's epsilon
            scalars |= self.canaries.audit(_flat(noised), scalars[CLIENT_DP_EPSILON])
        return Message(noised, scalars)

    def _with_canaries(self, current: Mapping[str, torch.Tensor], averaged: Mapping[str, torch.Tensor], c: float,
                       m: int) -> dict[str, torch.Tensor]:
        if self.canaries is None:
            self.canaries = CanaryClients(self.canary_clients, self.seed, self.config.delta, self.confidence)
        self.canaries.begin(_flat(current))
        flat = self.canaries.added(_flat(averaged), c, m)
        out, start = dict(averaged), 0
        for k, v in averaged.items():
            if v.is_floating_point():
                out[k] = flat[start : start + v.numel()].reshape(v.shape).to(v.dtype)
                start += v.numel()
        return out


def _flat(tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The floating-point tensors, in their order, as one float64 vector."""
    floats = [v.double().flatten() for v in tensors.values() if v.is_floating_point()]
    return torch.cat(floats) if floats else torch.zeros(0, dtype=torch.float64)


def next_clipping_norm(norm: float, unclipped_fraction: float, target_quantile: float, lr: float) -> float:
    """Andrew et al.'s geometric update: C * exp(-lr * (b_bar - gamma)), b_bar the (noisy)
    fraction of updates whose norm was at most C. Its fixed point is the gamma-quantile of the
    update norms: more than gamma unclipped -> C shrinks, fewer -> C grows."""
    return norm * math.exp(-lr * (unclipped_fraction - target_quantile))


def clip_update(current: Mapping[str, torch.Tensor], reply: Mapping[str, torch.Tensor],
                norm: float) -> tuple[dict[str, torch.Tensor], bool]:
    """The reply with its floating-point update (reply - current) scaled to L2 norm at most
    `norm` over all tensors together (Flower's FlatClip); whether it was scaled down."""
    floats = [k for k in current if current[k].is_floating_point()]
    total = math.sqrt(sum(float((reply[k].double() - current[k].double()).pow(2).sum()) for k in floats))
    factor = min(1.0, norm / total) if total > 0 else 1.0
    out = dict(reply)
    for k in floats:
        out[k] = (current[k].double() + factor * (reply[k].double() - current[k].double())).to(reply[k].dtype)
    return out, factor < 1


"""The one-run audit of client-level DP (fedcare.privacy.canary_clients): canary clients at the
server (Andrew et al. 2024), their bound and the paper's estimate."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedcare.algorithms.base import NUM_EXAMPLES, ServerHalf
from fedcare.algorithms.messages import Message
from fedcare.config import ClientDP
from fedcare.privacy.canary_clients import AUDIT_PREFIX, CanaryClients, estimate
from fedcare.privacy.client_dp import ClientDPServer

D, ROUNDS, CLIENTS = 4000, 6, 6


def federation(sigma: float, seed: int, canaries: int = 400, step: float = 0.3) -> tuple[Message, ClientDPServer]:
    """ROUNDS rounds of client-level DP over CLIENTS clients whose updates are random (norm ~ step)."""
    server = ClientDPServer(ServerHalf(weighting="uniform"), ClientDP(noise_multiplier=sigma, clipping_norm=1.0),
                            "FedAvg", canary_clients=canaries)
    server.bind_seed(seed)
    current = Message({"w": torch.zeros(D), "steps": torch.zeros((), dtype=torch.int64)})
    g = torch.Generator().manual_seed(seed)
    for _ in range(ROUNDS):
        replies = {c: Message({"w": current.tensors["w"] + step * torch.randn(D, generator=g) / math.sqrt(D),
                               "steps": current.tensors["steps"] + 1}, {NUM_EXAMPLES: 1.0}) for c in range(CLIENTS)}
        current = server.aggregate(current, replies)
    return current, server


def audit_of(message: Message) -> dict:
    return {k.removeprefix(AUDIT_PREFIX): v for k, v in message.scalars.items() if k.startswith(AUDIT_PREFIX)}


def test_the_estimate_is_dp_accountings_gaussian_mechanism():
    from dp_accounting import get_epsilon_gaussian

    cosines = np.random.default_rng(0).normal(0.05, 0.02, 200)
    mu, s = cosines.mean(), cosines.std(ddof=1)
    assert estimate(cosines, 1e-5) == pytest.approx(get_epsilon_gaussian(s / mu, 1e-5))
    assert estimate(-cosines, 1e-5) == 0.0  # anti-correlated: nothing to see
    assert math.isnan(estimate(cosines[:1], 1e-5))


def test_a_direction_the_model_never_saw_has_the_null_distribution():
    """The cosines of the canaries left out are what the estimate assumes of an unseen
    direction: mean 0, variance 1/d."""
    message, server = federation(1.0, seed=0)
    canaries = server.canaries
    change = message.tensors["w"].double() - canaries.start
    out = (canaries.directions(D)[~canaries.included] @ change / change.norm()).numpy()
    assert len(out) > 150
    assert abs(out.mean()) < 3 / math.sqrt(D * len(out))
    assert out.var() * D == pytest.approx(1.0, rel=0.25)


def test_without_noise_the_canaries_are_found_and_under_noise_the_bound_stays_below_epsilon():
    plain, _ = federation(0.0, seed=1)
    found = audit_of(plain)
    assert found["epsilon_hat"] > 2 and found["estimate"] > 10
    assert math.isnan(found["p_value"])  # no DP: no claim to test
    assert plain.scalars["client_dp_epsilon"] == math.inf
    for sigma in (1.0, 3.0):
        noisy, _ = federation(sigma, seed=2)
        result = audit_of(noisy)
        assert result["epsilon_hat"] <= noisy.scalars["client_dp_epsilon"] and result["p_value"] > 0.05
        assert result["m"] == 400 and 0 < result["v"] <= result["r"] <= 400
    assert audit_of(federation(3.0, seed=2)[0])["epsilon_hat"] < audit_of(federation(1.0, seed=2)[0])["epsilon_hat"]


def test_when_noise_dominates_the_estimate_approaches_the_exact_epsilon():
    """Updates far below the noise: the model's change is the canaries plus the noise, and the
    estimate is about the Gaussian mechanism's exact epsilon for sqrt(rounds) / sigma."""
    from dp_accounting import get_epsilon_gaussian

    sigma = 2.0
    exact = get_epsilon_gaussian(sigma / math.sqrt(ROUNDS), 1e-5)
    estimates = [audit_of(federation(sigma, seed, canaries=1000, step=1e-3)[0])["estimate"] for seed in range(3)]
    assert np.mean(estimates) == pytest.approx(exact, rel=0.15)


def test_the_kept_directions_are_those_drawn_each_round_when_too_many_to_keep(monkeypatch):
    import fedcare.privacy.canary_clients as module

    kept = CanaryClients(20, 3, 1e-5, 0.95).directions(100)
    monkeypatch.setattr(module, "CACHED", 10)
    drawn = CanaryClients(20, 3, 1e-5, 0.95)
    assert drawn.directions(100) is None
    vector = torch.randn(100, dtype=torch.float64)
    torch.testing.assert_close(drawn.projections(vector), kept @ vector)
    torch.testing.assert_close(kept.norm(dim=1), torch.ones(20, dtype=torch.float64))


def test_the_canaries_join_before_the_noise_at_the_clipping_norm():
    """No noise, every real update 0: the model moves by exactly the included canaries' C u_i / m."""
    server = ClientDPServer(ServerHalf(weighting="uniform"), ClientDP(noise_multiplier=0.0, clipping_norm=2.0),
                            "FedAvg", canary_clients=8)
    server.bind_seed(5)
    current = Message({"w": torch.zeros(50)})
    after = server.aggregate(current, {0: Message({"w": torch.zeros(50)}, {NUM_EXAMPLES: 1.0}),
                                       1: Message({"w": torch.zeros(50)}, {NUM_EXAMPLES: 1.0})})
    canaries: CanaryClients = server.canaries
    expected = 2.0 / 2 * canaries.directions(50)[canaries.included].sum(0)
    torch.testing.assert_close(after.tensors["w"].double(), expected, rtol=1e-5, atol=1e-6)
    assert 0 < canaries.included.sum() < 8

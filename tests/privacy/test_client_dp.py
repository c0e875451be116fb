"""Client-level DP at the server (fedcare.privacy.client_dp) against Flower 1.41's
DifferentialPrivacyServerSideFixedClipping and ...AdaptiveClipping as oracles, driven
offline (tests/support/flower_offline.py) on the same client results as tests/algorithms/test_server_optimizers.py.

Without noise the clipping (and the adaptive norm's path) must agree to 1e-6 over three
rounds; with noise, the difference to the noise-free aggregate must have the std
noise_multiplier * C / m. Flower draws its noise from numpy's global generator, ours from the
run seed, so noisy aggregates are compared by their statistics, not value by value.

One difference is pinned: Flower computes a 0-d array's update as a numpy scalar, which its
in-place clipping (`array *= factor`) does not change, so Flower counts a 0-d tensor in the
norm but leaves it unclipped; ours clips it with the rest. The comparisons use a model
without a 0-d parameter and `test_flower_leaves_0d_arrays_unclipped` pins the rest.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from flwr.serverapp.strategy import (DifferentialPrivacyServerSideAdaptiveClipping,
                                     DifferentialPrivacyServerSideFixedClipping, FedAvg)

from fedcare.algorithms import fedavg, feddyn
from fedcare.algorithms.base import NUM_EXAMPLES
from fedcare.algorithms.messages import Message
from fedcare.algorithms.training import TrainSettings
from fedcare.config import ClientDP, Privacy
from fedcare.privacy import PrivacyError, private_algorithm
from fedcare.privacy.client_dp import CLIENT_DP_EPSILON, CLIPPING_NORM, ClientDPServer, clip_update
from fedcare.privacy.dp_sgd import epsilon

from support.flower_offline import EXAMPLES, ROUNDS, client_results, run_flower, run_ours, weights_model


TOL = 1e-6


class NoScalar(nn.Module):
    """support.flower_offline's Weights without its 0-d parameter (see above)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(2, 4, 3)
        self.fc = nn.Linear(8, 5)


def assert_rounds_agree(ours_rounds, theirs_rounds, skip=()):
    assert len(ours_rounds) == len(theirs_rounds) == ROUNDS
    for r, (a, b) in enumerate(zip(ours_rounds, theirs_rounds), start=1):
        assert set(a) == set(b)
        for k in sorted(set(a) - set(skip)):
            diff = (a[k].double() - b[k].double()).abs().max().item()
            assert diff <= TOL, f"round {r}, {k}: max |ours - flower| = {diff:.3g}"

SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)


def ours(config: ClientDP) -> ClientDPServer:
    server = private_algorithm(fedavg(SETTINGS), Privacy(client_dp=config)).server
    server.bind_seed(7)
    return server


def uniform(rounds):
    """Flower's FedAvg weights by num-examples; equal counts make it the uniform mean DP needs."""
    return [{n: (t, {"num-examples": 1, "train_loss": loss}) for n, (t, loss) in results.items()} for results in rounds]


@pytest.mark.parametrize("norm", [0.5, 2.0, 100.0])
def test_fixed_clipping_equals_flowers_without_noise(norm):
    model = NoScalar()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rounds = client_results(initial)
    theirs = run_flower(DifferentialPrivacyServerSideFixedClipping(FedAvg(), 0.0, norm, len(EXAMPLES)),
                        initial, uniform(rounds))
    assert_rounds_agree(run_ours(ours(ClientDP(noise_multiplier=0.0, clipping_norm=norm)), model, rounds), theirs)


def test_adaptive_clipping_clips_as_flower_and_moves_the_norm_the_other_way():
    """Round 1 (same starting C, noise 0) aggregates as Flower's adaptive strategy does; the
    norm then moves by the paper's count of unclipped updates here and by Flower 1.41's count
    of clipped ones there (docs/privacy.md, "Adaptive clipping and Flower")."""
    model = NoScalar()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rounds = client_results(initial, rounds=1)
    norms = sorted(math.sqrt(sum(float((t[k] - initial[k]).pow(2).sum()) for k in t)) for t, _ in rounds[0].values())
    c = (norms[0] + norms[1]) / 2  # one update fits under C, two are clipped
    flower = DifferentialPrivacyServerSideAdaptiveClipping(FedAvg(), 0.0, len(EXAMPLES), initial_clipping_norm=c,
                                                           target_clipped_quantile=0.5, clip_norm_lr=0.5)
    theirs = run_flower(flower, initial, uniform(rounds))[0]
    server = ours(ClientDP(noise_multiplier=0.0, clipping_norm=c, adaptive=True, target_quantile=0.5,
                           clip_norm_lr=0.5))
    mine = run_ours(server, model, rounds)[0]
    for k in mine:
        assert (mine[k].double() - theirs[k].double()).abs().max().item() <= TOL
    assert server.clipping_norm == pytest.approx(c * math.exp(-0.5 * (1 / 3 - 0.5)), rel=1e-12)  # grows
    assert flower.clipping_norm == pytest.approx(c * math.exp(-0.5 * (2 / 3 - 0.5)), rel=1e-12)  # shrinks


def norm_round(server: ClientDPServer, norms) -> float:
    """One aggregation of scalar updates of the given norms; the clipping norm after it."""
    current = Message({"w": torch.zeros(1, dtype=torch.float64)}, {})
    server.aggregate(current, {i: Message({"w": torch.tensor([float(v)], dtype=torch.float64)}, {NUM_EXAMPLES: 1.0})
                               for i, v in enumerate(norms)})
    return server.clipping_norm


def adaptive(start: float, target: float = 0.5, lr: float = 0.2) -> ClientDPServer:
    return ours(ClientDP(noise_multiplier=0.0, clipping_norm=start, adaptive=True, target_quantile=target,
                         clip_norm_lr=lr))


def test_adaptive_norm_grows_when_every_update_is_clipped():
    server = adaptive(0.1)
    assert norm_round(server, [1.0, 2.0, 3.0]) == pytest.approx(0.1 * math.exp(0.2 * 0.5))


def test_adaptive_norm_shrinks_when_no_update_is_clipped():
    server = adaptive(10.0)
    assert norm_round(server, [1.0, 2.0, 3.0]) == pytest.approx(10.0 * math.exp(-0.2 * 0.5))


@pytest.mark.parametrize("target", [0.2, 0.5, 0.8])
def test_adaptive_norm_converges_to_the_target_quantile(target):
    """Norms drawn from one log-normal distribution each round: from far above and far below,
    C ends near the target quantile of that distribution (the unclipped fraction near target)."""
    rng = np.random.default_rng(0)
    true_quantile = float(np.exp(0.5 * __import__("scipy").stats.norm.ppf(target)))  # lognormal(0, 0.5)
    for start in (0.01, 100.0):
        server = adaptive(start, target, lr=0.2)
        tail = [norm_round(server, rng.lognormal(0.0, 0.5, size=50)) for _ in range(400)][-100:]
        assert float(np.mean(tail)) == pytest.approx(true_quantile, rel=0.1)


def test_noise_has_flowers_scale():
    model = weights_model()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rounds = client_results(initial, rounds=1)
    sigma, norm, m = 2.0, 0.5, len(EXAMPLES)
    clean = run_ours(ours(ClientDP(noise_multiplier=0.0, clipping_norm=norm)), model, rounds)[0]
    noisy = run_ours(ours(ClientDP(noise_multiplier=sigma, clipping_norm=norm)), model, rounds)[0]
    np.random.seed(0)
    flower = run_flower(DifferentialPrivacyServerSideFixedClipping(FedAvg(), sigma, norm, m), initial,
                        uniform(rounds))[0]
    ours_noise = torch.cat([(noisy[k] - clean[k]).flatten() for k in clean])
    their_noise = torch.cat([(flower[k] - clean[k]).flatten() for k in clean])
    expected = sigma * norm / m
    assert ours_noise.std().item() == pytest.approx(expected, rel=0.15)
    assert their_noise.std().item() == pytest.approx(expected, rel=0.15)


def test_epsilon_is_the_gaussian_mechanism_composed_over_rounds():
    model = weights_model()
    server = ours(ClientDP(noise_multiplier=1.5, clipping_norm=1.0, delta=1e-5))
    current = server.initial_message(model)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for r, results in enumerate(client_results(initial), start=1):
        current = server.aggregate(current, {n: Message(t, {NUM_EXAMPLES: 1.0}) for n, (t, _) in results.items()})
        expected = epsilon(torch.tensor([[1.5, 1.0, r]], dtype=torch.float64), 1e-5)
        assert current.scalars[CLIENT_DP_EPSILON] == pytest.approx(expected)
        assert current.scalars[CLIPPING_NORM] == 1.0
    assert 0 < current.scalars[CLIENT_DP_EPSILON] < math.inf


def test_clip_update_bounds_the_norm_and_leaves_small_updates():
    current = {"w": torch.zeros(3), "n": torch.tensor(4)}
    big, was = clip_update(current, {"w": torch.tensor([3.0, 4.0, 0.0]), "n": torch.tensor(6)}, 1.0)
    assert was and torch.allclose(big["w"], torch.tensor([0.6, 0.8, 0.0]))
    assert big["n"].item() == 6  # integer counters are not clipped
    small, was = clip_update(current, {"w": torch.tensor([0.1, 0.0, 0.0]), "n": torch.tensor(6)}, 1.0)
    assert not was and torch.equal(small["w"], torch.tensor([0.1, 0.0, 0.0]))


def test_a_server_with_its_own_aggregation_is_refused():
    with pytest.raises(PrivacyError, match="aggregates by its own rule"):
        private_algorithm(feddyn(SETTINGS, num_clients=3), Privacy(client_dp=ClientDP()))


def test_snapshots_do_not_unspend_privacy():
    import copy

    server = ours(ClientDP())
    snap = copy.deepcopy(server)
    server.ledger.releases.append(1.0)
    assert snap.ledger.releases == [1.0]  # the ledger is shared, not copied


def test_flower_leaves_0d_arrays_unclipped():
    """Round 1 by hand: Flower's `scale` is the plain mean of the replies' (unclipped), ours is
    the current value plus the mean of the clipped updates."""
    model = weights_model()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rounds = client_results(initial, rounds=1)
    theirs = run_flower(DifferentialPrivacyServerSideFixedClipping(FedAvg(), 0.0, 0.5, len(EXAMPLES)),
                        initial, uniform(rounds))[0]
    mine = run_ours(ours(ClientDP(noise_multiplier=0.0, clipping_norm=0.5)), model, rounds)[0]
    replies = [t for t, _ in rounds[0].values()]
    plain = sum(t["scale"].double() for t in replies) / len(replies)
    clipped = sum(clip_update(initial, t, 0.5)[0]["scale"].double() for t in replies) / len(replies)
    assert theirs["scale"].double().item() == pytest.approx(plain.item(), abs=1e-6)
    assert mine["scale"].double().item() == pytest.approx(clipped.item(), abs=1e-6)
    assert abs(plain.item() - clipped.item()) > 0.01

"""The one-run audit of DP-SGD (fedcare.privacy.canaries): gradient canaries at the client,
their scores in its privacy report, the auditor's epsilon-hat per client and pooled, and the
soundness check, which fires when the accountant is told more noise than was added."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedcare.algorithms import fedavg, pfdl
from fedcare.algorithms.base import DP_EPSILON
from fedcare.algorithms.training import ClientData, TrainSettings
from fedcare.config import DPSGD, Privacy, PrivacyAudit
from fedcare.privacy import PrivacyError, private_algorithm
from fedcare.privacy.canaries import DP_AUDIT, SCORES, GradientCanaries, canary_inclusion
from fedcare.privacy.dp_sgd import LEDGER, PerExampleClipNoise
from fedcare.privacy.one_run import audit
from fedcare.runtime.federation import Federation

M = 300


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(20, 32), nn.ReLU())
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        return self.head(self.body(x)).squeeze(1)


def data(seed: int, n: int = 64) -> ClientData:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    return ClientData(x, (x[:, 0] + 0.5 * torch.randn(n, generator=g) > 0).float())


def run(privacy: Privacy, rounds: int = 3, algorithm=fedavg, seed: int = 4) -> tuple[Federation, list[dict]]:
    settings = TrainSettings(lr=0.5, batch_size=16, local_epochs=2)
    fed = Federation(MLP(), private_algorithm(algorithm(settings), privacy), seed=seed)
    infos = [fed.run_round("train", rnd, {0: data(0), 1: data(1)}) for rnd in range(1, rounds + 1)]
    return fed, infos


def test_each_canary_is_in_with_probability_one_half_from_the_auditors_seed():
    bits = canary_inclusion(7, 3, 4000)
    assert 0.47 < bits.mean() < 0.53
    assert np.array_equal(bits, canary_inclusion(7, 3, 4000))  # the auditor draws them again
    assert not np.array_equal(bits, canary_inclusion(7, 4, 4000))  # another client, other bits
    canaries = GradientCanaries(MLP(), 7, 3, M, norm=1.0)
    assert torch.equal(canaries.included, torch.from_numpy(bits[:M]))
    flat = {(n, int(k)) for n, (_, offsets) in canaries.groups.items() for k in offsets}
    assert len(flat) == M  # distinct coordinates
    assert sorted(int(i) for positions, _ in canaries.groups.values() for i in positions) == list(range(M))
    with pytest.raises(PrivacyError, match="the model has 705"):
        GradientCanaries(MLP(), 7, 3, 1000, norm=1.0)


def test_without_dp_the_included_canaries_stand_out_and_bound_epsilon_above_zero():
    fed, infos = run(Privacy(audit=PrivacyAudit(canaries=M)))
    result = infos[-1][DP_AUDIT]
    assert set(result["clients"]) == {"0", "1"}
    for client, r in result["clients"].items():
        assert r["m"] == M and r["epsilon"] is None and r["p_value"] is None  # no DP: no claim to test
        assert r["epsilon_hat"] > 0.5 and r["v"] > 0.75 * r["r"]
    pooled = result["pooled"]
    assert pooled["m"] == 2 * M and pooled["epsilon_hat"] > 0.5 and pooled["epsilon"] is None
    assert DP_EPSILON + "_clients" not in infos[-1]  # no DP-SGD: no epsilon to report
    # what the client reported: one score per canary, numbers only
    report = fed.privacy_spent({0: data(0)})[0]
    assert len(report[SCORES]) == M and all(isinstance(s, float) for s in report[SCORES])
    scores, bits = np.array(report[SCORES]), canary_inclusion(4, 0, M)
    assert scores[bits].mean() > scores[~bits].mean() + 3 * scores[~bits].std() / math.sqrt((~bits).sum())


def test_under_dp_sgd_epsilon_hat_stays_below_epsilon_and_the_ledger_is_the_runs_without_canaries():
    dp = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0)
    fed, infos = run(Privacy(dp_sgd=dp, audit=PrivacyAudit(canaries=M)))
    plain_fed, plain_infos = run(Privacy(dp_sgd=dp))
    for client, r in infos[-1][DP_AUDIT]["clients"].items():
        assert r["epsilon"] == infos[-1][DP_EPSILON + "_clients"][client] > 0
        assert r["epsilon_hat"] <= r["epsilon"] and r["p_value"] > 0.05
    assert infos[-1][DP_AUDIT]["pooled"]["p_value"] > 0.05
    # the canaries change neither q, the steps nor sigma: the same ledger, the same epsilon
    assert torch.equal(fed.state_of(0)[LEDGER], plain_fed.state_of(0)[LEDGER])
    assert infos[-1][DP_EPSILON] == plain_infos[-1][DP_EPSILON]


def test_an_accountant_told_more_noise_than_was_added_is_caught(monkeypatch):
    """The ledger says sigma = 20 (epsilon about 0.2 after these 24 steps at q = 1/4) while the
    hook adds noise of sigma = 0.05: the canaries show the run leaks far more than that."""
    real_call = PerExampleClipNoise.__call__

    def too_little_noise(self, model, batch_size):
        self.noise_multiplier = 0.05  # the ledger still records the configured 20
        return real_call(self, model, batch_size)

    monkeypatch.setattr(PerExampleClipNoise, "__call__", too_little_noise)
    _, infos = run(Privacy(dp_sgd=DPSGD(noise_multiplier=20.0, max_grad_norm=1.0), audit=PrivacyAudit(canaries=M)))
    pooled = infos[-1][DP_AUDIT]["pooled"]
    assert pooled["epsilon"] < 0.3 < 0.6 < pooled["epsilon_hat"]
    # guesses this good are all but impossible under the claimed epsilon (the delta term sets the floor)
    assert pooled["p_value"] < 1e-3


def test_personal_models_are_scored_and_fine_tuning_steps_carry_the_canaries():
    _, infos = run(Privacy(audit=PrivacyAudit(canaries=M)), algorithm=lambda s: pfdl(s, finetune_epochs=1))
    assert all(r["epsilon_hat"] > 0 for r in infos[-1][DP_AUDIT]["clients"].values())


def test_a_meta_step_outside_the_loop_is_refused():
    from fedcare.algorithms import perfedavg

    with pytest.raises(PrivacyError, match="privacy.audit.canaries: perfedavg takes gradient steps outside"):
        private_algorithm(perfedavg(TrainSettings()), Privacy(audit=PrivacyAudit(canaries=10)))


def test_the_auditor_pools_every_clients_canaries():
    rng = np.random.default_rng(0)
    from fedcare.privacy.canaries import CanaryAudit

    reports = {c: {SCORES: (canary_inclusion(1, c, 200) + rng.normal(0, 1, 200)).tolist(), DP_EPSILON: 2.0 + c}
               for c in range(3)}
    result = CanaryAudit(200, 1e-5, 0.95)(1, reports)[DP_AUDIT]
    expected = audit(np.concatenate([reports[c][SCORES] for c in range(3)]),
                     np.concatenate([canary_inclusion(1, c, 200) for c in range(3)]), 1e-5)
    assert result["pooled"]["epsilon_hat"] == pytest.approx(expected.epsilon_hat)
    assert result["pooled"]["epsilon"] == 4.0  # the claim: every canary within the largest epsilon

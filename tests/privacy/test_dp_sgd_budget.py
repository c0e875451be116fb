"""DP-SGD's Poisson sampling and the privacy budget (target_epsilon) for DP-SGD and
client-level DP (issue 26, items 2 and 3):

- Poisson batches have the mean size q n and vary; an epoch is int(1/q) steps; the ledger
  gives the accountant that q and those steps; an empty batch is a step of noise alone;
- the noise multiplier calibrated from target_epsilon spends at most the target over the
  planned steps; the budget stops a client at the last step that keeps epsilon <= target
  (mid-epoch), its later rounds are recorded as skipped, and the whole run's epsilon per
  client is what the client reports;
- client-level DP: the calibrated sigma, and clients left out once the next round would cross.
"""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from fedcare.algorithms import fedavg, pfdl
from fedcare.algorithms.base import DP_EPSILON
from fedcare.algorithms.training import TrainSettings, train_epochs
from fedcare.config import DPSGD, ClientDP, Privacy
from fedcare.privacy import private_algorithm, private_model
from fedcare.privacy.client_dp import CLIENT_DP_EPSILON
from fedcare.privacy.dp_sgd import LEDGER, SIGMA, PerExampleClipNoise, PoissonBatches, calibrated_sigma, epsilon
from fedcare.runtime.federation import Federation

from support.tiny import Linear, linear_data, tiny_data, tiny_model


def federation(settings: TrainSettings, privacy: Privacy, algorithm=fedavg, **kw) -> Federation:
    return Federation(private_model(tiny_model(), privacy), private_algorithm(algorithm(settings, **kw), privacy), seed=1)


def test_poisson_batches_have_the_mean_size_q_n_and_vary():
    sampler, g = PoissonBatches(), torch.Generator().manual_seed(0)
    n, batch = 200, 20
    assert sampler.steps_per_epoch(n, batch) == 10  # int(1/q), Opacus's
    sizes = [len(idx) for _ in range(200) for idx in sampler.epoch(n, batch, g)]
    assert len(sizes) == 200 * 10
    assert sum(sizes) / len(sizes) == pytest.approx(batch, abs=0.4)  # SE of the mean: 0.09
    assert min(sizes) < batch < max(sizes)  # variable, not fixed-size


def test_poisson_batches_are_opacus_uniform_with_replacement_sampler_s():
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    ours = [idx.tolist() for idx in PoissonBatches().epoch(50, 5, torch.Generator().manual_seed(3))]
    theirs = list(UniformWithReplacementSampler(num_samples=50, sample_rate=0.1, generator=torch.Generator().manual_seed(3)))
    assert ours == theirs and len(ours) == 10


def test_the_accountant_is_given_poisson_q_and_int_1_over_q_steps():
    """n = 40, batch 12: q = 0.3, int(1/q) = 3 steps an epoch (shuffling would take 4)."""
    fed = federation(TrainSettings(lr=0.05, batch_size=12, local_epochs=2), Privacy(dp_sgd=DPSGD()))
    data = {0: tiny_data(0)}
    assert len(data[0]) == 40
    fed.run_round("train", 1, data)
    assert fed.state_of(0)[LEDGER].tolist() == [[1.0, 0.3, 2 * 3]]


def test_an_empty_poisson_batch_is_a_step_of_noise_alone():
    model, data = Linear(), linear_data()
    before = {k: v.clone() for k, v in model.state_dict().items()}

    class Empty:
        def steps_per_epoch(self, n, batch_size):
            return 3

        def epoch(self, n, batch_size, generator):
            yield from (torch.zeros(0, dtype=torch.long) for _ in range(3))

    for sigma, moves in ((0.0, False), (2.0, True)):
        from opacus import GradSampleModule

        model.load_state_dict(before)
        hook = PerExampleClipNoise(DPSGD(noise_multiplier=sigma, max_grad_norm=1.0))
        hook.generator, hook.divisor = torch.Generator().manual_seed(0), 8.0
        settings = TrainSettings(lr=0.1, batch_size=8, local_epochs=1, gradient_hook=hook, batches=Empty())
        wrapped = GradSampleModule(model, strict=False)
        loss = train_epochs(model, model.parameters(), data, settings, generator=torch.Generator().manual_seed(1))
        wrapped.cleanup()
        assert hook.steps == 3
        assert math.isnan(loss)  # no example seen: no loss to report
        changed = any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
        assert changed is moves


class Flat(torch.nn.Module):
    """No normalisation layer: a GroupNorm with one value per group (tiny_model's BatchNorm1d
    replaced) cannot take a batch of one, which Poisson sampling draws."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(64, 1)

    def forward(self, x):
        return self.fc(x.flatten(1)).squeeze(1)


def test_poisson_training_with_tiny_q_has_empty_batches_and_stays_finite():
    """batch 1 of 40: q = 0.025, about a third of the batches are empty."""
    privacy = Privacy(dp_sgd=DPSGD())
    fed = Federation(Flat(), private_algorithm(fedavg(TrainSettings(lr=0.05, batch_size=1, local_epochs=1)), privacy),
                     seed=1)
    info = fed.run_round("train", 1, {0: tiny_data(0)})
    assert fed.state_of(0)[LEDGER].tolist() == [[1.0, 0.025, 40]]
    assert all(torch.isfinite(v).all() for v in fed.global_message.tensors.values())
    assert 0 < info[DP_EPSILON] < math.inf


def first_crossing(sigma: float, q: float, target: float, delta: float) -> int:
    """The last step count with epsilon <= target, by walking step by step."""
    k = 0
    while epsilon(torch.tensor([[sigma, q, k + 1]], dtype=torch.float64), delta) <= target:
        k += 1
    return k


def test_the_budget_stops_dp_sgd_at_the_right_step_and_skips_later_rounds():
    """target 2 at delta 1e-5 planned for 1.5 epochs (6 steps at q = 0.25): sigma is calibrated
    so 6 steps fit; training one epoch (4 steps) a round stops mid-round 2, round 3 is skipped."""
    config = DPSGD(target_epsilon=2.0, budget_epochs=1.5, delta=1e-5)
    settings = TrainSettings(lr=0.05, batch_size=10, local_epochs=1)
    fed = federation(settings, Privacy(dp_sgd=config))
    data = {0: tiny_data(0), 1: tiny_data(1)}
    sigma = calibrated_sigma(config, 40, 10)
    stop = first_crossing(sigma, 0.25, 2.0, 1e-5)
    assert stop >= 6  # the planned steps fit under the budget
    assert 4 < stop < 8  # ... and the stop falls inside round 2 (steps 5-8) at this target
    infos = [fed.run_round("train", r, data) for r in (1, 2, 3)]
    for c in data:
        assert fed.state_of(c)[SIGMA].item() == pytest.approx(sigma)
        assert fed.state_of(c)[LEDGER][:, 2].sum().item() == stop
    assert "skipped" not in infos[0] and "skipped" not in infos[1]
    assert infos[2]["skipped"] == ["0", "1"] and infos[2]["clients"] == 0
    spent = fed.privacy_spent(data)
    for c in data:
        assert spent[c][DP_EPSILON] <= 2.0 < epsilon(torch.tensor([[sigma, 0.25, stop + 1]], dtype=torch.float64), 1e-5)
        assert spent[c]["dp_steps"] == stop
        assert infos[2]["dp_epsilon_clients"][str(c)] == pytest.approx(spent[c][DP_EPSILON])


def test_the_whole_run_epsilon_counts_the_last_fine_tuning():
    """PFDL's fine-tuning after the aggregation is in the round's per-client epsilon (asked of
    the client after it), not only in the fit's."""
    fed = federation(TrainSettings(lr=0.05, batch_size=10, local_epochs=1), Privacy(dp_sgd=DPSGD()), pfdl,
                     finetune_epochs=2)
    info = fed.run_round("train", 1, {0: tiny_data(0)})
    spent = fed.privacy_spent({0: tiny_data(0)})[0]
    assert spent["dp_steps"] == 4 + 2 * 4
    assert info["dp_epsilon_clients"]["0"] == spent[DP_EPSILON] > info[DP_EPSILON]  # the fit's: 4 steps


def test_client_dp_budget_calibrates_sigma_and_leaves_out_clients_that_would_cross():
    config = ClientDP(target_epsilon=3.0, budget_rounds=3, clipping_norm=1.0)
    fed = federation(TrainSettings(lr=0.05, batch_size=10, local_epochs=1), Privacy(client_dp=config))
    sigma = fed.server.config.noise_multiplier
    rounds = first_crossing(sigma, 1.0, 3.0, 1e-5)
    assert rounds >= 3
    data = {0: tiny_data(0), 1: tiny_data(1)}
    infos = [fed.run_round("train", r, data) for r in range(1, rounds + 3)]
    for r, info in enumerate(infos, start=1):
        if r <= rounds:
            assert "skipped" not in info and info["clients"] == 2
        else:
            assert info["skipped"] == ["0", "1"] and info["clients"] == 0
    assert all(e <= 3.0 for e in infos[-1]["client_dp_epsilon_clients"].values())
    assert infos[-1][CLIENT_DP_EPSILON] <= 3.0  # nothing released past the budget


@pytest.mark.parametrize("table, kwargs, message", [
    (DPSGD, {"target_epsilon": 1.0}, "needs budget_epochs"),
    (DPSGD, {"target_epsilon": 1.0, "budget_epochs": 2, "noise_multiplier": 1.0}, "not both"),
    (ClientDP, {"target_epsilon": 1.0}, "needs budget_rounds"),
    (ClientDP, {"budget_rounds": 3}, "with target_epsilon only"),
])
def test_budget_options_are_checked(table, kwargs, message):
    with pytest.raises(ValidationError, match=message):
        table(**kwargs)


def test_the_budget_table_per_client_flags_shuffling_as_approximate():
    from fedcare.privacy.report import budget_table

    rounds = [{"type": "round", "method": "FedAvg", "round": r, "dp_epsilon_clients": {"a": 0.5 * r, "b": 0.4 * r},
               **({"skipped": ["b"]} if r == 3 else {})} for r in (1, 2, 3)]
    shuffled = budget_table(rounds, {"privacy": {"dp_sgd": {"sampling": "shuffle", "target_epsilon": 1.5,
                                                            "delta": 1e-5}}})
    assert [row[:5] for row in shuffled.rows] == [
        ["FedAvg", "DP-SGD (approximate: shuffled)", "a", "1.50", "1.5"],
        ["FedAvg", "DP-SGD (approximate: shuffled)", "b", "1.20", "1.5"]]
    assert [row[-1] for row in shuffled.rows] == ["0", "1"]  # b skipped round 3
    poisson = budget_table(rounds, {"privacy": {"dp_sgd": {}}})
    assert poisson.rows[0][1] == "DP-SGD" and poisson.rows[0][4] == "none"
    whole = budget_table([{"type": "privacy_budget", "method": "PFDL", "protection": "dp_sgd", "client": "a",
                           "epsilon": 2.25, "target_epsilon": None, "delta": 1e-5, "steps": 12, "sampling": "poisson"}])
    assert whole.rows == [["PFDL", "DP-SGD", "a", "2.25", "none", "1e-05", "12", "0"]]
    assert budget_table([{"type": "round", "method": "FedAvg", "round": 1}]) is None


def test_clients_that_spent_the_same_share_a_row():
    from fedcare.privacy.report import budget_table

    same = [{"type": "privacy_budget", "method": "FedAvg", "protection": "dp_sgd", "client": c, "epsilon": 3.0,
             "target_epsilon": 4.0, "delta": 1e-5, "steps": 9, "sampling": "poisson"} for c in "abc"]
    table = budget_table(same)
    assert table.rows == [["FedAvg", "DP-SGD", "all 3", "3.00", "4", "1e-05", "9", "0"]]
    assert len(table.csv_rows) == 3


def test_under_secure_aggregation_an_out_of_budget_client_weighs_nothing():
    """Budget for a quarter epoch (one step): round 1 trains one step each, round 2 leaves
    the global model as it was (the skipped replies have weight 0 in the masked sum)."""
    from fedcare.config import SecureAggregation

    privacy = Privacy(dp_sgd=DPSGD(target_epsilon=1.0, budget_epochs=0.25), secure_aggregation=SecureAggregation())
    fed = federation(TrainSettings(lr=0.05, batch_size=10, local_epochs=1), privacy)
    data = {c: tiny_data(c) for c in range(3)}
    fed.run_round("train", 1, data)
    after_one = {k: v.clone() for k, v in fed.global_message.tensors.items()}
    assert all(fed.state_of(c)[LEDGER][:, 2].sum().item() >= 1 for c in data)
    info = fed.run_round("train", 2, data)
    assert all(torch.equal(after_one[k], v) for k, v in fed.global_message.tensors.items())
    assert info["n_train"] == 0
    assert all(e <= 1.0 for e in info["dp_epsilon_clients"].values())


@pytest.mark.parametrize("privacy, key", [
    (Privacy(dp_sgd=DPSGD(target_epsilon=0.01, budget_epochs=2)), "privacy.dp_sgd.target_epsilon = 0.01"),
    (Privacy(dp_sgd=DPSGD(target_epsilon=0.005, budget_epochs=2, accountant="prv")), "privacy.dp_sgd.target_epsilon"),
    (Privacy(client_dp=ClientDP(target_epsilon=0.01, budget_rounds=3)), "privacy.client_dp.target_epsilon = 0.01"),
])
def test_a_budget_no_noise_reaches_is_refused_when_the_methods_are_built_naming_the_key(privacy, key):
    """Below the accountant's floor at delta (about 0.103 for RDP at 1e-5) Opacus's calibration
    gives up with 'The privacy budget is too low': refused before any data are read, naming the key."""
    from fedcare.privacy.dp_sgd import PrivacyError

    with pytest.raises(PrivacyError, match=key.replace(".", r"\.") + ".*raise target_epsilon or delta"):
        private_algorithm(fedavg(TrainSettings(lr=0.05, batch_size=10, local_epochs=1)), privacy)


def test_a_budget_the_calibration_cannot_reach_names_the_key():
    from fedcare.privacy.dp_sgd import PrivacyError, calibrate

    with pytest.raises(PrivacyError, match=r"privacy\.dp_sgd\.target_epsilon = 0\.01: no noise multiplier"):
        calibrate("privacy.dp_sgd", 0.01, 1e-5, "rdp", 0.1, 100)

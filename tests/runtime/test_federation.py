"""The in-process federation (`fedcare.runtime.federation`): a seed decides every model, early
stopping restores each client's best model, clients are sampled by a deterministic fraction, and
every algorithm runs a short federation the same way twice."""

import math

import torch

from fedcare.algorithms import centralized, fedavg, pfdl
from fedcare.algorithms.fedbn import fedbn
from fedcare.algorithms.feddyn import feddyn
from fedcare.algorithms.fedper import fedper
from fedcare.algorithms.fedprox import fedprox
from fedcare.algorithms.fedrep import fedrep
from fedcare.algorithms.training import ClientData, TrainSettings
from fedcare.runtime.federation import Federation

from support.tiny import tiny_data, tiny_model


SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)
TRAIN = {1: tiny_data(1), 2: tiny_data(2), 3: tiny_data(3, n=24)}
VAL = {1: tiny_data(11), 2: tiny_data(12), 3: tiny_data(13)}


def _run(seed: int, algorithm=None, fraction: float = 1.0):
    federation = Federation(tiny_model(), algorithm or pfdl(SETTINGS, finetune_epochs=1), seed, client_fraction=fraction)
    result = federation.train_phase("phase", TRAIN, VAL, max_rounds=4, patience=2)
    return federation, result


def test_same_seed_gives_identical_models_and_a_different_seed_does_not():
    a, ra = _run(7)
    b, rb = _run(7)
    c, _ = _run(8)
    assert [h["val_loss"] for h in ra.history] == [h["val_loss"] for h in rb.history]
    for k in a.global_message.tensors:
        assert torch.equal(a.global_message.tensors[k], b.global_message.tensors[k])
    assert any(not torch.equal(a.global_message.tensors[k], c.global_message.tensors[k]) for k in a.global_message.tensors)


def test_early_stopping_restores_each_clients_best_model():
    federation = Federation(tiny_model(), pfdl(TrainSettings(lr=0.5, batch_size=8, local_epochs=3), finetune_epochs=1), 3)
    result = federation.train_phase("phase", TRAIN, VAL, max_rounds=12, patience=2)
    losses = [h["val_loss"] for h in result.history]
    assert result.best_val_loss == min(losses)
    assert result.best_round == losses.index(min(losses)) + 1
    assert result.rounds <= result.best_round + 2
    # after restoring, the personal models give the best round's validation loss again
    restored, _ = federation.validation_loss(VAL)
    assert math.isclose(restored, result.best_val_loss, rel_tol=1e-6)


def test_client_sampling_is_a_deterministic_fraction():
    federation = Federation(tiny_model(), fedavg(SETTINGS), 5, client_fraction=0.5)
    clients = list(range(10))
    picks = [federation.sample("p", r, clients) for r in range(1, 6)]
    assert all(len(p) == 5 for p in picks)
    assert len({tuple(p) for p in picks}) > 1
    assert picks == [federation.sample("p", r, clients) for r in range(1, 6)]


def test_centralized_trains_one_pooled_participant():
    federation, result = _run(1, centralized(SETTINGS))
    assert all(h["clients"] == 1 and h["n_train"] == sum(len(d) for d in TRAIN.values()) for h in result.history)


def test_every_algorithm_runs_a_short_federation_deterministically():
    data = {1: tiny_data(1, n=20), 2: tiny_data(2, n=20)}
    for make in (lambda: fedprox(SETTINGS, mu=0.1), lambda: fedbn(SETTINGS), lambda: fedper(SETTINGS),
                 lambda: fedrep(SETTINGS), lambda: feddyn(SETTINGS)):
        results = []
        for _ in range(2):
            federation = Federation(tiny_model(), make(), seed=3)
            info = federation.run_round("p", 1, data)
            results.append((info["train_loss"], federation.evaluate({1: ClientData(data[1].x, data[1].y)}, "loss")[1]["loss"]))
        assert results[0] == results[1]

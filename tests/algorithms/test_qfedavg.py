"""q-FedAvg: the server's step by hand (q = 0.5, L = 10, uniform and by examples); with q = 0 it is
FedAvg; the client reports the loss at the model it received. Its aggregate equals Flower's
QFedAvg: tests/algorithms/test_server_optimizers.py."""

from __future__ import annotations

import copy

import pytest
import torch

from fedcare.algorithms.base import NUM_EXAMPLES, TRAIN_LOSS, ClientHalf, ServerHalf
from fedcare.algorithms.messages import Message
from fedcare.algorithms.qfedavg import LOSS_AT_GLOBAL, QFedAvgClient, QFedAvgServer, qfedavg
from fedcare.algorithms.training import Randomness, TrainSettings, predict
from fedcare.tasks import BINARY

from support.flower_offline import client_results, run_ours, weights_model
from support.tiny import tiny_data, tiny_model


SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)


def test_qfedavg_server_by_hand():
    """Two clients, one 2-vector and an integer counter; q = 0.5, L = 10."""
    current = Message({"w": torch.tensor([1.0, 2.0]), "count": torch.tensor(4)})
    replies = {
        "a": Message({"w": torch.tensor([0.8, 2.1]), "count": torch.tensor(6)}, {NUM_EXAMPLES: 10.0, LOSS_AT_GLOBAL: 0.64}),
        "b": Message({"w": torch.tensor([1.3, 1.6]), "count": torch.tensor(10)}, {NUM_EXAMPLES: 30.0, LOSS_AT_GLOBAL: 2.25}),
    }
    # Δ_a = 10·(0.2, −0.1) = (2, −1), ‖Δ_a‖² = 5; F_a^½ = 0.8, F_a^−½ = 1.25: h_a = 0.5·1.25·5 + 10·0.8 = 11.125
    # Δ_b = 10·(−0.3, 0.4) = (−3, 4), ‖Δ_b‖² = 25; F_b^½ = 1.5, F_b^−½ = 2/3: h_b = 0.5·(2/3)·25 + 15 = 23.3333
    # w' = w − (0.8·Δ_a + 1.5·Δ_b) / (h_a + h_b) = (1, 2) − (−2.9, 5.2) / 34.458333
    expected = torch.tensor([1.0 + 2.9 / 34.458333, 2.0 - 5.2 / 34.458333])
    out = QFedAvgServer(q=0.5, lipschitz=10.0).aggregate(current, replies)
    torch.testing.assert_close(out.tensors["w"], expected, atol=1e-6, rtol=0)
    assert out.tensors["count"].item() == 8  # uniform average of 6 and 10
    # weighting="examples": Δ_k and h_k scaled by p = (¼, ¾)
    weighted = QFedAvgServer(q=0.5, lipschitz=10.0, weighting="examples").aggregate(current, replies)
    num = 0.25 * 0.8 * torch.tensor([2.0, -1.0]) + 0.75 * 1.5 * torch.tensor([-3.0, 4.0])
    torch.testing.assert_close(weighted.tensors["w"], torch.tensor([1.0, 2.0]) - num / (0.25 * 11.125 + 0.75 * 70 / 3),
                               atol=1e-6, rtol=0)


@pytest.mark.parametrize("weighting", ["uniform", "examples"])
def test_qfedavg_with_q_zero_is_fedavg(weighting):
    model = weights_model()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rounds = client_results(initial, rounds=1)
    q0 = run_ours(QFedAvgServer(q=0.0, lipschitz=3.0, weighting=weighting), model, rounds)
    plain = run_ours(ServerHalf(weighting=weighting), model, rounds)
    for k in plain[0]:
        torch.testing.assert_close(q0[0][k], plain[0][k], atol=1e-6, rtol=0)


def test_qfedavg_client_reports_the_loss_at_the_global_model():
    """F_k(w^t): the received model's loss on the client's training data, before training;
    the rest of the reply is exactly FedAvg's client's."""
    algorithm = qfedavg(SETTINGS)
    assert (algorithm.server.q, algorithm.server.lipschitz, algorithm.server.weighting) == (0.001, 100.0, "uniform")
    model, data = tiny_model(), tiny_data(5)
    message = algorithm.server.initial_message(model)
    state = algorithm.client.init_state(model)
    _, expected = predict(copy.deepcopy(model), data, BINARY)
    rng = Randomness(0, "t", 1, 1)
    reply, _ = algorithm.client.fit(model, message, state, data, rng)
    plain, _ = ClientHalf(SETTINGS).fit(tiny_model(), message, state, data, rng)
    assert reply.scalars[LOSS_AT_GLOBAL] == pytest.approx(expected, abs=1e-7)
    assert reply.scalars[TRAIN_LOSS] == plain.scalars[TRAIN_LOSS] != pytest.approx(expected)
    assert set(reply.tensors) == set(plain.tensors)
    assert all(torch.equal(reply.tensors[k], plain.tensors[k]) for k in plain.tensors)
    assert isinstance(algorithm.client, QFedAvgClient)

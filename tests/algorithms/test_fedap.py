"""FedAP / FedHealth 2: the weight matrix by hand, the statistics, per-client payloads."""

import numpy as np
import pytest
import torch

from fedcare.algorithms.fedap import fedap, fedap_weights, input_statistics, statistics_distance
from fedcare.algorithms.messages import Message
from fedcare.algorithms.training import Randomness, TrainSettings
from fedcare.runtime.federation import Federation

from support.tiny import tiny_data, tiny_model


SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)


def test_weight_matrix_matches_hand_computation():
    d = np.array([[0.0, 1.0, 2.0], [1.0, 0.0, 4.0], [2.0, 4.0, 0.0]])
    w = fedap_weights(d, lam=0.5)
    # row 0: 1/d = [-, 1, 0.5] -> (1 - 0.5) * [1, 0.5] / 1.5
    assert np.allclose(w[0], [0.5, 1 / 3, 1 / 6])
    assert np.allclose(w[1], [0.5 * 1 / 1.25, 0.5, 0.5 * 0.25 / 1.25])  # 1/d = [1, -, 0.25]
    assert np.allclose(w.sum(axis=1), 1.0) and np.allclose(np.diag(w), 0.5)
    assert w[2, 0] > w[2, 1]  # the closer client weighs more


def test_zero_distance_dominates_like_the_authors_code():
    w = fedap_weights(np.array([[0.0, 0.0, 3.0], [0.0, 0.0, 3.0], [3.0, 3.0, 0.0]]), lam=0.2)
    assert w[0, 1] == pytest.approx(0.8) and w[0, 2] < 1e-12


def test_statistics_distance_is_the_sum_of_per_layer_w2():
    a = {"l1.mean": torch.tensor([0.0, 0.0]), "l1.var": torch.tensor([1.0, 4.0]),
         "l2.mean": torch.tensor([1.0]), "l2.var": torch.tensor([1.0])}
    b = {"l1.mean": torch.tensor([3.0, 0.0]), "l1.var": torch.tensor([1.0, 16.0]),
         "l2.mean": torch.tensor([1.0]), "l2.var": torch.tensor([9.0])}
    # l1: sqrt(9 + (2 - 4)^2) = sqrt(13); l2: sqrt(0 + (1 - 3)^2) = 2
    assert statistics_distance(a, b) == pytest.approx(np.sqrt(13) + 2)


def test_input_statistics_are_the_moments_of_each_batchnorm_input():
    model = tiny_model().eval()
    data = tiny_data(1, n=20)
    stats = input_statistics(model, data, "bn", batch_size=7)  # batches must not change the result
    x = data.x.float() / 255
    conv_out = model.features[0](x)
    assert torch.allclose(stats["features.1.mean"], conv_out.mean(dim=(0, 2, 3)), atol=1e-5)
    assert torch.allclose(stats["features.1.var"], conv_out.var(dim=(0, 2, 3), unbiased=False), atol=1e-5)
    assert set(stats) == {"features.1.mean", "features.1.var", "classifier.2.mean", "classifier.2.var"}
    d_stats = input_statistics(model, data, "classifier")
    assert set(d_stats) == {"classifier.4.mean", "classifier.4.var"}  # the last Linear's input


def test_batchnorm_never_leaves_a_client():
    algorithm = fedap(SETTINGS)
    model = tiny_model()
    message, state = algorithm.server.initial_message(model), algorithm.client.init_state(model)
    reply, state = algorithm.client.fit(model, message, state, tiny_data(1), Randomness(0, "t", 1, 1))
    bn_keys = {k for k in model.state_dict() if k.startswith(("features.1.", "classifier.2."))}
    assert set(reply.tensors) == set(model.state_dict()) - bn_keys
    assert set(state) == bn_keys


def test_each_client_receives_its_own_weighted_aggregate():
    algorithm = fedap(SETTINGS, lam=0.5)
    federation = Federation(tiny_model(), algorithm, seed=0)
    data = {1: tiny_data(1), 2: tiny_data(2), 3: tiny_data(30, size=8)}
    federation.run_setup("setup", data)
    server = federation.server
    assert set(server.statistics) == {1, 2, 3}
    weights = server.weight_matrix([1, 2, 3])
    assert np.allclose(weights.sum(axis=1), 1) and np.allclose(np.diag(weights), 0.5)

    replies = {c: Message({"w": torch.full((2,), float(c))}, {"num_examples": 10.0}) for c in (1, 2, 3)}
    server.aggregate(Message({"w": torch.zeros(2)}), replies)
    for i, c in enumerate((1, 2, 3)):
        expected = sum(weights[i, j] * float(o) for j, o in enumerate((1, 2, 3)))
        assert torch.allclose(server.message_for(c, Message()).tensors["w"], torch.full((2,), expected, dtype=torch.float32))

    federation = Federation(tiny_model(), fedap(SETTINGS), seed=0)
    federation.run_setup("setup", data)
    federation.run_round("p", 1, data)
    m1, m2 = federation.message_for(1).tensors, federation.message_for(2).tensors
    assert any(not torch.equal(m1[k], m2[k]) for k in m1)


def test_before_setup_the_server_averages_like_fedbn():
    algorithm = fedap(SETTINGS)
    replies = {c: Message({"w": torch.full((1,), float(c))}, {"num_examples": 1.0}) for c in (1, 3)}
    out = algorithm.server.aggregate(Message({"w": torch.zeros(1)}), replies)
    assert out.tensors["w"].item() == 2.0 and algorithm.server.message_for(1, out) is out


@pytest.mark.parametrize("statistics", ["bn", "classifier"])
def test_the_server_expects_exactly_the_statistics_an_honest_client_sends(statistics):
    """The setup check (`FedAPServer.setup_reply_problem`) knows each statistic's name and shape
    from the model: an honest reply passes; a layer more, or a negative variance, does not."""
    algo = fedap(SETTINGS, statistics=statistics)
    model = tiny_model()
    message = algo.server.initial_message(model)
    reply = algo.client.setup(model, message, algo.client.init_state(model), tiny_data(1), Randomness(0, "s", 1, 0))
    assert set(algo.server.expected) == set(reply.tensors) and algo.server.setup_reply_problem(reply) is None
    extra = Message({**reply.tensors, "classifier.9.mean": torch.zeros(3)}, reply.scalars)
    assert algo.server.setup_reply_problem(extra) == "unexpected statistic 'classifier.9.mean'"
    var = next(k for k in reply.tensors if k.endswith(".var"))
    negative = Message({**reply.tensors, var: -reply.tensors[var] - 1}, reply.scalars)
    assert algo.server.setup_reply_problem(negative) == f"statistic {var!r} holds a negative variance"

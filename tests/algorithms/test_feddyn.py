"""FedDyn: the server's correction and the client's linear term by hand over two rounds; with no
correction and one step it is FedAvg; the client's correction carries across rounds."""

import io

import pytest
import torch
from torch import nn

from fedcare.algorithms import fedavg
from fedcare.algorithms.feddyn import FedDynServer, feddyn, gradient_key
from fedcare.algorithms.messages import Message
from fedcare.algorithms.training import TrainSettings
from fedcare.runtime.federation import Federation

from support.tiny import ONE_FIT, fit_once, parameter_names, record_fits, tiny_data, tiny_model


SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)


class Hand(nn.Module):
    """One parameter and one buffer: the server's formulas by hand."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0, 2.0]))
        self.register_buffer("b", torch.zeros(2))


def _r(w, b, n=1.0):
    return Message({"w": torch.tensor(w), "b": torch.tensor(b)}, {"num_examples": n, "train_loss": 0.0})


def test_feddyn_server_matches_hand_computation_over_two_rounds():
    server = FedDynServer(alpha=0.5)
    current = server.initial_message(Hand())
    assert set(server.h) == {"w"}  # buffers are not in h
    # round 1: drift = (2,2)−(1,2) + (0,4)−(1,2) = (0,2); h = −0.5·(0,2)/2 = (0,−0.5)
    # θ = mean (1,3) − h/0.5 = (1,4); the buffer is averaged plainly: (2,3)
    out = server.aggregate(current, {2: _r([0.0, 4.0], [3.0, 5.0]), 1: _r([2.0, 2.0], [1.0, 1.0])})
    assert torch.allclose(server.h["w"], torch.tensor([0.0, -0.5], dtype=torch.float64))
    assert torch.equal(out.tensors["w"], torch.tensor([1.0, 4.0]))
    assert torch.equal(out.tensors["b"], torch.tensor([2.0, 3.0]))
    # round 2 from (1,4): drift = (0,0) + (2,0); h = (0,−0.5) − 0.5·(2,0)/2 = (−0.5,−0.5); θ = (2,4) + (1,1)
    out = server.aggregate(out, {1: _r([1.0, 4.0], [0.0, 0.0]), 2: _r([3.0, 4.0], [2.0, 2.0])})
    assert torch.allclose(server.h["w"], torch.tensor([-0.5, -0.5], dtype=torch.float64))
    assert torch.equal(out.tensors["w"], torch.tensor([3.0, 5.0]))
    assert torch.equal(out.tensors["b"], torch.tensor([1.0, 1.0]))


def test_feddyn_server_divides_by_all_clients_and_weights_the_mean_as_asked():
    replies = {1: _r([2.0, 2.0], [1.0, 1.0], n=1.0), 2: _r([0.0, 4.0], [3.0, 5.0], n=3.0)}
    server = FedDynServer(alpha=0.5, num_clients=4)  # m = 4 clients, 2 took part
    out = server.aggregate(server.initial_message(Hand()), replies)
    # h = −0.5·(0,2)/4 = (0,−0.25); θ = (1,3) + (0,0.5)
    assert torch.equal(out.tensors["w"], torch.tensor([1.0, 3.5]))
    weighted = FedDynServer(alpha=0.5, weighting="examples")
    out = weighted.aggregate(weighted.initial_message(Hand()), replies)
    # mean = (1·(2,2) + 3·(0,4))/4 = (0.5,3.5); h = (0,−0.5); θ = (0.5,4.5); buffer (2.5,4)
    assert torch.allclose(out.tensors["w"], torch.tensor([0.5, 4.5]))
    assert torch.allclose(out.tensors["b"], torch.tensor([2.5, 4.0]))


def test_feddyn_server_needs_the_model_structure_first():
    with pytest.raises(RuntimeError, match="initial_message"):
        FedDynServer().aggregate(Message({"w": torch.zeros(2)}), {1: _r([1.0, 1.0], [0.0, 0.0])})
    with pytest.raises(ValueError):
        feddyn(SETTINGS, alpha=0.0)


def test_feddyn_client_step_adds_the_correction_term_and_updates_it():
    settings = TrainSettings(lr=0.1, batch_size=64, local_epochs=1)  # one full batch: one SGD step
    data = tiny_data(3)
    algorithm = feddyn(settings, alpha=0.3)
    model = tiny_model()
    message = algorithm.server.initial_message(model)
    g = torch.Generator().manual_seed(9)
    state = {k: torch.randn(v.shape, generator=g) for k, v in algorithm.client.init_state(model).items()}
    reply, new_state = algorithm.client.fit(model, message, state, data, ONE_FIT)
    _, _, _, avg_reply, _ = fit_once(fedavg(settings), data=data)
    for name in parameter_names(model):
        g_k = state[gradient_key(name)]
        # at θ = θ^{t−1} the proximal gradient is zero: the step is FedAvg's plus lr·g_k
        assert torch.allclose(reply.tensors[name], avg_reply.tensors[name] + 0.1 * g_k, atol=1e-6), name
        # g_k ← g_k − α(θ_k − θ^{t−1})
        expected = g_k - 0.3 * (reply.tensors[name] - message.tensors[name])
        assert torch.allclose(new_state[gradient_key(name)], expected, atol=1e-7), name


def test_feddyn_with_zero_correction_and_one_step_is_fedavg():
    settings = TrainSettings(lr=0.1, batch_size=64, local_epochs=1)
    _, _, state, reply, _ = fit_once(feddyn(settings, alpha=0.3), data=tiny_data(3))
    _, _, _, avg_reply, _ = fit_once(fedavg(settings), data=tiny_data(3))
    assert all(torch.allclose(reply.tensors[k], avg_reply.tensors[k], atol=1e-7) for k in avg_reply.tensors)
    assert all(torch.count_nonzero(v) == 0 for v in state.values())


def test_feddyn_state_carries_the_correction_across_rounds():
    data = {1: tiny_data(1), 2: tiny_data(2, n=24)}
    alpha = 0.1
    federation = Federation(tiny_model(), feddyn(SETTINGS, alpha=alpha), seed=0)
    calls = record_fits(federation)
    federation.run_round("p", 1, data)
    federation.run_round("p", 2, data)
    by = {(c, rnd): (message, state, reply, new_state) for c, rnd, message, state, reply, new_state in calls}
    for c in (1, 2):
        m1, s1, r1, n1 = by[(c, 1)]
        m2, s2, r2, n2 = by[(c, 2)]
        assert all(torch.count_nonzero(v) == 0 for v in s1.values())  # g_k starts at zero
        assert all(torch.equal(s2[k], n1[k]) for k in n1)  # round 2 starts from round 1's g_k
        for name in parameter_names(federation.model):
            k = gradient_key(name)
            g1 = -alpha * (r1.tensors[name] - m1.tensors[name])
            assert torch.allclose(n1[k], g1, atol=1e-7)
            assert torch.allclose(n2[k], g1 - alpha * (r2.tensors[name] - m2.tensors[name]), atol=1e-7)
    # the global model after round 1 follows the server formula with m = 2 participants
    m1 = by[(1, 1)][0]
    server_h = {}
    for name in parameter_names(federation.model):
        drift = sum(by[(c, 1)][2].tensors[name].double() - m1.tensors[name].double() for c in (1, 2))
        server_h[name] = -alpha * drift / 2
        expected = sum(by[(c, 1)][2].tensors[name].double() for c in (1, 2)) / 2 - server_h[name] / alpha
        assert torch.allclose(by[(1, 2)][0].tensors[name].double(), expected, atol=1e-6), name
    # the state is plain tensors: torch.save / torch.load round-trips it
    buffer = io.BytesIO()
    torch.save(federation.states[1], buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert set(loaded) == set(federation.states[1])
    assert all(torch.equal(loaded[k], federation.states[1][k]) for k in loaded)

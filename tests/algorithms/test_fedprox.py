"""FedProx: the proximal term by hand, over the trainable parameters only; mu = 0 is FedAvg's client
bit for bit, a larger mu keeps the client closer to the weights it received this round."""

import pytest
import torch
from torch import nn

from fedcare.algorithms import fedavg
from fedcare.algorithms.fedprox import fedprox, proximal_term, trainable_pairs
from fedcare.algorithms.training import Randomness, TrainSettings
from fedcare.runtime.federation import Federation

from support.tiny import fit_once, parameter_names, tiny_data, tiny_model


SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)


def _distance(tensors, reference, names):
    return sum(float((tensors[n].double() - reference[n].double()).pow(2).sum()) for n in names) ** 0.5


def test_proximal_term_matches_hand_computation():
    w = nn.Parameter(torch.tensor([3.0, 0.0]))
    v = nn.Parameter(torch.tensor([[4.0]]))
    pairs = [(w, torch.zeros(2)), (v, torch.zeros(1, 1))]  # one norm over both tensors: sqrt(9 + 16) = 5
    assert proximal_term(pairs, mu=0.1, squared=True).item() == pytest.approx(0.05 * 25)
    assert proximal_term(pairs, mu=0.1, squared=False).item() == pytest.approx(0.05 * 5)
    proximal_term(pairs, mu=0.1, squared=True).backward()
    assert torch.allclose(w.grad, 0.1 * torch.tensor([3.0, 0.0]))  # μ (w − w_g)
    w.grad = None
    proximal_term(pairs, mu=0.1, squared=False).backward()
    assert torch.allclose(w.grad, 0.05 * torch.tensor([3.0, 0.0]) / 5)  # (μ/2) (w − w_g) / ‖w − w_g‖
    assert proximal_term([(w, w.detach().clone())], mu=0.1, squared=False) is None  # no NaN at zero


def test_proximal_term_covers_trainable_parameters_only():
    model = tiny_model()
    model.features[0].bias.requires_grad_(False)
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    pairs = trainable_pairs(model, model.state_dict())
    assert len(pairs) == len(names)
    assert not any(p is model.features[0].bias for p, _ in pairs)
    assert all(isinstance(p, nn.Parameter) for p, _ in pairs)  # no running statistics


def test_fedprox_with_mu_zero_is_fedavgs_client_bit_for_bit():
    _, _, _, prox_reply, prox_state = fit_once(fedprox(SETTINGS, mu=0.0), data=tiny_data(4))
    _, _, _, avg_reply, avg_state = fit_once(fedavg(SETTINGS), data=tiny_data(4))
    assert prox_reply.scalars == avg_reply.scalars
    assert set(prox_reply.tensors) == set(avg_reply.tensors)
    assert all(torch.equal(prox_reply.tensors[k], avg_reply.tensors[k]) for k in avg_reply.tensors)
    assert prox_state == avg_state == {}


def test_larger_mu_keeps_the_client_closer_to_the_global_model():
    settings = TrainSettings(lr=0.05, batch_size=8, local_epochs=4)
    distances = {}
    for mu in (0.0, 1.0, 10.0):  # lr * mu < 1: the proximal pull is a contraction
        model, message, _, reply, _ = fit_once(fedprox(settings, mu=mu), data=tiny_data(5))
        distances[mu] = _distance(reply.tensors, message.tensors, parameter_names(model))
    assert distances[10.0] < distances[1.0] < distances[0.0]
    assert distances[10.0] < 0.7 * distances[0.0]


def test_squared_and_unsquared_proximal_terms_differ():
    settings = TrainSettings(lr=0.05, batch_size=8, local_epochs=4)
    _, message, _, squared, _ = fit_once(fedprox(settings, mu=1.0, squared=True), data=tiny_data(5))
    model, _, _, unsquared, _ = fit_once(fedprox(settings, mu=1.0, squared=False), data=tiny_data(5))
    assert any(not torch.equal(squared.tensors[n], unsquared.tensors[n]) for n in parameter_names(model))
    assert all(torch.isfinite(unsquared.tensors[n]).all() for n in parameter_names(model))
    # the pulls: μ‖d‖ (squared) against a constant μ/2 (unsquared); within ‖d‖ < 1/2 the unsquared pulls harder
    d_sq = _distance(squared.tensors, message.tensors, parameter_names(model))
    d_un = _distance(unsquared.tensors, message.tensors, parameter_names(model))
    assert d_un < d_sq < 0.5


def test_fedprox_pulls_towards_the_weights_received_this_round():
    # Round 2 of a federation starts from the averaged model: FedProx with a huge pull stays there.
    settings = TrainSettings(lr=0.05, batch_size=8, local_epochs=3)
    data = {1: tiny_data(1), 2: tiny_data(2)}
    near = Federation(tiny_model(), fedprox(settings, mu=15.0), seed=0)
    far = Federation(tiny_model(), fedprox(settings, mu=0.0), seed=0)
    for federation in (near, far):
        federation.run_round("p", 1, data)
    seen = {}
    for label, federation in (("near", near), ("far", far)):
        start = federation.global_message.clone()
        reply, _ = federation.algorithm.client.fit(federation.model, start, {}, data[1], Randomness(0, "p", 1, 2))
        seen[label] = _distance(reply.tensors, start.tensors, parameter_names(federation.model))
    assert seen["near"] < seen["far"]

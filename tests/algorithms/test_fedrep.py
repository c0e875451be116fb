"""FedRep: head epochs, then body epochs, each leaving the other part untouched and in inference
mode; only the body leaves a client."""

import torch

from fedcare.algorithms.fedrep import fedrep
from fedcare.algorithms.training import TrainSettings
from fedcare.runtime.federation import Federation

from support.tiny import fit_once, record_fits, tiny_data, tiny_model


SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)


def _head(state):
    return {k: v for k, v in state.items() if k.startswith("classifier.")}


def test_fedrep_head_epochs_leave_the_body_untouched_batchnorm_statistics_included():
    model, message, state, reply, new_state = fit_once(fedrep(SETTINGS, head_epochs=2, body_epochs=0))
    for name, tensor in message.tensors.items():  # conv weights and the body's BatchNorm statistics
        assert torch.equal(reply.tensors[name], tensor), name
    assert any(not torch.equal(new_state[k], state[k]) for k in state if new_state[k].is_floating_point())
    assert not torch.equal(new_state["classifier.2.running_mean"], state["classifier.2.running_mean"])
    assert all(p.requires_grad for p in model.parameters()) and model.training


def test_fedrep_body_epochs_leave_the_head_untouched():
    model, message, state, reply, new_state = fit_once(fedrep(SETTINGS, head_epochs=0, body_epochs=2))
    assert set(new_state) == set(state)
    assert all(torch.equal(new_state[k], state[k]) for k in state)  # head weights and head BatchNorm statistics
    assert all(not torch.equal(reply.tensors[k], message.tensors[k]) for k in ("features.0.weight", "features.1.running_mean"))
    assert all(p.requires_grad for p in model.parameters()) and model.training


def test_fedrep_trains_the_head_first_then_the_body():
    data = tiny_data(7)
    _, _, _, _, head_state = fit_once(fedrep(SETTINGS, head_epochs=1, body_epochs=0), data=data)
    _, _, _, body_only, _ = fit_once(fedrep(SETTINGS, head_epochs=0, body_epochs=1), data=data)
    _, _, _, both, both_state = fit_once(fedrep(SETTINGS, head_epochs=1, body_epochs=1), data=data)
    # the head after the round is the head after the head phase: frozen while the body trains
    assert all(torch.equal(both_state[k], head_state[k]) for k in head_state)
    # the body trained on top of the new head, so it differs from a body trained on the old one
    assert any(not torch.equal(both.tensors[k], body_only.tensors[k]) for k in both.tensors if both.tensors[k].is_floating_point())


def test_fedrep_frozen_part_runs_in_inference_mode():
    modes = {}
    model = tiny_model()
    hooks = [model.features[1].register_forward_pre_hook(lambda m, i: modes.setdefault("body", set()).add(m.training)),
             model.classifier[2].register_forward_pre_hook(lambda m, i: modes.setdefault("head", set()).add(m.training))]
    fit_once(fedrep(SETTINGS, head_epochs=1, body_epochs=0), model=model)
    assert modes == {"body": {False}, "head": {True}}
    modes.clear()
    fit_once(fedrep(SETTINGS, head_epochs=0, body_epochs=1), model=model)
    assert modes == {"body": {True}, "head": {False}}
    for h in hooks:
        h.remove()


def test_fedrep_sends_only_the_body_through_a_federation():
    data = {1: tiny_data(1), 2: tiny_data(2)}
    federation = Federation(tiny_model(), fedrep(SETTINGS), seed=0)
    calls = record_fits(federation)
    federation.run_round("p", 1, data)
    federation.run_round("p", 2, data)
    for _, _, message, state, reply, new_state in calls:
        assert all(k.startswith("features.") for k in reply.tensors) and set(reply.tensors) == set(message.tensors)
        assert all(k.startswith("classifier.") for k in new_state)
    assert not torch.equal(federation.states[1]["classifier.4.weight"], federation.states[2]["classifier.4.weight"])

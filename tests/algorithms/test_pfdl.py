"""PFDL: the fine-tuning after aggregation trains the private head only, at a reduced learning rate."""

import torch

from fedcare.algorithms import pfdl
from fedcare.algorithms.training import Randomness, TrainSettings

from support.tiny import tiny_data, tiny_model


SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)


def test_pfdl_finetuning_leaves_frozen_conv_blocks_untouched():
    algorithm = pfdl(SETTINGS, finetune_epochs=2, lr_factor=10)
    model = tiny_model()
    message = algorithm.server.initial_message(model)
    state = algorithm.client.init_state(model)
    new_state = algorithm.client.after_aggregation(model, message, state, tiny_data(3), Randomness(0, "t", 1, 1))
    after = model.state_dict()
    for name, tensor in message.tensors.items():  # conv weights and BatchNorm statistics alike
        assert torch.equal(after[name], tensor), name
    assert any(not torch.equal(new_state[k], state[k]) for k in state)  # the private head did train
    assert all(p.requires_grad for p in model.parameters())  # unfrozen afterwards
    assert model.training


def test_pfdl_finetune_runs_at_reduced_learning_rate():
    model = tiny_model()
    data = tiny_data(3)
    changes = {}
    for factor in (1.0, 100.0):
        algorithm = pfdl(SETTINGS, finetune_epochs=1, lr_factor=factor)
        message = algorithm.server.initial_message(model)
        state = algorithm.client.init_state(model)
        new = algorithm.client.after_aggregation(model, message, state, data, Randomness(0, "t", 1, 1))
        changes[factor] = sum((new[k] - state[k]).abs().sum().item() for k in state if new[k].is_floating_point()
                              and "running" not in k)
    assert changes[100.0] < changes[1.0] / 10

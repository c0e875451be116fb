"""Local-only models: nothing leaves a client."""

import torch

from fedcare.algorithms import local
from fedcare.algorithms.training import TrainSettings
from fedcare.runtime.federation import Federation

from support.tiny import tiny_data, tiny_model


SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)


def test_local_models_never_communicate():
    federation = Federation(tiny_model(), local(SETTINGS), seed=1)
    federation.run_round("p", 1, {1: tiny_data(1), 2: tiny_data(2)})
    assert federation.global_message.tensors == {}
    w1 = federation.states[1]["classifier.1.weight"]
    w2 = federation.states[2]["classifier.1.weight"]
    assert not torch.equal(w1, w2)

"""FedBN: BatchNorm layers, found by type, stay on each client with their statistics; the rest is
averaged, uniformly by default."""

import pytest
import torch
from torch import nn

from fedcare.algorithms.fedbn import fedbn
from fedcare.algorithms.messages import Message
from fedcare.algorithms.training import TrainSettings
from fedcare.runtime.federation import Federation

from support.tiny import BATCHNORM_PREFIXES, fit_once, tiny_data, tiny_model


SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)


class NamedToMislead(nn.Module):
    """A Linear called `bn` (shared) and a BatchNorm called `norm` (private)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.bn = nn.Linear(64, 4)
        self.norm = nn.BatchNorm1d(4)
        self.out = nn.Linear(4, 1)

    def forward(self, x):
        return self.out(torch.relu(self.norm(self.bn(x.flatten(1))))).squeeze(1)


def test_fedbn_finds_batchnorm_by_type_never_by_name():
    _, _, _, reply, state = fit_once(fedbn(SETTINGS), model=NamedToMislead())
    assert set(reply.tensors) == {"bn.weight", "bn.bias", "out.weight", "out.bias"}
    assert set(state) == {"norm.weight", "norm.bias", "norm.running_mean", "norm.running_var", "norm.num_batches_tracked"}


def test_fedbn_keeps_batchnorm_statistics_on_each_client_across_rounds():
    data = {1: tiny_data(1), 2: tiny_data(2, n=24)}
    federation = Federation(tiny_model(), fedbn(SETTINGS), seed=0)
    for rnd in (1, 2):
        federation.run_round("p", rnd, data)
        assert not any(k.startswith(BATCHNORM_PREFIXES) for k in federation.global_message.tensors)
    s1, s2 = federation.states[1], federation.states[2]
    assert not torch.equal(s1["features.1.running_mean"], s2["features.1.running_mean"])
    assert s1["features.1.num_batches_tracked"].item() == 2 * 5  # 40 examples / batch 8, two rounds: own count
    assert s2["features.1.num_batches_tracked"].item() == 2 * 3
    m1 = {k: v.clone() for k, v in federation.personal_model(1).state_dict().items()}
    m2 = federation.personal_model(2).state_dict()
    assert all(torch.equal(m1[k], m2[k]) for k in federation.global_message.tensors)  # shared parts agree


def test_fedbn_averages_uniformly_by_default():
    server = fedbn(SETTINGS).server
    replies = {1: Message({"w": torch.tensor([1.0])}, {"num_examples": 1.0}),
               2: Message({"w": torch.tensor([4.0])}, {"num_examples": 3.0})}
    assert server.aggregate(Message({"w": torch.zeros(1)}), replies).tensors["w"].item() == 2.5
    weighted = fedbn(SETTINGS, weighting="examples").server
    assert weighted.aggregate(Message({"w": torch.zeros(1)}), replies).tensors["w"].item() == pytest.approx(3.25)

"""Simulated attackers (fedcare.algorithms.attack): the poisoned update an attacker sends and the
labels it flips, by task; a toy run where an attacker moves FedAvg and not the median."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedcare.algorithms import fedavg
from fedcare.algorithms.attack import AttackError, AttackingClient, attacking_algorithm, flipped_labels
from fedcare.algorithms.messages import Message
from fedcare.algorithms.robust import robust_algorithm
from fedcare.algorithms.training import ClientData, Randomness, TrainSettings
from fedcare.config import Attack, Robustness
from fedcare.runtime.federation import Federation
from fedcare.tasks import BINARY, MULTICLASS, EmbeddingTask


SETTINGS = TrainSettings(lr=0.5, batch_size=8, local_epochs=1)


def binary_data(seed: int, n: int = 64) -> ClientData:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return ClientData(x, (x[:, 0] + 0.5 * x[:, 1] > 0).float())


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 1)
        self.register_buffer("seen", torch.zeros(1))

    def forward(self, x):
        return self.fc(x).squeeze(-1)


@pytest.mark.parametrize("kind,factor", [("sign_flip", -3.0), ("scaled_update", 3.0)])
def test_attacker_sends_the_poisoned_update_and_honest_clients_do_not(kind, factor):
    model = Linear()
    client = AttackingClient(fedavg(SETTINGS).client, Attack(clients=[2], kind=kind, scale=3.0))
    received = Message({k: v.clone() for k, v in model.state_dict().items()})
    honest_half = fedavg(SETTINGS).client
    for c in (1, 2):
        data = binary_data(c)
        sent, _ = client.fit(model, received, {}, data, Randomness(0, "train", c, 1))
        clean, _ = honest_half.fit(model, received, {}, data, Randomness(0, "train", c, 1))
        expected = factor if c == 2 else 1.0
        for k in ("fc.weight", "fc.bias"):
            update = clean.tensors[k] - received.tensors[k]
            assert torch.allclose(sent.tensors[k], received.tensors[k] + expected * update, atol=1e-6)
        assert torch.equal(sent.tensors["seen"], clean.tensors["seen"])  # buffers: sent as trained


def test_label_flip_by_task():
    data = ClientData(torch.randn(4, 3), torch.tensor([0.0, 1.0, 1.0, 0.0]))
    assert torch.equal(flipped_labels(data, nn.Linear(3, 1), BINARY).y, torch.tensor([1.0, 0.0, 0.0, 1.0]))
    classes = ClientData(torch.randn(3, 3), torch.tensor([0, 2, 4]))
    assert torch.equal(flipped_labels(classes, nn.Linear(3, 5), MULTICLASS).y, torch.tensor([4, 2, 0]))
    with pytest.raises(AttackError, match="label_flip needs class labels"):
        attacking_algorithm(fedavg(TrainSettings(task=EmbeddingTask())), Attack(clients=[1], kind="label_flip"))


def toy_run(rule: str, attack: Attack | None, rounds: int = 3) -> torch.Tensor:
    """The global weights after `rounds` of FedAvg over 7 clients (binary toy data), with
    `rule` and `attack` as an experiment's [robustness] would give them."""
    robustness = Robustness(rule=rule, attack=attack)
    algorithm = robust_algorithm(attacking_algorithm(fedavg(SETTINGS), attack), robustness)
    federation = Federation(Linear(), algorithm, seed=0)
    train = {c: binary_data(c) for c in range(1, 8)}
    for rnd in range(1, rounds + 1):
        federation.run_round("train", rnd, train)
    return torch.cat([federation.global_message.tensors[k].flatten() for k in ("fc.weight", "fc.bias")])


def test_an_attacker_moves_fedavg_and_not_the_median():
    attack = Attack(clients=[3], kind="scaled_update", scale=20.0)
    clean_mean, clean_median = toy_run("mean", None), toy_run("median", None)
    moved_mean = (toy_run("mean", attack) - clean_mean).norm().item()
    moved_median = (toy_run("median", attack) - clean_median).norm().item()
    learnt = (clean_median - toy_run("median", None, rounds=0)).norm().item()
    assert moved_mean > learnt  # one of seven clients drags FedAvg further than training moved it
    assert moved_median < 0.25 * learnt and moved_median * 10 < moved_mean

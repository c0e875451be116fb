"""Clients trained many at a time (fedcare.algorithms.vectorised, fedcare.runtime.vectorised)
equal the plain one-after-another loop within 1e-6: FedAvg, FedBN and PFDL (its fine-tuning of
the private layers too) on the HAR CNN with BatchNorm, clients of unequal sizes (shorter last
batches, a batch of one skipped). What it cannot batch runs as `LocalClients` does."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedcare.algorithms import fedavg, fedbn, pfdl
from fedcare.algorithms.training import SGD, ClientData, TrainSettings
from fedcare.algorithms.vectorised import train_stacked, vectorisable
from fedcare.models.har_cnn import HarCNN
from fedcare.runtime.clients import LocalClients
from fedcare.runtime.federation import Federation
from fedcare.runtime.vectorised import VectorisedClients
from fedcare.tasks import MULTICLASS

@pytest.fixture(autouse=True)
def _one_thread():
    # after conftest's two threads: these tiny models train fastest on one (and are compared with a tolerance)
    torch.set_num_threads(1)


SETTINGS = TrainSettings(lr=0.05, batch_size=4, local_epochs=2, task=MULTICLASS)
SIZES = [7, 10, 13, 3, 9]  # 13 = 3 x 4 + a batch of one (skipped); 3 = one batch of 3


def har_model() -> nn.Module:
    torch.manual_seed(0)
    return HarCNN(num_classes=4, in_channels=3, window=40, hidden=8)


def cohort() -> dict[int, ClientData]:
    g = torch.Generator().manual_seed(3)
    return {c: ClientData(torch.randn(n, 3, 40, generator=g), torch.randint(0, 4, (n,), generator=g))
            for c, n in enumerate(SIZES)}


def federation(algorithm, runtime, **kw) -> Federation:
    model = har_model()
    return Federation(model, algorithm, 0, clients=runtime(model, algorithm.client, 0, **kw))


@pytest.mark.parametrize("make", [lambda: fedavg(SETTINGS), lambda: fedbn(SETTINGS),
                                  lambda: pfdl(SETTINGS, finetune_epochs=2)], ids=["fedavg", "fedbn", "pfdl"])
def test_batched_clients_equal_the_plain_loop(make):
    plain, batched = federation(make(), LocalClients), federation(make(), VectorisedClients, chunk=3)
    assert batched.clients.why_not is None
    data = cohort()
    for rnd in (1, 2):
        p, b = plain.run_round("train", rnd, data), batched.run_round("train", rnd, data)
        assert b["train_loss"] == pytest.approx(p["train_loss"], abs=1e-6) and b["n_train"] == p["n_train"]
    for name, value in plain.global_message.tensors.items():
        torch.testing.assert_close(batched.global_message.tensors[name], value, atol=1e-6, rtol=0)
    for c in data:  # each client's private part: PFDL's fine-tuned head, FedBN's statistics
        assert plain.state_of(c).keys() == batched.state_of(c).keys()
        for name, value in plain.state_of(c).items():
            torch.testing.assert_close(batched.state_of(c)[name], value, atol=1e-6, rtol=0)
    assert bool(plain.state_of(0)) == (make().name != "fedavg")  # the private part was compared


def test_what_cannot_be_batched_runs_one_client_after_another():
    momentum = TrainSettings(lr=0.05, batch_size=4, local_epochs=1, task=MULTICLASS, optimizer=SGD(momentum=0.9))
    plain, batched = federation(fedavg(momentum), LocalClients), federation(fedavg(momentum), VectorisedClients)
    assert "plain SGD only" in batched.clients.why_not
    data = cohort()
    plain.run_round("train", 1, data), batched.run_round("train", 1, data)
    for name, value in plain.global_message.tensors.items():
        assert torch.equal(batched.global_message.tensors[name], value)  # the same loop: bit for bit


def test_dropout_and_data_dependent_losses_are_refused():
    dropout = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    assert "dropout" in vectorisable(SETTINGS, dropout)
    with pytest.raises(ValueError, match="does not cover dropout"):
        train_stacked(dropout, [dropout.state_dict()], [cohort()[0]], SETTINGS, [torch.Generator()])
    weighted = TrainSettings(task=MULTICLASS, loss=lambda data: (lambda model, x, y: model(x).sum()))
    assert "depends on the client's data" in vectorisable(weighted, har_model())

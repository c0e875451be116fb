"""Clients trained many at a time (fedcare.algorithms.vectorised, fedcare.runtime.vectorised)
equal the plain one-after-another loop within 1e-6: FedAvg, FedBN and PFDL (its fine-tuning of
the private layers too) on the HAR CNN with BatchNorm, clients of unequal sizes (shorter last
batches, a batch of one skipped); PFDL's heads on the pain CNN fine-tuned on features computed
once. What it cannot batch runs as `LocalClients` does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedcare.algorithms import fedavg, fedbn, pfdl
from fedcare.algorithms.training import SGD, ClientData, TrainSettings
from fedcare.algorithms.vectorised import train_stacked, vectorisable
from fedcare.data.transforms import precrop_size
from fedcare.models.har_cnn import HarCNN
from fedcare.models.pain_cnn import PainCNN
from fedcare.runtime.clients import LocalClients
from fedcare.runtime.federation import Federation
from fedcare.runtime.vectorised import VectorisedClients
from fedcare.studies.pain.cohort import Session
from fedcare.tasks import BINARY, MULTICLASS


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


def federation(algorithm, runtime, model=har_model, **kw) -> Federation:
    model = model()
    return Federation(model, algorithm, 0, clients=runtime(model, algorithm.client, 0, **kw))


def assert_same_rounds(plain: Federation, batched: Federation, data: dict[int, ClientData]) -> None:
    """Two rounds in each: the same losses, global model and clients' private parts within 1e-6."""
    for rnd in (1, 2):
        p, b = plain.run_round("train", rnd, data), batched.run_round("train", rnd, data)
        assert b["train_loss"] == pytest.approx(p["train_loss"], abs=1e-6) and b["n_train"] == p["n_train"]
    for name, value in plain.global_message.tensors.items():
        torch.testing.assert_close(batched.global_message.tensors[name], value, atol=1e-6, rtol=0)
    for c in data:  # each client's private part: PFDL's fine-tuned head, FedBN's statistics
        assert plain.state_of(c).keys() == batched.state_of(c).keys()
        for name, value in plain.state_of(c).items():
            torch.testing.assert_close(batched.state_of(c)[name], value, atol=1e-6, rtol=0)


@pytest.mark.parametrize("make", [lambda: fedavg(SETTINGS), lambda: fedbn(SETTINGS),
                                  lambda: pfdl(SETTINGS, finetune_epochs=2)], ids=["fedavg", "fedbn", "pfdl"])
def test_batched_clients_equal_the_plain_loop(make):
    plain, batched = federation(make(), LocalClients), federation(make(), VectorisedClients, chunk=3)
    assert batched.clients.why_not is None
    assert batched.clients.head is None  # the HAR CNN declares no forward_head: PFDL runs its frozen blocks every batch
    assert_same_rounds(plain, batched, cohort())
    assert bool(plain.state_of(0)) == (make().name != "fedavg")  # the private part was compared


PAIN = TrainSettings(lr=0.01, batch_size=5, local_epochs=1, task=BINARY)
FRAMES = [2, 4, 1, 5, 7]  # x 4 variants: 8, 16 (3 x 5 + a batch of one, skipped), 4, 20, 28 examples


def pain_model() -> nn.Module:
    torch.manual_seed(0)
    return PainCNN(image_size=32)


def pain_clients(frame_items: bool) -> dict[int, ClientData]:
    """Synthetic subjects' frames in their 4 variants, as the pain study holds them (`FrameItems`) or as uint8 tensors."""
    rng = np.random.default_rng(5)
    side = precrop_size(32)
    clients = {}
    for c, n in enumerate(FRAMES):
        session = Session(rng.integers(0, 256, (n, side, side), dtype=np.uint8), rng.choice([-1, 1], n).astype(np.int8),
                          rng.integers(0, 2, n), np.zeros(n), 32)
        data = session.as_client_data()
        clients[c] = data if frame_items else ClientData(data.x[:], data.y)
    return clients


@pytest.mark.parametrize("frame_items", [False, True], ids=["tensors", "frame-items"])
def test_pfdl_heads_fine_tune_on_features_computed_once(frame_items):
    make = lambda: pfdl(PAIN, finetune_epochs=2)
    plain = federation(make(), LocalClients, pain_model)
    batched = federation(make(), VectorisedClients, pain_model, chunk=3)
    x = torch.rand(2, 1, 32, 32)
    assert torch.equal(batched.model(x), batched.model.forward_head(batched.model.features(x)))  # as declared
    assert batched.clients.head is not None  # PFDL shares exactly the pain CNN's features
    data = pain_clients(frame_items)
    assert_same_rounds(plain, batched, data)
    assert plain.state_of(0).keys() == {k for k in plain.model.state_dict() if k.startswith("classifier.")}
    calls = []  # the frozen blocks run once per chunk of 3 clients, not for every batch of every epoch
    batched.model.features.register_forward_hook(lambda *_: calls.append(1))
    batched.clients.after_aggregation("train", 3, batched.work(data))
    assert len(calls) == 2


def test_pfdl_sharing_more_or_less_than_the_features_runs_the_whole_model():
    less = pfdl(PAIN, shared_paths=("features.0",))  # features.1-2 private: they fine-tune, not frozen
    assert VectorisedClients(pain_model(), less.client, 0).head is None
    make = lambda: pfdl(PAIN, shared_paths=("features", "classifier.1"), finetune_epochs=2)
    plain = federation(make(), LocalClients, pain_model)
    batched = federation(make(), VectorisedClients, pain_model, chunk=3)
    assert batched.clients.head is None  # frozen: features and a layer of the head
    assert_same_rounds(plain, batched, pain_clients(frame_items=False))


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


def test_what_is_batched_is_what_the_client_half_declares():
    """PFDL declares its fine-tuning (epochs, lr); FedAvg none; a wrapper around PFDL (it may
    change any operation) declares neither its fit nor its fine-tuning, and runs client by client."""
    from fedcare.algorithms.base import DelegatingClient

    finetune = pfdl(SETTINGS, finetune_epochs=3, lr_factor=5.0).client.batched_finetune()
    assert (finetune.epochs, finetune.lr) == (3, SETTINGS.lr / 5.0)
    assert fedavg(SETTINGS).client.batched_finetune() is None and fedavg(SETTINGS).client.batched_fit
    wrapped = DelegatingClient(pfdl(SETTINGS).client)
    assert wrapped.batched_finetune() is None and not wrapped.batched_fit
    clients = VectorisedClients(har_model(), wrapped, 0)
    assert clients.finetune is None and clients.why_not == "DelegatingClient trains by its own fit"


def test_a_client_whose_batched_training_diverges_fails_by_name_as_in_the_plain_loop():
    """The batched fit checked no loss and no weight: a diverged client's NaN reply went on to the
    server. Now it stops as that client's divergence, as `train_epochs` does."""
    from fedcare.algorithms.training import TrainingDiverged

    settings = TrainSettings(lr=1e30, batch_size=4, local_epochs=2, task=MULTICLASS)
    for runtime in (LocalClients, VectorisedClients):
        with pytest.raises(TrainingDiverged, match=r"^training diverged: .* \(client 0\)$"):
            federation(fedavg(settings), runtime).run_round("train", 1, cohort())

"""The face study's methods (fedcare.studies.facerec.methods): embedding regularisation, q-FedAvg's
loss at the received model, and FedFR's two heads and terms by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fedcare.models.face_resnet import FaceResNet

from support.facerec import small_config


def _federation(method: str, **options):
    from fedcare.runtime.federation import Federation
    from fedcare.studies.facerec.data import FaceData
    from fedcare.studies.facerec.methods import make_algorithm

    config = small_config(Path("."), Path("."), methods=[method], local_steps=2)
    config = config.model_copy(update={"options": config.options.model_copy(update=options)})
    g = torch.Generator().manual_seed(0)
    data = {c: FaceData(torch.randint(0, 256, (12, 3, 16, 16), dtype=torch.uint8, generator=g),
                        torch.arange(12) % 3 + 3 * (c - 1), classes=6) for c in (1, 2)}
    torch.manual_seed(0)
    federation = Federation(FaceResNet(6), make_algorithm(method, config), seed=0)
    return federation, data


@pytest.mark.parametrize("method", ["fedavg-reg", "hfmaml-reg"])
def test_embedding_regularisation_is_the_plain_method_at_c_0_and_pulls_towards_the_received_model(method):
    def trained(c):
        federation, data = _federation(method, reg_c=c)
        start = {k: v.clone() for k, v in federation.global_message.tensors.items()}
        federation.run_round("train", 1, data)
        return federation.global_message.tensors, start

    plain_fed, data = _federation(method.replace("-reg", ""))
    plain_fed.run_round("train", 1, data)
    zero, start = trained(0.0)
    assert all(torch.equal(zero[k], plain_fed.global_message.tensors[k]) for k in zero)  # C = 0: the plain method
    strong, _ = trained(1000.0)
    weights = [k for k in start if k.endswith("weight")]
    moved = lambda t: sum(float((t[k] - start[k]).norm()) for k in weights)
    assert moved(strong) != moved(zero)  # the term changes training


def test_q_fedavg_gets_the_arcface_loss_at_the_received_model():
    from fedcare.algorithms.qfedavg import LOSS_AT_GLOBAL

    federation, data = _federation("fedavg-fair")
    replies = federation.clients.fit("train", 1, federation.work(data))
    losses = [r.scalars[LOSS_AT_GLOBAL] for r in replies.values()]
    assert all(math.isfinite(v) and v > 0 for v in losses)  # an embedding task's predict() loss would be NaN
    plain, _ = _federation("fedavg")
    after = federation.server.aggregate(federation.global_message, replies)
    mean = plain.server.aggregate(plain.global_message, replies)
    assert not torch.equal(after.tensors["embedding.weight"], mean.tensors["embedding.weight"])


def test_fedfr_keeps_both_heads_and_its_previous_model_and_its_terms_by_hand():
    from fedcare.models.face_resnet import BinaryHead, binary_loss, moon_contrastive
    from fedcare.studies.facerec.methods import PREVIOUS

    federation, data = _federation("fedfr")
    for rnd in (1, 2):
        replies = federation.clients.fit("train", rnd, federation.work(data))
        federation.global_message = federation.server.aggregate(federation.global_message, replies)
        assert all(not k.startswith(("head.", "binary_head.")) for r in replies.values() for k in r.tensors)
        assert all(math.isfinite(r.scalars["train_loss"]) for r in replies.values())
    state = federation.state_of(1)
    assert state["head.weight"].shape == (6, 512) and state["binary_head.weight"].shape == (6, 512)
    assert set(replies[1].tensors) <= {k[len(PREVIOUS):] for k in state if k.startswith(PREVIOUS)}
    e = torch.randn(4, 8)
    assert float(moon_contrastive(e, e, e)) == pytest.approx(math.log(2))  # f_prev = f_glob: no preference
    head = BinaryHead(2, 2)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
        head.bias.fill_(0.5)
    s, m, lam = 8.0, 0.4, 0.7
    expected = (lam / s * math.log1p(math.exp(-s * (1 - m) - 0.5))
                + (1 - lam) / s * math.log1p(math.exp(s * (0 + m) + 0.5)))
    assert float(binary_loss(torch.tensor([[3.0, 0.0]]), head, torch.tensor([0])).detach()) == pytest.approx(expected, rel=1e-5)

"""DP-SGD on the face study: the ArcFace (and FedFR's binary) heads read their weights inside
their own layers, so Opacus's per-example gradients reach them; they equal one backward per
example, and a small DP-SGD face run trains with a finite loss and epsilon."""

from __future__ import annotations

import json
import math

import torch

from fedcare.config import DPSGD, Privacy
from fedcare.models.face_resnet import FaceResNet, arcface_loss, binary_loss
from fedcare.privacy import private_model
from fedcare.studies.facerec.config import FacerecExperiment
from fedcare.studies.run import run_study

from support.facerec import small_config


def face_loss(model, x, y):
    """The ArcFace loss plus FedFR's binary term: both heads in one loss."""
    embeddings = model(x)
    return arcface_loss()(model, x, y) + binary_loss(embeddings, model.binary_head, y)


def test_per_example_gradients_of_the_heads_equal_one_backward_per_example():
    from opacus import GradSampleModule

    torch.manual_seed(0)
    model = private_model(FaceResNet(3), Privacy(dp_sgd=DPSGD(noise_multiplier=1.0, max_grad_norm=1.0)))
    model.binary_head = type(model.binary_head)(3)
    x, y = torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 1])
    wrapped = GradSampleModule(model, strict=False)
    try:
        face_loss(model, x, y).backward()
        names = ("head.weight", "binary_head.weight", "binary_head.bias", "embedding.weight")
        batched = {n: p.grad_sample.clone() for n, p in model.named_parameters() if n in names}
    finally:
        wrapped.cleanup()
    assert set(batched) == set(names)
    for i in range(len(y)):  # GroupNorm and the heads are per example: a batch of one is that example alone
        model.zero_grad()
        face_loss(model, x[i : i + 1], y[i : i + 1]).backward()
        for n, p in model.named_parameters():
            if n in names:
                assert torch.allclose(batched[n][i].reshape(p.shape), p.grad, atol=1e-5, rtol=1e-4), n


def test_a_dp_sgd_face_run_trains_with_a_finite_loss_and_epsilon(celeba, tmp_path):
    config = small_config(celeba, tmp_path / "cache", methods=["fedavg"])
    config = FacerecExperiment.model_validate({**config.model_dump(mode="json"),
                                               "privacy": {"dp_sgd": {"noise_multiplier": 1.0, "max_grad_norm": 1.0}}})
    run = run_study(config, tmp_path / "run")
    rounds = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["type"] == "round"]
    assert [r["round"] for r in rounds] == [1, 2]
    assert all(math.isfinite(r["train_loss"]) and 0 < r["dp_epsilon"] < math.inf for r in rounds)
    assert rounds[1]["dp_epsilon"] > rounds[0]["dp_epsilon"]  # every round spends

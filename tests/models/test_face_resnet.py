"""The face study's ResNet: ArcFace logits by hand, and a local head that takes each client's size."""

from __future__ import annotations

import math

import pytest
import torch

from fedcare.algorithms.split import load_tensors
from fedcare.models.face_resnet import FaceResNet, arcface_logits


def test_arcface_logits_by_hand():
    e = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    w = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-1.0, 1.0]])
    y = torch.tensor([1, 0])
    s, m = 8.0, 0.5
    logits = arcface_logits(e, w, y, s, m)
    cos = [[0.6, 0.8, 1 / (5 * math.sqrt(2))], [1.0, 0.0, -1 / math.sqrt(2)]]
    expected = [[s * cos[0][0], s * math.cos(math.acos(0.8) + m), s * cos[0][2]],  # standard ArcFace: no margin
                [s * math.cos(math.acos(1 - 1e-7) + m), s * 0.0, s * cos[1][2]]]   # on the non-target classes
    assert torch.allclose(logits, torch.tensor(expected), atol=2e-4)  # float32 acos near 1
    masked = arcface_logits(e, w, y, s, m, present=torch.tensor([True, True, False]))
    assert torch.isinf(masked[:, 2]).all() and torch.allclose(masked[:, :2], logits[:, :2])


def test_a_local_head_takes_each_clients_size_and_other_shapes_stay_errors():
    model = FaceResNet(0)
    load_tensors(model, {"head.weight": torch.ones(7, 512)})
    assert model.head.weight.shape == (7, 512) and isinstance(model.head.weight, torch.nn.Parameter)
    assert model.state_dict()["head.weight"].sum() == 7 * 512
    with pytest.raises(RuntimeError):
        load_tensors(model, {"embedding.bias": torch.ones(3)})  # not client-sized: a shape mismatch is an error

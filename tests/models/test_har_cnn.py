"""The FedHealth 2 HAR CNN: its shapes and parameter count."""

import pytest
import torch

from fedcare.models.har_cnn import HarCNN


def test_har_cnn_shapes_and_parameter_count():
    model = HarCNN()
    assert [name for name, _ in model.named_children()] == ["features", "classifier"]
    out = model(torch.zeros(4, 27, 200))
    assert out.shape == (4, 10)
    conv1 = 27 * 16 * 9 + 16
    bn1 = 2 * 16
    conv2 = 16 * 32 * 9 + 32
    bn2 = 2 * 32
    fc1 = 32 * 44 * 64 + 64  # 200 -> conv 192 -> pool 96 -> conv 88 -> pool 44
    fc2 = 64 * 10 + 10
    assert sum(p.numel() for p in model.parameters()) == conv1 + bn1 + conv2 + bn2 + fc1 + fc2 == 99466
    assert sum(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()) == 2
    short = HarCNN(window=128)  # 128 -> 120 -> 60 -> 52 -> 26
    assert short.classifier[1].in_features == 32 * 26 and short(torch.zeros(2, 27, 128)).shape == (2, 10)
    with pytest.raises(ValueError, match="window"):
        HarCNN(window=27)

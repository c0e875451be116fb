"""AlexNet with BatchNorm (the FedHealth 2 X-ray model): its shapes and where its BatchNorm layers
are."""

import torch

from fedcare.models.alexnet_bn import AlexNetBN


def test_alexnet_bn_shapes_and_batchnorm_points():
    model = AlexNetBN(num_classes=4, hidden=64).eval()
    assert model(torch.zeros(2, 1, 64, 64)).shape == (2, 4)
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert len(bns) == 7  # 5 conv + 2 FC: FedHealth 2's 7 statistics points
    full = AlexNetBN(hidden=4096)
    fc = sum(p.numel() for p in full.classifier.parameters())
    assert fc == (9216 * 4096 + 4096) + 2 * 4096 + (4096 * 4096 + 4096) + 2 * 4096 + (4096 * 4 + 4)

"""The pain CNN of the Tobis thesis (Table 4.2) and the PFDL paper (Fig. 3).

Three conv blocks (5x5, stride 2, SAME padding, BatchNorm, ReLU), 2x2 max-pool, then
Dense-128 + BatchNorm + ReLU + Dense-1. The input size is a parameter: 215 for real data,
smaller for the demo. The network outputs a logit; the sigmoid lives in the loss
(BCEWithLogits) and in prediction, which is the same function as Keras's sigmoid + BCE.
"""

from __future__ import annotations

import torch
from torch import nn

from fedcare.errors import InputError

# Keras BatchNormalization defaults (momentum 0.99, epsilon 1e-3), the thesis's framework.
_BN = dict(eps=1e-3, momentum=0.01)


def _conv_block(c_in: int, c_out: int) -> nn.Sequential:
    # padding=2 with a 5x5 kernel and stride 2 gives ceil(n/2), TensorFlow's SAME output size
    # (TF pads asymmetrically on even sizes, PyTorch symmetrically: a one-pixel shift, documented).
    return nn.Sequential(nn.Conv2d(c_in, c_out, 5, stride=2, padding=2), nn.BatchNorm2d(c_out, **_BN), nn.ReLU())


class PainCNN(nn.Module):
    """`features` holds the conv blocks (shared under PFDL), `classifier` the dense layers
    (`forward_head`)."""

    def __init__(self, image_size: int = 215):
        super().__init__()
        if image_size < 16:
            raise InputError(f"image_size must be at least 16 pixels, got {image_size}")
        self.image_size = image_size
        self.features = nn.Sequential(
            _conv_block(1, 32), _conv_block(32, 64), _conv_block(64, 128), nn.MaxPool2d(2)
        )
        side = image_size
        for _ in range(3):
            side = (side + 1) // 2
        side //= 2
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(128 * side * side, 128),
            nn.BatchNorm1d(128, **_BN),
            nn.ReLU(),
            nn.Linear(128, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.features(x))

    def forward_head(self, z: torch.Tensor) -> torch.Tensor:
        """The layers after `features` (timm's name): forward(x) is forward_head(features(x)), so
        PFDL's fine-tuning of the private head can run on features computed once
        (`fedcare.runtime.vectorised`)."""
        return self.classifier(z).squeeze(1)


def glorot_init(model: nn.Module, generator: torch.Generator) -> None:
    """Keras's default init: Glorot-uniform weights, zero biases, BatchNorm at identity."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(module.weight, generator=generator)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.reset_parameters()


def keras_parameter_count(model: nn.Module) -> int:
    """Parameters as Keras counts them: trainable ones plus BatchNorm moving mean/variance."""
    count = sum(p.numel() for p in model.parameters())
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            count += module.running_mean.numel() + module.running_var.numel()
    return count

"""The thesis's models: torchvision's AlexNet and VGG-13 (no BatchNorm) with 6 outputs, one
logit per tool (the Sigmoid is in the loss, `BCEWithLogits`, and in the scores).

The classes below are torchvision's (`torchvision.models.AlexNet`, `VGG(make_layers(cfgs["B"]))`)
written out with two additions:

- **ImageNet normalisation inside `forward`**: the model takes frames scaled to [0, 1] (the
  training loop divides uint8 frames by 255) and normalises them with the ImageNet mean and
  std, held as *non-persistent* buffers: they are not in the state dict, so they never travel
  in a message, are never averaged and never optimised by the server.
- **Demo-only sizes**: `width` multiplies every convolution's channels and `hidden` is the width
  of the two hidden fully-connected layers. At width 1 and hidden 4096 the module paths,
  tensor shapes and even the random initial weights (same seed) are torchvision's
  (tests/studies/surgical/test_models.py checks this), so a torchvision state-dict file loads as it is.

`load_weights(model, path)` loads such a file (e.g. the ImageNet weights
alexnet-owt-7be5be79.pth, vgg13-19584684.pth, from a local copy: nothing is downloaded) into
every layer but the last, which keeps its random 6-output initialisation.

Scoring runs in chunks of `inference_batch` frames when no gradient is recorded (memory only:
a full-size VGG-13 on 512 frames of 240x135 would need several GB).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from fedcare.data.common import DataError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
N_TOOLS = 6
VGG13_CONFIG: tuple[int | str, ...] = (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
HEAD = "classifier"  # the three fully-connected layers: FedRep's private head (thesis §4.1.7)


class WeightsError(DataError):
    """A weights file that cannot be loaded into the model; the message names the file."""


def _channels(c: int, width: float) -> int:
    return max(1, round(c * width))


class _Normalised(nn.Module):
    """ImageNet normalisation (non-persistent buffers) + chunked inference around features,
    avgpool, flatten, classifier (torchvision's forward)."""

    def _set_normalisation(self, inference_batch: int) -> None:
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        self.inference_batch = int(inference_batch)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x - self.mean) / self.std
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled() and len(x) > self.inference_batch:
            return torch.cat([self._forward(part) for part in x.split(self.inference_batch)])
        return self._forward(x)

    def last_layer(self) -> str:
        """The module path of the output layer (the one a weights file does not fill)."""
        return [path for path, m in self.named_modules() if isinstance(m, nn.Linear)][-1]


class AlexNet(_Normalised):
    """torchvision.models.AlexNet(num_classes=6), channels times `width`, FC width `hidden`."""

    def __init__(self, width: float = 1.0, hidden: int = 4096, dropout: float = 0.5, inference_batch: int = 64,
                 outputs: int = N_TOOLS):
        super().__init__()
        c1, c2, c3, c4, c5 = (_channels(c, width) for c in (64, 192, 384, 256, 256))
        self.features = nn.Sequential(
            nn.Conv2d(3, c1, kernel_size=11, stride=4, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(c1, c2, kernel_size=5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(c2, c3, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(c3, c4, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(c4, c5, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout),
            nn.Linear(c5 * 6 * 6, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, outputs),
        )
        self._set_normalisation(inference_batch)


class VGG13(_Normalised):
    """torchvision.models.vgg13(num_classes=6) (configuration "B", no BatchNorm, torchvision's
    initialisation), channels times `width`, FC width `hidden`."""

    def __init__(self, width: float = 1.0, hidden: int = 4096, dropout: float = 0.5, inference_batch: int = 64,
                 outputs: int = N_TOOLS):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for v in VGG13_CONFIG:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                out = _channels(int(v), width)
                layers += [nn.Conv2d(channels, out, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
                channels = out
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(channels * 7 * 7, hidden),
            nn.ReLU(True),
            nn.Dropout(p=dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(True),
            nn.Dropout(p=dropout),
            nn.Linear(hidden, outputs),
        )
        for m in self.modules():  # torchvision's VGG init_weights, in the same order
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.constant_(m.bias, 0)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.constant_(m.bias, 0)
        self._set_normalisation(inference_batch)


ARCHITECTURES = {"alexnet": AlexNet, "vgg13": VGG13}


def build_model(architecture: str, width: float = 1.0, hidden: int = 4096, dropout: float = 0.5,
                inference_batch: int = 64) -> _Normalised:
    if architecture not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {architecture!r}: choose one of {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[architecture](width, hidden, dropout, inference_batch)


def _shape(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def read_weights(path: Path | str) -> dict[str, torch.Tensor]:
    """A state-dict file (name -> tensor), read safely (`weights_only`); WeightsError naming
    the file if it is missing or not a state dict."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"{path}: no such weights file (model.weights: a torchvision state-dict file)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle, zip and torch errors alike
        raise WeightsError(f"{path}: not a PyTorch state-dict file ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if not isinstance(state, Mapping) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError(f"{path}: not a state dict (a mapping of parameter names to tensors, as torchvision's "
                           f"weight files are)")
    return dict(state)


def load_weights(model: _Normalised, path: Path | str, description: str = "") -> list[str]:
    """Copy a torchvision state-dict file into every layer of `model` but the last; returns
    the keys loaded. Raises WeightsError naming the file and the first key the model has and
    the file lacks or holds with another shape (in the model's order), or a key the file has
    that no layer of this model has (another architecture)."""
    path = Path(path)
    state = read_weights(path)
    own = model.state_dict()
    last = model.last_layer()
    skipped = {k for k in own if k.startswith(last + ".")}
    what = f" ({description})" if description else ""
    loaded = []
    for key, tensor in own.items():
        if key in skipped:
            continue
        if key not in state:
            raise WeightsError(f"{path}: has no {key!r}, which the model{what} needs with shape {_shape(tensor)}: "
                               f"not a torchvision state dict of this architecture")
        if state[key].shape != tensor.shape:
            raise WeightsError(f"{path}: {key!r} has shape {_shape(state[key])} in the file but {_shape(tensor)} in "
                               f"the model{what}: weights of another architecture or size")
        loaded.append(key)
    extra = [k for k in state if k not in own and not k.startswith(last + ".")]
    if extra:
        raise WeightsError(f"{path}: {extra[0]!r} is not a tensor of the model{what}: weights of another architecture")
    with torch.no_grad():
        for key in loaded:
            own[key].copy_(state[key].to(own[key].dtype))
    return loaded

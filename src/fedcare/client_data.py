"""One client's examples (`ClientData`): what a task scores, the training loop trains on, and a
site hands out. At the bottom of the layers, so tasks and algorithms can both name it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass
class ClientData:
    """One client's examples: inputs (uint8 images are scaled to [0, 1] per batch) and labels.

    `x` is a tensor, or an object that indexes like one, has `len`, `shape` and `dtype`, and
    answers `torch.cat` (`__torch_function__`): the surgical study's `FrameStack` reads frames
    from memory maps and the pain study's `FrameItems` cuts images when a batch asks."""

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"{len(self.x)} images but {len(self.y)} labels")

    def __len__(self) -> int:
        return len(self.y)

    @staticmethod
    def concat(parts: Iterable[ClientData]) -> ClientData:
        parts = list(parts)
        return ClientData(torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts]))

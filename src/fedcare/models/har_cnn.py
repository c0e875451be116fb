"""The HAR CNN of FedHealth 2 / FedAP for PAMAP2 (2 conv, 2 pool, 2 BatchNorm, 2 FC).

Layer sizes from the authors' code (PersonalizedFL ``PamapModel``, reported in
reference/fedhealth2-paper.md §3): conv 27->16 (kernel 9) - BN(16) - ReLU - maxpool 2/2;
conv 16->32 (kernel 9) - BN(32) - ReLU - maxpool 2/2; FC 32*L -> 64 - ReLU; FC 64 -> 10.
The authors feed (N, 27, 1, T) to Conv2d with (1, 9) kernels; here the input is (N, 27, T) and
the layers are the 1-D equivalents (Conv1d, BatchNorm1d, MaxPool1d), with the same parameter
count and the same per-channel BatchNorm statistics (over batch and time). L follows from the
window length: L = ((T - 8) // 2 - 8) // 2, i.e. 44 for the paper's T = 200 (32 * 44 = 1408).

Two top-level submodules: ``features`` (the conv part, both BatchNorm layers) and
``classifier`` (flatten + the two FC layers); FedPer-style splits select ``classifier.*``.
"""

from __future__ import annotations

from torch import nn

from fedcare.errors import InputError

KERNEL = 9


def har_flat_length(window: int) -> int:
    """Time steps left after the conv part for a window of `window` samples."""
    return ((window - (KERNEL - 1)) // 2 - (KERNEL - 1)) // 2


class HarCNN(nn.Module):
    def __init__(self, num_classes: int = 10, in_channels: int = 27, window: int = 200, hidden: int = 64):
        super().__init__()
        length = har_flat_length(window)
        if length < 1:
            raise InputError(f"window must be at least {2 * (2 * (KERNEL - 1) + 2) - (KERNEL - 1)} samples, got {window}")
        self.window = window
        self.features = nn.Sequential(
            nn.Conv1d(in_channels, 16, KERNEL), nn.BatchNorm1d(16), nn.ReLU(), nn.MaxPool1d(2, 2),
            nn.Conv1d(16, 32, KERNEL), nn.BatchNorm1d(32), nn.ReLU(), nn.MaxPool1d(2, 2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(32 * length, hidden), nn.ReLU(), nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.features(x))

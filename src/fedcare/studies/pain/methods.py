"""The pain study's methods as the thesis names them: RANDOM, BC, BF and C/F/FP/FL with an
initialisation N (random), C (centrally pretrained) or F (federatedly pretrained), and the
algorithms behind them. FBN (FedBN: BatchNorm layers stay at each client) is not in the
thesis; it is here for the membership audit's comparison (issue 12)."""

from __future__ import annotations

from dataclasses import dataclass

from fedcare.algorithms import Algorithm
from fedcare.algorithms.catalogue import build
from fedcare.algorithms.training import TrainSettings
from fedcare.studies.pain.config import METHOD_PATTERN, PainExperiment
from fedcare.tasks import BINARY

BASELINE_INIT = {"RANDOM": "N", "BC": "C", "BF": "F"}
FAMILY_ALGORITHM = {"C": "centralized", "F": "fedavg", "FP": "pfdl", "FL": "local", "FBN": "fedbn"}


@dataclass(frozen=True)
class Method:
    label: str  # e.g. "FP(C)"
    init: str  # N, C or F
    algorithm: str | None  # None for the untrained baselines

    @staticmethod
    def parse(label: str) -> "Method":
        match = METHOD_PATTERN.match(label)
        if not match:
            raise ValueError(f"unknown method {label!r}")
        if label in BASELINE_INIT:
            return Method(label, BASELINE_INIT[label], None)
        return Method(label, match.group(3), FAMILY_ALGORITHM[match.group(2)])

    @property
    def pools_data(self) -> bool:
        """Centralized training, and the Group-1 pretraining of the C and F inits (one split
        drawn across the whole group), need every client's data in one place."""
        return self.algorithm == "centralized" or self.init != "N"


EVAL_PIXELS = 2**21  # input pixels per evaluation batch


def eval_batch_size(image_size: int) -> int:
    """Frames per evaluation forward pass: 512 up to 64 px (the demo's numbers are computed so),
    fewer above, so a batch's activations stay small: at 215 px, 512 frames would hold 0.76 GB
    per tensor of the first conv block's output (2 GB peak, measured); 45 frames hold 67 MB."""
    return max(1, min(512, EVAL_PIXELS // (image_size * image_size)))


def make_algorithm(name: str, config: PainExperiment) -> Algorithm:
    t = config.train
    settings = TrainSettings(lr=t.lr, batch_size=t.batch_size, local_epochs=t.local_epochs, task=BINARY,
                             eval_batch_size=eval_batch_size(config.protocol.image_size))
    p = config.pfdl
    return build(name, settings, weighting=t.aggregation,
                 shared_paths=tuple(p.shared_paths), finetune_epochs=p.finetune_epochs, lr_factor=p.lr_factor)

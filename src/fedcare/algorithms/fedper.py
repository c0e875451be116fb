"""FedPer (Arivazhagan, Aggarwal, Singh, Choudhary, "Federated Learning with Personalization
Layers", 2019): base layers shared and averaged, personalization layers (the "head") private.

The head is declared by module path (`head_paths`, default the model's `classifier` block):
every parameter and buffer of a module at or under one of those paths stays on the client;
everything else, BatchNorm layers of the base included, is averaged as in FedAvg. Local
training is FedAvg's: every layer, base and head, trains for E epochs each round.

Choices where the paper is silent: which layers form the head (FedHealth 2 does not say;
the study config names them, default `classifier`); averaging weighted by example count,
as FedPer's server follows FedAvg (pass weighting="uniform" for the FedHealth 2 code's 1/N).
A head path that names no module of the model is an error, not an empty head.
"""

from __future__ import annotations

from fedcare.algorithms.base import Algorithm, ClientHalf, ServerHalf
from fedcare.algorithms.split import ParameterSplit
from fedcare.algorithms.training import TrainSettings

DEFAULT_HEAD = ("classifier",)


def head_split(head_paths: tuple[str, ...] | list[str]) -> ParameterSplit:
    """Everything shared except the modules under `head_paths` (which must exist in the model)."""
    if isinstance(head_paths, str):
        head_paths = (head_paths,)
    if not head_paths:
        raise ValueError("FedPer/FedRep need at least one head path")
    return ParameterSplit(private_paths=tuple(head_paths))


class FedPerClient(ClientHalf):
    """FedAvg's local training of the whole model; the head is the private state."""

    def __init__(self, settings: TrainSettings, split: ParameterSplit):
        super().__init__(settings, split)


class FedPerServer(ServerHalf):
    """Averages the base layers (the only ones it ever receives)."""


def fedper(settings: TrainSettings, head_paths: tuple[str, ...] = DEFAULT_HEAD, weighting: str = "examples") -> Algorithm:
    split = head_split(head_paths)
    return Algorithm("fedper", FedPerClient(settings, split), FedPerServer(split, weighting))

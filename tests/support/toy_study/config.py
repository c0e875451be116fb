"""The toy study's experiment file: a title, seeds, methods, where the data are, a few sizes."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from fedcare.config import Experiment, Strict


class ToyData(Strict):
    root: Path | None = None  # a folder of client-<k>.npz files; none: generate them into the run directory
    clients: int = Field(3, ge=2)
    identities_per_client: int = Field(4, ge=2)
    examples_per_identity: int = Field(12, ge=4)


class ToyExperiment(Experiment):
    study: Literal["toy"]
    methods: list[Literal["fedavg", "local"]] = Field(min_length=1)
    data: ToyData = ToyData()
    rounds: int = Field(3, ge=1)
    lr: float = Field(0.1, gt=0)

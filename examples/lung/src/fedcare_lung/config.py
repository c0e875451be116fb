"""The lung study's experiment file; unknown or mistyped keys are errors naming the key."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from fedcare.api import RoundsExperiment, RoundsTrain, Strict

METHODS = ("local", "fedavg", "fedprox", "single-site", "centralized")


class LungData(Strict):
    # a folder holding lung.csv in the layout of lifelines' copy (inst, time, status, age, sex,
    # ph.ecog, ph.karno, pat.karno, meal.cal, wt.loss); none: the copy inside lifelines
    root: Path | None = None
    horizon_days: int = Field(365, ge=1)  # the label: died within this many days of entry
    # an institution with fewer patients of known status becomes part of one client "other"
    # ("merge") or is left out ("drop")
    min_patients: int = Field(10, ge=2)
    small_sites: Literal["merge", "drop"] = "merge"
    test_fraction: float = Field(0.5, gt=0, lt=1)  # each client's held-out share, drawn per run seed


class LungModel(Strict):
    hidden: int = Field(16, ge=1)  # the MLP's hidden units


class LungExperiment(RoundsExperiment):
    title: str = "fedcare-lung: one-year mortality in the NCCTG lung cancer trial"
    study: Literal["lung"]
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2, 3, 4], min_length=1)
    methods: list[Literal[METHODS]] = Field(min_length=1)  # type: ignore[valid-type]
    data: LungData = LungData()
    model: LungModel = LungModel()
    train: RoundsTrain = RoundsTrain(lr=0.1, batch_size=16, local_epochs=2, rounds=30)

"""The pain study's experiment file (configs/pain/*.toml): validated by pydantic, unknown or
mistyped keys are errors naming the key. Defaults are the thesis's protocol (Table 7.1)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from fedcare.config import Aggregation, DataSource, Experiment, LocalEpochs, Rounds, Strict, Train
from fedcare.data.common import MAX_IMAGE_SIZE, MAX_SCALE
from fedcare.data.unbc.groups import THESIS_GROUP1, THESIS_GROUP2

METHOD_PATTERN = re.compile(r"^(RANDOM|BC|BF|(C|F|FP|FL|FBN)\((N|C|F)\))$")


class SyntheticPainData(Strict):
    """Options of the synthetic UNBC-layout cohort generated into the run directory."""

    seed: int = 0
    subjects: list[int] | None = None
    frame_scale: float = Field(0.05, gt=0, le=MAX_SCALE)
    image_size: int = Field(64, ge=16, le=MAX_IMAGE_SIZE)
    min_frames_per_sequence: int = Field(8, ge=1)


class PainData(DataSource):
    root: Path | None = None  # a UNBC-McMaster copy; relative paths resolve against the config's folder
    synthetic: SyntheticPainData | None = None
    pspi_threshold: float = 1.0  # pain = PSPI >= threshold (thesis: 1)
    drop_black_frames: bool = True  # the archive has pure-black frames (e.g. subject 095)
    augment_seed: int = 0  # rotation directions; fixed across run seeds, as the thesis augmented once on disk


class PainProtocol(Strict):
    pretrain_subjects: list[int] = Field(default_factory=lambda: list(THESIS_GROUP1))  # thesis Group 1
    subjects: list[int] = Field(default_factory=lambda: list(THESIS_GROUP2), min_length=1)  # thesis Group 2
    image_size: int = Field(215, ge=16)
    crop_ratio: float = Field(215 / 250, gt=0.5, le=1)
    balance_per_class: int = Field(200, ge=1)  # SessionBalancing T
    pretrain_val_fraction: float = Field(0.2, gt=0, lt=1)
    last_session: int | None = Field(None, ge=1)  # test sessions 1..last (default: every session present)
    # a test subject scored by a model pretrained on its own frames: refused unless allowed (the report warns)
    allow_overlap: bool = False

    @field_validator("pretrain_subjects", "subjects")
    @classmethod
    def _distinct(cls, subjects: list[int]) -> list[int]:
        if len(set(subjects)) != len(subjects):
            raise ValueError(f"a subject is listed twice: {sorted(s for s in set(subjects) if subjects.count(s) > 1)}")
        return subjects


class PainTrain(Train):
    # lr 1e-3 and batch_size 32: the thesis's, as Train's defaults
    local_epochs: LocalEpochs = 5
    rounds: Rounds = 30  # per session, at most: early stopping after `patience` rounds without a better validation loss
    patience: int = Field(5, ge=1)
    pretrain_rounds: Rounds = 30  # the same for pretraining
    pretrain_patience: int = Field(5, ge=1)
    aggregation: Aggregation = "uniform"  # thesis code: unweighted np.mean
    client_fraction: float = Field(1.0, gt=0, le=1)


class PFDLOptions(Strict):
    finetune_epochs: int = Field(5, ge=0)  # F
    lr_factor: float = Field(10.0, gt=0)  # fine-tuning runs at lr / lr_factor
    shared_paths: list[str] = Field(default_factory=lambda: ["features"])


class PainExperiment(Experiment):
    title: str = "fedcare pain study"
    study: Literal["pain"] = "pain"
    seeds: list[int] = Field(default_factory=lambda: list(range(123, 133)), min_length=1)
    # RANDOM (the untrained network) on these seeds instead (default: `seeds`): its call rate, so
    # its F1, is a draw of its init (0-100% of the frames across the thesis's seeds on the demo),
    # and evaluating it costs no training
    random_seeds: list[int] | None = Field(None, min_length=1)
    methods: list[str] = Field(min_length=1)
    data: PainData
    protocol: PainProtocol = PainProtocol()
    train: PainTrain = PainTrain()
    pfdl: PFDLOptions = PFDLOptions()
    offers_membership_audit: ClassVar[bool] = True  # [privacy.audit]: fedcare.studies.pain.audit
    renamed: ClassVar[dict[str, str]] = {"train.max_rounds": "train.rounds",  # until 0.3: every study says rounds
                                         "train.pretrain_max_rounds": "train.pretrain_rounds"}

    @model_validator(mode="after")
    def _pretraining(self) -> "PainExperiment":
        pretrained = [m for m in self.methods if m in ("BC", "BF") or m.endswith(("(C)", "(F)"))]
        p = self.protocol
        if pretrained and not p.pretrain_subjects:
            raise ValueError(f"protocol.pretrain_subjects: methods {pretrained} start from a model pretrained on "
                             f"these subjects; list at least one")
        overlap = sorted(set(p.pretrain_subjects) & set(p.subjects))
        if pretrained and overlap and not p.allow_overlap:
            raise ValueError(f"protocol.subjects: {overlap} are also pretraining subjects, so methods {pretrained} "
                             f"would test them with a model pretrained on their own frames; remove them from one "
                             f"list, or set protocol.allow_overlap = true (the report then says so)")
        return self

    @field_validator("seeds", "random_seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int] | None) -> list[int] | None:
        if seeds is not None and len(set(seeds)) != len(seeds):
            raise ValueError(f"a seed is listed twice: {sorted(s for s in set(seeds) if seeds.count(s) > 1)}")
        return seeds

    def seeds_of(self, method: str) -> list[int]:
        """The seeds `method` runs on."""
        return self.random_seeds if method == "RANDOM" and self.random_seeds is not None else self.seeds

    @field_validator("methods")
    @classmethod
    def _methods(cls, methods: list[str]) -> list[str]:
        for m in methods:
            if not METHOD_PATTERN.match(m):
                raise ValueError(
                    f"unknown method {m!r}: use RANDOM, BC, BF or C/F/FP/FL/FBN with an init N, C or F, e.g. 'FP(C)'"
                )
        return methods  # listed twice: Experiment's check

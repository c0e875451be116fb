"""The FedHealth 2 study's experiment file (configs/fedhealth2/*.toml); unknown or mistyped keys
are errors naming the key. Defaults are the paper's protocol and the authors' code ([code])."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from fedcare.config import (MAX_CLIENTS, Aggregation, DataSource, Experiment, LearningRate, LocalEpochs, ProximalMu,
                            Rounds, Strict, Train)
from fedcare.data.common import MAX_IMAGE_SIZE, MAX_SCALE

FEDHEALTH2_METHODS = ("local", "fedavg", "fedprox", "fedbn", "fedper", "fedap", "d-fedap", "f-fedap")
PRETRAINED_METHODS = ("fedap", "d-fedap")  # start from the pretrained model and run their setup before round 1


class FedHealth2Synthetic(Strict):
    """Generator options: PAMAP2 (`subjects`, `seconds_per_activity`) or X-ray (`scale`,
    `image_size`, and `sites` for the natural split: one folder per site)."""

    seed: int = 0
    subjects: int = Field(9, ge=2)
    seconds_per_activity: float = Field(30.0, gt=0, le=3600)
    scale: float = Field(0.05, gt=0, le=MAX_SCALE)
    image_size: int = Field(64, ge=16, le=MAX_IMAGE_SIZE)
    sites: int = Field(4, ge=2)  # X-ray, natural split: site folders, each with its own look


class FedHealth2Data(DataSource):
    dataset: Literal["pamap2", "xray"]
    # a PAMAP2 copy, a Sait et al. X-ray copy, or (X-ray, natural split) a folder holding one
    # X-ray copy per site; relative to the config's folder
    root: Path | None = None
    synthetic: FedHealth2Synthetic | None = None


class FedHealth2Protocol(Strict):
    # "dirichlet": the paper's label-skewed split of one pooled dataset into `clients` (runs in
    # this process only); "natural": one client per PAMAP2 subject or per X-ray site folder,
    # each holding its own data (also across sites on Flower)
    split: Literal["dirichlet", "natural"] = "dirichlet"
    clients: int = Field(20, ge=2, le=MAX_CLIENTS)  # dirichlet
    dirichlet_alpha: float = Field(0.1, gt=0)  # [code] non_iid_alpha
    # natural: the clients (PAMAP2 subject ids, X-ray site folder names); empty: every one under data.root
    subjects: list[int | str] = Field(default_factory=list)
    test_fraction: float = Field(0.5, gt=0, lt=1)  # 50/50 per client (paper)
    pretrain_fraction: float = Field(0.2, gt=0, lt=1)  # FedAP's pretrained model: a random 20% (paper)
    # FedAP's pretrained start: "pooled" trains one model on a share of the pooled training
    # data (the paper); "federated" runs FedAvg on each client's own share (what sites can do)
    pretrain: Literal["pooled", "federated"] = "pooled"
    window: int = Field(200, ge=8)  # PAMAP2: 2 s at 100 Hz (the HAR CNN's flatten size implies T = 200)
    step: int = Field(100, ge=1)  # PAMAP2 window stride
    image_size: int = Field(64, ge=63, le=MAX_IMAGE_SIZE)  # X-ray input side (AlexNet needs >= 63)


class FedHealth2Train(Train):
    lr: LearningRate = 1e-2  # paper: SGD, 1e-2 (batch_size 32: [code], as Train's default)
    local_epochs: LocalEpochs = 1
    rounds: Rounds = 20
    pretrain_rounds: Rounds = 10  # FedAP's pretraining: epochs (pooled) or FedAvg rounds (federated)
    aggregation: Aggregation = "examples"
    hidden: int = Field(4096, ge=8)  # AlexNet's FC width (X-ray)
    mu: ProximalMu = 1e-3  # FedProx's mu ([code] mu = 1e-3); options.fedprox_mu before 0.3


class FedHealth2Options(Strict):
    fedprox_squared: bool = True  # paper: (mu/2)||w - w_g||^2; the code used the unsquared norm
    fedper_private: list[str] = Field(default_factory=lambda: ["classifier"])
    fedap_lambda: float = Field(0.5, ge=0, le=1)  # [code] model_momentum
    ffedap_warmup_rounds: int = Field(5, ge=1)  # FedBN rounds before f-FedAP's weights (paper: "several")


class FedHealth2Experiment(Experiment):
    title: str = "fedcare FedHealth 2 study"
    study: Literal["fedhealth2"]
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    methods: list[Literal[FEDHEALTH2_METHODS]] = Field(min_length=1)  # type: ignore[valid-type]
    data: FedHealth2Data
    protocol: FedHealth2Protocol = FedHealth2Protocol()
    train: FedHealth2Train = FedHealth2Train()
    options: FedHealth2Options = FedHealth2Options()
    renamed: ClassVar[dict[str, str]] = {"options.fedprox_mu": "train.mu",  # until 0.3
                                         "train.pretrain_epochs": "train.pretrain_rounds"}

"""The surgical tool-presence study's experiment file (configs/surgical/*.toml): the Markert
thesis (NCT Dresden, 2022). Unknown or mistyped keys are errors naming the key. Defaults are
the thesis's AlexNet protocol (§5.2.3); configs/surgical/markert2022-vgg13.toml sets VGG-13's.

Choices where the thesis is silent are written next to their option.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from fedcare.config import (BatchSize, Experiment, LearningRate, LocalEpochs, ProximalMu, Rounds, Strict, Train,
                            listed_twice)

CLIENT_NAMES = ("HEI1", "HEI2", "CHO1", "CHO2", "CHO3")  # the thesis's five clients (§5.1.1), in its order
FL_METHODS = ("fedavg", "fedprox", "feddyn", "feddg", "fedrep")
UNIFORM = "-uniform"  # suffix: unweighted aggregation (c_k = 1/K), the thesis's ablation
BASELINES = ("cent", "lot")  # centralized on pooled data; local only (reported as ALTV and EGOV)
SURGICAL_METHODS = (*FL_METHODS, *(m + UNIFORM for m in FL_METHODS), *BASELINES)
POOLED_METHODS = ("cent",)  # need every client's data in one place: in this process only


class SurgicalSynthetic(Strict):
    """`fedcare.data.surgical.synthetic.generate_surgical`'s options: a Cholec80 and a HeiChole
    copy generated into the run directory (`synthetic-data/`; a resumed run has it already)."""

    seed: int = Field(0, ge=0)
    videos: int = Field(4, ge=2, le=16)  # Cholec80 videos of CHO1 and of CHO3 (CHO2 gets twice as many)
    heichole_videos: int = Field(6, ge=4, le=12)  # videos per HeiChole centre (3 of them are test videos)
    seconds: int = Field(30, ge=8, le=3600)  # mean Cholec80 video length (1 labelled frame per second)
    heichole_seconds: int | None = Field(None, ge=8, le=3600)  # default: about 3/4 of CHO1's frames per HeiChole client
    width: int = Field(240, ge=64)  # the mp4 files' frame size (even numbers)
    height: int = Field(136, ge=36)


class SurgicalData(Strict):
    """Where the frames come from: a folder holding `cholec80/` and `heichole/` (`root`, the same
    layout a site's data directory has), copies elsewhere (`cholec80`, `heichole`), or
    `[data.synthetic]`. Relative paths resolve against the config file's folder."""

    root: Path | None = None  # a folder holding cholec80/ (a Cholec80 copy) and heichole/ (a HeiChole copy)
    cholec80: Path | None = None  # a Cholec80 copy elsewhere (instead of root/cholec80)
    heichole: Path | None = None  # a HeiChole copy elsewhere (instead of root/heichole)
    synthetic: SurgicalSynthetic | None = None
    # the decoded-frame cache (`fedcare.data.video.FrameCache`); default: $FEDCARE_CACHE or
    # ~/.cache/fedcare/frames, and for synthetic data a folder in the run directory (frame-cache/)
    cache: Path | None = None
    frame_size: tuple[int, int] = (240, 135)  # (width, height) the frames are resized to (thesis: 240x135)
    cholec80_split: str = "thesis"  # fedcare.data.surgical.cholec80.SPLITS: "thesis" = videos 1-60 train, 61-80 test
    split_seed: int = Field(0, ge=0)  # draws the 3 HeiChole test videos per centre (thesis: "random")

    @field_validator("frame_size")
    @classmethod
    def _size(cls, size: tuple[int, int]) -> tuple[int, int]:
        if min(size) < 32:
            raise ValueError(f"frame_size (width, height) must be at least 32 pixels each, got {list(size)}")
        return size

    @model_validator(mode="after")
    def _one_source(self) -> "SurgicalData":
        copies = any(p is not None for p in (self.root, self.cholec80, self.heichole))
        if copies == (self.synthetic is not None):
            raise ValueError("give exactly one of data.root (a folder holding cholec80/ and heichole/, or data.cholec80 "
                             "and data.heichole) or [data.synthetic]")
        return self


class SurgicalModel(Strict):
    architecture: Literal["alexnet", "vgg13"] = "alexnet"  # torchvision's AlexNet / VGG-13 (no BatchNorm)
    # a torchvision state-dict file (e.g. ImageNet weights, alexnet-owt-7be5be79.pth) loaded into every
    # layer but the last (6 outputs); none: torchvision's random initialisation (a deviation: the thesis
    # starts from ImageNet weights; the report says so)
    weights: Path | None = None
    # demo-only sizes: a factor on every convolution's channels and the width of the two hidden
    # fully-connected layers; the thesis's models are width = 1.0, hidden = 4096
    width: float = Field(1.0, gt=0, le=1)
    hidden: int = Field(4096, ge=8)
    dropout: float = Field(0.5, ge=0, lt=1)  # torchvision's default, in the classifier


class SurgicalTrain(Train):
    rounds: Rounds = 50  # E_global; also the epochs of CENT and of each LOT model
    local_epochs: LocalEpochs = 1  # E_local of the FL methods
    batch_size: BatchSize = 128  # CENT, LOT and local FL alike (AlexNet 128, VGG-13 16)
    lr: LearningRate = 1e-3  # local SGD (no momentum, no weight decay), one-cycle maximum
    server_lr: float = Field(1e-3, gt=0)  # the server's AdamW on the pseudo-gradient, every FL method
    server_weight_decay: float = Field(1e-2, ge=0)  # not in the thesis: torch's AdamW default
    # not in the thesis (its server rate is constant): hold server_lr for the one-cycle warm-up
    # share of the rounds, then cosine-anneal it to 0 by the last round, as the clients' rate
    # (docs/studies/surgical.md: what the constant rate does to the FL losses' convergence)
    server_anneal: bool = False
    mu: ProximalMu = 1e-2  # FedProx's mu and FedDyn's alpha (the thesis's mu for both)
    cent_lr: float = Field(1e-4, gt=0)  # CENT: AdamW one-cycle maximum (AlexNet 1e-4, VGG-13 1e-5)
    lot_lr: float = Field(1e-4, gt=0)  # LOT: AdamW one-cycle maximum
    weight_decay: float = Field(1e-2, ge=0)  # CENT's and LOT's AdamW (not in the thesis: torch's default)
    # one-cycle warm-up share; not in the thesis: torch's 0.3. Stepped every batch, one cycle over
    # all `rounds` (round r continues where r - 1 ended)
    pct_start: float = Field(0.3, gt=0, lt=1)
    # torch's OneCycleLR also cycles SGD's momentum / Adam's beta1 (0.95 -> 0.85) unless told not to;
    # the thesis's local SGD has no momentum, so the schedule moves the learning rate only (false)
    cycle_momentum: bool = False
    # BCE positive weights p_j = negatives / positives of tool j: "client" from each client's own
    # training labels (CENT: from the pooled ones); "global" from every client's training labels
    # pooled (a pooled statistic: in this process only); "none": plain BCE. The thesis does not say.
    pos_weight: Literal["client", "global", "none"] = "client"
    head_epochs: int = Field(1, ge=0)  # FedRep's E_head (the classifier block, private)
    body_epochs: int = Field(1, ge=0)  # FedRep's E_repr (the convolutional layers, shared)
    feddg_p: float = Field(0.5, ge=0, le=1)  # FedDG: probability an image is augmented (not in the thesis)
    feddg_bank: int = Field(64, ge=1)  # FedDG: amplitude spectra each client sends to the bank
    eval_batch_size: int = Field(64, ge=1)  # frames per forward pass when scoring (memory only, not results)
    threshold: float = Field(0.5, gt=0, lt=1)  # a tool is predicted present when its sigmoid >= this


class SurgicalExperiment(Experiment):
    offers_membership_audit: ClassVar[bool] = True  # [privacy.audit]: fedcare.privacy.client_audit
    title: str = "fedcare surgical tool-presence study (Markert 2022)"
    study: Literal["surgical"]
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    # fedavg fedprox feddyn feddg fedrep (each with the server AdamW; "-uniform": unweighted
    # aggregation), cent (centralized, pooled data), lot (local only: ALTV and EGOV)
    methods: list[Literal[SURGICAL_METHODS]] = Field(min_length=1)  # type: ignore[valid-type]
    clients: list[Literal[CLIENT_NAMES]] = Field(default_factory=lambda: list(CLIENT_NAMES), min_length=2)  # type: ignore[valid-type]
    data: SurgicalData
    model: SurgicalModel = SurgicalModel()
    train: SurgicalTrain = SurgicalTrain()

    @field_validator("clients")  # methods listed twice: Experiment's check
    @classmethod
    def _distinct(cls, items: list[str]) -> list[str]:
        twice = listed_twice(items)
        if twice:
            raise ValueError(f"listed twice: {twice}")
        return items

    @model_validator(mode="after")
    def _frames_fit_the_model(self) -> "SurgicalExperiment":
        if self.model.architecture == "alexnet" and min(self.data.frame_size) < 63:
            raise ValueError(f"data.frame_size {list(self.data.frame_size)}: AlexNet needs frames of at least 63x63 "
                             f"pixels")
        return self

    @model_validator(mode="after")
    def _updates_are_measured(self) -> "SurgicalExperiment":
        # the thesis's CosSim and GradDiff (Fig. 6.3) are statistics of each client's update at the server
        if self.privacy is not None and self.privacy.secure_aggregation is not None:
            raise ValueError("privacy.secure_aggregation: the surgical study measures each client's update at the "
                             "server (CosSim, GradDiff), which secure aggregation hides")
        return self

    def relative_to(self, folder: Path) -> "SurgicalExperiment":
        """Relative data folders, the frame cache and the weights file resolve against `folder`."""
        def resolve(p: Path | None) -> Path | None:
            return p if p is None or Path(p).is_absolute() else folder / p

        d, m = self.data, self.model
        data = d.model_copy(update={k: resolve(getattr(d, k)) for k in ("root", "cholec80", "heichole", "cache")})
        model = m.model_copy(update={"weights": resolve(m.weights)})
        return self.model_copy(update={"data": data, "model": model})

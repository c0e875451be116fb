"""The face-verification study's experiment file (configs/facerec/*.toml); unknown or mistyped
keys are errors naming the key. Defaults are the Hess thesis's protocol (reference note §3-§4)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from fedcare.config import MAX_CLIENTS, Aggregation, BatchSize, DataSource, Experiment, LearningRate, Rounds, Strict, Train
from fedcare.data.common import MAX_IDENTITIES, MAX_IMAGE_SIZE, MAX_IMAGES_PER_IDENTITY

# "<algorithm>[-variant]": FedAvg ("fedavg") or federated HF-MAML ("hfmaml") with the global
# ArcFace head (shared, every client's identities), "-local" (each client's own head, private),
# "-reg" (embedding regularisation, the thesis's "Penalty") or "-fair" (q-FedAvg, "Fair")
FACEREC_METHODS = ("fedavg", "fedavg-local", "fedavg-reg", "fedavg-fair",
                   "hfmaml", "hfmaml-local", "hfmaml-reg", "hfmaml-fair", "fedfr")  # fedfr: local heads


class FacerecSynthetic(Strict):
    """A synthetic CelebA copy generated into the run directory (`fedcare data synth celeba`)."""

    seed: int = 0
    identities: int = Field(300, ge=2, le=MAX_IDENTITIES)
    images_per_identity: int = Field(20, ge=2, le=MAX_IMAGES_PER_IDENTITY)


class FacerecData(DataSource):
    root: Path | None = None  # a CelebA copy (relative to the config's folder)
    synthetic: FacerecSynthetic | None = None
    partition: Literal["equal", "lognormal", "attribute"] = "lognormal"
    partition_seed: int = 0  # the partition is fixed over runs (thesis: same seed for all runs)
    identities: int = Field(1500, ge=2)  # equal / lognormal: identities over all clients
    clients: int = Field(20, ge=2, le=MAX_CLIENTS)  # equal / lognormal (attribute: Table 4.1's 20 clients)
    attribute_scale: float = Field(1.0, gt=0)  # attribute: Table 4.1 sizes x this
    image_size: int = Field(128, ge=16, le=MAX_IMAGE_SIZE)  # the face crops' side (thesis 128)
    detector_scale_factor: float = Field(1.1, gt=1.0)  # Haar pyramid step (1.1: OpenCV's default)
    detector_min_size: int = Field(48, ge=16)  # smallest face side in pixels
    cache: Path | None = None  # the face-crop cache folder; none: ~/.cache/fedcare/celeba-faces


class FacerecProtocol(Strict):
    unseen: list[int] = Field(default_factory=lambda: [16, 17, 18, 19, 20])  # never train: tuning and evaluation only
    paths: int = Field(5, ge=1)  # evaluation paths per trained model (thesis: 5)
    genuine_pairs: int = Field(1000, ge=1)
    impostor_pairs: int = Field(1000, ge=1)
    far: float = Field(0.1, gt=0, lt=1)
    # impostor pairs' second image: the client's own test split ("local testing", the default),
    # or the test splits of all clients ("global testing", thesis Algorithm 7's D_global)
    impostors: Literal["local", "global"] = "local"


class FacerecTrain(Train):
    rounds: Rounds = 30  # protocol.rounds before 0.3
    lr: LearningRate = 0.01  # SGD, FedAvg's local steps and tuning
    momentum: float = Field(0.9, ge=0, lt=1)
    batch_size: BatchSize = 64
    local_steps: int = Field(50, ge=1)  # batches per round (HF-MAML: steps of three batches)
    local_unit: Literal["batches", "epochs"] = "batches"  # FedAvg variants: "epochs" = the literal reading, local_steps passes over the data
    tune_steps: int = Field(10, ge=0)  # tuning batches before evaluation (thesis: 10 of 64)
    arcface_scale: float = Field(8.0, gt=0)
    arcface_margin: float = Field(0.5, ge=0)
    aggregation: Aggregation = "examples"  # n_k / sum n_i (thesis Algorithm 6)
    weights: Path | None = None  # a ResNet-18 state dict file (torchvision keys) to start from; none: random


class FacerecOptions(Strict):
    hfmaml_alpha: float = Field(0.01, gt=0)  # Table 4.5
    hfmaml_beta: float = Field(0.1, gt=0)
    hfmaml_delta: float = Field(0.001, gt=0)
    reg_c: float = Field(10.0, ge=0)  # embedding regularisation weight C (thesis §4.7)
    qfedavg_q: float = Field(0.001, ge=0)  # thesis §2.5
    qfedavg_lipschitz: float = Field(100.0, gt=0)  # L (1 / lr)
    fedfr_arcface: float = Field(1.0, ge=0)  # FedFR's loss weights α1, α2, α3 (thesis §2.6)
    fedfr_contrastive: float = Field(5.0, ge=0)
    fedfr_binary: float = Field(10.0, ge=0)
    qfedavg_weighting: Literal["uniform", "examples"] = "uniform"  # q-FFL's sum over clients (see algorithms/qfedavg.py)


class FacerecExperiment(Experiment):
    offers_membership_audit: ClassVar[bool] = True  # [privacy.audit]: fedcare.privacy.client_audit
    title: str = "fedcare face-verification study (Hess)"
    study: Literal["facerec"]
    seeds: list[int] = Field(default_factory=lambda: list(range(10)), min_length=1)  # thesis: 10 runs
    methods: list[Literal[FACEREC_METHODS]] = Field(min_length=1)  # type: ignore[valid-type]
    data: FacerecData
    protocol: FacerecProtocol = FacerecProtocol()
    train: FacerecTrain = FacerecTrain()
    options: FacerecOptions = FacerecOptions()
    renamed: ClassVar[dict[str, str]] = {"protocol.rounds": "train.rounds"}  # until 0.3: every study says train.rounds

    def relative_to(self, folder: Path) -> "FacerecExperiment":
        """data.root, data.cache and train.weights relative to the config file's folder."""
        config = super().relative_to(folder)
        data, train = config.data, config.train
        if data.cache is not None and not data.cache.is_absolute():
            data = data.model_copy(update={"cache": folder / data.cache})
        if train.weights is not None and not train.weights.is_absolute():
            train = train.model_copy(update={"weights": folder / train.weights})
        return config.model_copy(update={"data": data, "train": train})

    @model_validator(mode="after")
    def _unseen_are_clients(self) -> "FacerecExperiment":
        clients = 20 if self.data.partition == "attribute" else self.data.clients
        bad = [c for c in self.protocol.unseen if not 1 <= c <= clients]
        if bad:
            raise ValueError(f"protocol.unseen: {bad} are not clients (1..{clients})")
        if len(set(self.protocol.unseen)) >= clients:
            raise ValueError("protocol.unseen: at least one client must train")
        if self.data.partition != "attribute":  # each client needs identities of its own
            have = {"data.identities": self.data.identities}
            if self.data.synthetic is not None:
                have["data.synthetic.identities"] = self.data.synthetic.identities
            key, fewest = min(have.items(), key=lambda kv: kv[1])
            if fewest < clients:
                raise ValueError(f"{key} = {fewest} is fewer than data.clients = {clients}: some clients would "
                                 "have no identity (and no data)")
        return self

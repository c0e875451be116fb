"""The privacy audit's experiment file (configs/privacy_audit/*.toml); unknown or mistyped keys
are errors naming the key. The defaults are `fedcare demo privacy_audit`'s."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from fedcare.config import (
    MAX_CLIENTS, Aggregation, BatchSize, Experiment, LearningRate, LocalEpochs, NoiseMultiplier, Rounds, Strict, TargetEpsilon, Train,
)

AUDIT_METHODS = ("FedAvg", "PFDL", "FedBN", "local")


class AuditData(Strict):
    """The membership audit's clients: small noisy synthetic images drawn in memory from the
    run seed (an overfitting regime, where membership leaks most)."""

    clients: int = Field(6, ge=2, le=MAX_CLIENTS)
    train: int = Field(48, ge=2)  # training examples per client: the members
    test: int = Field(48, ge=2)  # held-out examples per client: the non-members
    image_size: int = Field(12, ge=2)


class AuditProtocol(Strict):
    # DP-SGD's noise multipliers, each audited after the plain run (FedBN runs plain only: under
    # DP-SGD its BatchNorm becomes a private GroupNorm, another model than the plain FedBN's)
    noise_multipliers: list[NoiseMultiplier] = Field(default_factory=lambda: [0.6, 1.5])
    max_grad_norm: float = Field(1.0, gt=0)  # DP-SGD's C
    delta: float = Field(1e-5, gt=0, lt=1)  # the delta epsilon is reported at
    # LiRA's shadow federations per case (offline LiRA, fedcare.privacy.lira); 0: the loss attack only
    shadow_models: int = Field(4, ge=0)
    # a budgeted DP-SGD level, audited after the noise levels: each client's noise calibrated so
    # that the planned fit epochs (rounds x local epochs) spend this epsilon at `delta`; a client
    # stops before a step would cross it (PFDL's fine-tuning, not planned for, ends early)
    target_epsilon: TargetEpsilon | None = None
    # the one-run audit of client-level DP ([privacy.audit] canary_clients): FedAvg under DP-FedAvg
    # without noise (clipping only) and at each of these noise multipliers, clipped to this norm
    client_dp_noise_multipliers: list[NoiseMultiplier] = Field(default_factory=lambda: [1.0, 3.0])
    client_dp_clipping_norm: float = Field(1.0, gt=0)
    # the one-run audits, as [privacy.audit] in the other studies (0: none): gradient canaries per
    # client in one run of each DP-SGD case (none and each noise multiplier); canary clients in one
    # run of FedAvg under client-level DP per level; epsilon-hat at audit_confidence
    canaries: int = Field(0, ge=0)
    canary_clients: int = Field(0, ge=0)
    audit_confidence: float = Field(0.95, gt=0, lt=1)

    @model_validator(mode="after")
    def _positive_noise(self) -> "AuditProtocol":
        if self.shadow_models == 1:
            raise ValueError("protocol.shadow_models: LiRA needs at least 2 (a variance from one model), or 0 for none")
        if any(s <= 0 for s in self.noise_multipliers):
            raise ValueError("protocol.noise_multipliers: each must be > 0 (the plain run is always audited)")
        if any(s <= 0 for s in self.client_dp_noise_multipliers):
            raise ValueError("protocol.client_dp_noise_multipliers: each must be > 0 (the run without noise is always "
                             "audited)")
        if len(set(self.noise_multipliers)) != len(self.noise_multipliers):
            raise ValueError("protocol.noise_multipliers: each level once")
        return self


class AuditTrain(Train):
    rounds: Rounds = 6  # per audited case (protocol.rounds before 0.3)
    lr: LearningRate = 0.1
    batch_size: BatchSize = 16
    local_epochs: LocalEpochs = 4
    aggregation: Aggregation = "uniform"
    pfdl_finetune_epochs: int = Field(2, ge=0)


class InversionOptions(Strict):
    """Gradient inversion (Geiping et al. 2020) of one FedSGD step of the pain CNN, per case
    (full update, PFDL's conv-only share, DP-SGD's release); `fedcare.privacy.inversion`."""

    steps: int = Field(300, ge=1)  # Adam steps of the attack
    lr: float = Field(0.1, gt=0)
    tv: float = Field(1e-2, ge=0)  # weight of the total-variation prior
    batch: int = Field(2, ge=1)  # frames in the attacked batch
    image_size: int = Field(32, ge=16)  # the pain demo's frames
    sigma: NoiseMultiplier = 1.0  # the DP-SGD case's noise multiplier
    max_grad_norm: float = Field(1.0, gt=0)  # the DP-SGD case's C


class PrivacyAuditExperiment(Experiment):
    title: str = "fedcare privacy audit"
    study: Literal["privacy_audit"]
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    methods: list[Literal[AUDIT_METHODS]] = Field(min_length=1)  # type: ignore[valid-type]
    data: AuditData = AuditData()
    protocol: AuditProtocol = AuditProtocol()
    train: AuditTrain = AuditTrain()
    inversion: InversionOptions = InversionOptions()
    renamed: ClassVar[dict[str, str]] = {"protocol.rounds": "train.rounds"}  # until 0.3: every study says train.rounds

    @model_validator(mode="after")
    def _no_privacy_table(self) -> "PrivacyAuditExperiment":
        if self.privacy is not None:
            raise ValueError("privacy: the privacy_audit study applies DP-SGD and client-level DP itself, at each of "
                             "protocol.noise_multipliers and protocol.client_dp_noise_multipliers, and its one-run "
                             "audits with protocol.canaries and protocol.canary_clients; a [privacy] table does not "
                             "apply to it")
        return self

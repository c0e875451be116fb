"""`[privacy]`: DP-SGD, client-level DP, secure aggregation and the audits."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from fedcare.config.base import MAX_EPOCHS, MAX_ROUNDS, Strict

# Bounds, so that every value can finish and be accounted for. A noise multiplier past MAX_NOISE
# drowns any batch's gradient (and at 1e300 the noise and the accountant's sums overflow: epsilon
# came out infinite for the most noise); 0 is allowed, clipping only: epsilon is infinite, no
# guarantee. A budget past MAX_TARGET_EPSILON bounds nothing (e^100), and Opacus's calibration
# never ends for one it cannot reach (1e308); a budget too small for the accountant is refused
# when the methods are built (`fedcare.privacy`), naming the key.
MAX_NOISE = 1e6
MAX_TARGET_EPSILON = 100.0
NoiseMultiplier = Annotated[float, Field(ge=0, le=MAX_NOISE)]
TargetEpsilon = Annotated[float, Field(gt=0, le=MAX_TARGET_EPSILON)]


class DPSGD(Strict):
    """`[privacy.dp_sgd]`: sample-level DP-SGD at every client (Abadi et al. 2016): each
    example's gradient is clipped to `max_grad_norm`, Gaussian noise of standard deviation
    `noise_multiplier * max_grad_norm` is added to the batch's sum (`fedcare.privacy.dp_sgd`)."""

    noise_multiplier: NoiseMultiplier = 1.0  # sigma; 0: clipping only (no privacy: epsilon is infinite)
    max_grad_norm: float = Field(1.0, gt=0, allow_inf_nan=True)  # C, the per-example L2 bound; inf: no clipping
    delta: float = Field(1e-5, gt=0, lt=1)  # the target delta epsilon is reported for
    accountant: Literal["rdp", "prv"] = "rdp"  # Opacus's RDP or PRV accountant
    # BatchNorm mixes the examples of a batch, so per-example gradients do not exist:
    # "groupnorm" replaces every BatchNorm by a GroupNorm (Opacus's ModuleValidator.fix);
    # "refuse" stops with an error for a model that has BatchNorm.
    batchnorm: Literal["groupnorm", "refuse"] = "groupnorm"
    # "poisson": each example joins each batch with probability batch_size / n (what the
    # accountant assumes); "shuffle": fixed-size shuffled batches, epsilon then approximate
    sampling: Literal["poisson", "shuffle"] = "poisson"
    # a budget instead of a noise multiplier: sigma calibrated per client so that
    # `budget_epochs` passes over its data spend `target_epsilon` at `delta`; a client stops
    # training (later fits recorded as skipped) before a step would cross it
    target_epsilon: TargetEpsilon | None = None
    # passes planned over the whole run: rounds x (local + fine-tuning) epochs
    budget_epochs: float | None = Field(None, gt=0, le=MAX_ROUNDS * MAX_EPOCHS)

    @model_validator(mode="after")
    def _budget(self) -> "DPSGD":
        if self.target_epsilon is not None:
            if self.budget_epochs is None:
                raise ValueError("target_epsilon needs budget_epochs: the passes over a client's data the budget "
                                 "must last (rounds x local epochs, plus fine-tuning epochs)")
            if "noise_multiplier" in self.model_fields_set:
                raise ValueError("give target_epsilon or noise_multiplier, not both (the noise multiplier is "
                                 "calibrated from target_epsilon)")
        elif self.budget_epochs is not None:
            raise ValueError("budget_epochs applies with target_epsilon only")
        return self

    @model_validator(mode="after")
    def _finite_noise(self) -> "DPSGD":
        if math.isinf(self.max_grad_norm) and self.noise_multiplier > 0:
            raise ValueError("max_grad_norm = inf (no clipping) makes the noise, noise_multiplier x max_grad_norm, "
                             "infinite: clip (a finite max_grad_norm) or set noise_multiplier = 0")
        return self


class ClientDP(Strict):
    """`[privacy.client_dp]`: client-level DP at the server (DP-FedAvg, McMahan et al. 2018;
    Andrew et al. 2021 for adaptive clipping), as Flower's DifferentialPrivacyServerSide*
    wrappers do it: each client's update is clipped to the clipping norm, the clipped updates
    are averaged uniformly, and Gaussian noise of std noise_multiplier * norm / clients is added."""

    noise_multiplier: NoiseMultiplier = 1.0  # sigma; 0: clipping only (no privacy: epsilon is infinite)
    clipping_norm: float = Field(1.0, gt=0)  # the fixed norm, or the adaptive norm's start
    adaptive: bool = False  # adapt the norm towards the `target_quantile` of update norms
    target_quantile: float = Field(0.5, ge=0, le=1)  # gamma: the fraction of updates left unclipped, C tends to that quantile
    clip_norm_lr: float = Field(0.2, gt=0)  # the geometric update's learning rate
    clipped_count_stddev: float | None = Field(None, ge=0)  # None: clients / 20, Flower's default
    delta: float = Field(1e-5, gt=0, lt=1)  # the target delta epsilon is reported for
    # a budget instead of a noise multiplier: sigma calibrated so that `budget_rounds` rounds
    # spend `target_epsilon` at `delta`; a client whose next round would cross it is skipped
    target_epsilon: TargetEpsilon | None = None
    budget_rounds: int | None = Field(None, ge=1, le=MAX_ROUNDS)  # the rounds each client is planned to take part in, over the run

    @model_validator(mode="after")
    def _budget(self) -> "ClientDP":
        if self.target_epsilon is not None:
            if self.budget_rounds is None:
                raise ValueError("target_epsilon needs budget_rounds: the rounds the budget must last")
            if "noise_multiplier" in self.model_fields_set:
                raise ValueError("give target_epsilon or noise_multiplier, not both (the noise multiplier is "
                                 "calibrated from target_epsilon)")
        elif self.budget_rounds is not None:
            raise ValueError("budget_rounds applies with target_epsilon only")
        return self


class SecureAggregation(Strict):
    """`[privacy.secure_aggregation]`: the server learns only the weighted sum of the clients'
    updates (SecAgg+ on fedcare's exchange, `fedcare.privacy.secagg`)."""

    # t as a fraction of a round's clients (at least 2): a round finishes while t clients are
    # left; above one half, so two disjoint groups can never both rebuild a client's secrets
    threshold: float = Field(2 / 3, gt=0.5, le=1)


MEMBERSHIP_KEYS = frozenset({"max_per_set", "server_epochs"})


class PrivacyAudit(Strict):
    """`[privacy.audit]`: audits of what a run leaks (docs/privacy.md).

    - The membership audit (the loss attack, `fedcare.privacy.audit`), in the studies that offer
      it (`Experiment.offers_membership_audit`): after each federation's training, every client's
      training examples against examples it never trained on, from its own model and a peer's
      (the pain study also the server's); in this process only. It runs when the section sets a
      membership key or no one-run key, or as `membership` says.
    - The one-run audits, in any study, in both runtimes: `canaries` gradient canaries per client
      (example level, `fedcare.privacy.canaries`) and `canary_clients` canary clients at the
      server (client level, needs `[privacy.client_dp]`, `fedcare.privacy.canary_clients`): an
      empirical lower bound epsilon-hat at `confidence` beside the accountant's epsilon, each round."""

    # whether the membership audit (the loss attack) runs; unset: when the section sets a membership
    # key, or no one-run key (written out with the resolved config, so a resumed run decides alike)
    membership: bool = True
    max_per_set: int = Field(200, ge=10)  # membership: members (and as many non-members) per client, at most
    server_epochs: int = Field(3, ge=1)  # membership: epochs the server fits a split model's private part
    canaries: int = Field(0, ge=0)  # gradient canaries per client, each in its data with probability 1/2; 0: none
    canary_clients: int = Field(0, ge=0)  # canary clients at the server (client-level DP), each in with probability 1/2
    confidence: float = Field(0.95, gt=0, lt=1)  # epsilon-hat is a lower bound at this confidence

    @model_validator(mode="before")
    @classmethod
    def _membership_by_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "membership" not in data:
            one_run = data.get("canaries") or data.get("canary_clients")
            data = {**data, "membership": bool(MEMBERSHIP_KEYS & set(data)) or not one_run}
        return data


MembershipAudit = PrivacyAudit  # its name before the one-run audits


class Privacy(Strict):
    """`[privacy]`: the protections a run applies, each off unless its table is given, and the
    audits (`[privacy.audit]`)."""

    dp_sgd: DPSGD | None = None
    client_dp: ClientDP | None = None
    secure_aggregation: SecureAggregation | None = None
    audit: PrivacyAudit | None = None

    @property
    def delta(self) -> float:
        """The delta the run's epsilon is reported at: DP-SGD's, else client-level DP's, else 1e-5."""
        table = self.dp_sgd or self.client_dp
        return table.delta if table is not None else 1e-5

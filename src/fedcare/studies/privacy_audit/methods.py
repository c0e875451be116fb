"""The privacy audit's model and its methods, each plain or under DP-SGD at one noise level.

An audited case is a method at a level; its algorithm is built by name (`algorithm_name`) so
that federations come from the runtime as in every study."""

from __future__ import annotations

from torch import nn

from fedcare.algorithms import Algorithm, fedavg, fedbn, local, pfdl
from fedcare.algorithms.training import TrainSettings
from fedcare.config import DPSGD, ClientDP, Privacy, PrivacyAudit
from fedcare.privacy import private_algorithm
from fedcare.studies.privacy_audit.config import PrivacyAuditExperiment
from fedcare.tasks import BINARY

PLAIN = "none"  # the privacy level of a run without DP-SGD
_UNDER = " under DP-SGD sigma="
_CLIENT_DP = " under client-level DP sigma="
_CANARIES = " audited"  # the one-run audit's run: with canaries (DP-SGD) or canary clients (client-level DP)
BUDGET_LEVEL = "epsilon<="  # a level given as a budget: "epsilon<=20" (`protocol.target_epsilon`)

# A level: None (no DP-SGD), a noise multiplier (float), or a budget ("epsilon<=T": the noise
# calibrated so that the planned fit epochs spend T)
Level = float | str | None


class SmallCNN(nn.Module):
    """The pain CNN's shape in small: a conv block with BatchNorm (`features`), a dense head."""

    def __init__(self, size: int):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(8 * (size // 2) ** 2, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.classifier(self.features(x)).squeeze(1)


def level_label(level: Level) -> str:
    """The privacy column of the table: "none", "DP sigma=0.6" or "DP epsilon<=20"."""
    if level is None:
        return PLAIN
    return f"DP {level}" if isinstance(level, str) else f"DP sigma={level:g}"


def budget_of(level: Level) -> float | None:
    """The target epsilon of a budget level (None for the others)."""
    return float(level[len(BUDGET_LEVEL):]) if isinstance(level, str) else None


def cases(config: PrivacyAuditExperiment) -> list[tuple[Level, str]]:
    """(level, method) of every audited case, levels first: plain, each noise multiplier, the
    budget. FedBN runs plain only: under DP-SGD its BatchNorm becomes a private GroupNorm, another
    model than the plain FedBN's."""
    p = config.protocol
    budget = [f"{BUDGET_LEVEL}{p.target_epsilon:g}"] if p.target_epsilon is not None else []
    levels = [None, *p.noise_multipliers, *budget]
    return [(s, m) for s in levels for m in config.methods if not (m == "FedBN" and s is not None)]


def dp_sgd(level: Level, config: PrivacyAuditExperiment) -> Privacy | None:
    p = config.protocol
    if level is None:
        return None
    if isinstance(level, str):  # planned: the fit epochs of every round; PFDL's fine-tuning comes on top
        return Privacy(dp_sgd=DPSGD(target_epsilon=budget_of(level), max_grad_norm=p.max_grad_norm, delta=p.delta,
                                    budget_epochs=config.train.rounds * config.train.local_epochs))
    return Privacy(dp_sgd=DPSGD(noise_multiplier=level, max_grad_norm=p.max_grad_norm, delta=p.delta))


def algorithm_name(method: str, level: Level) -> str:
    return method if level is None else f"{method}{_UNDER}{level!r}"


# -- the one-run audits ([privacy.audit]): one run per (protection, level, method) --------------
def one_run_cases(config: PrivacyAuditExperiment) -> list[tuple[str, float | None, str]]:
    """(protection, noise multiplier or None, method) of every one-run audit: with canaries,
    each DP-SGD case without a budget (none and each noise multiplier); with canary clients,
    FedAvg under client-level DP without noise and at each of its noise multipliers."""
    p = config.protocol
    cases = [("dp_sgd", s, m) for s in [None, *p.noise_multipliers] for m in config.methods
             if p.canaries and not (m == "FedBN" and s is not None)]
    if p.canary_clients and "FedAvg" in config.methods:
        cases += [("client_dp", s, "FedAvg") for s in [0.0, *p.client_dp_noise_multipliers]]
    return cases


def one_run_label(protection: str, sigma: float | None) -> str:
    """The privacy column of the audit's table: "none", "DP sigma=0.6", "client DP sigma=1"."""
    if protection == "dp_sgd":
        return level_label(sigma)
    return "client DP, no noise" if sigma == 0 else f"client DP sigma={sigma:g}"


def one_run_name(protection: str, sigma: float | None, method: str) -> str:
    if protection == "dp_sgd":
        return algorithm_name(method, sigma) + _CANARIES
    return f"{method}{_CLIENT_DP}{sigma!r}{_CANARIES}"


def one_run_privacy(protection: str, sigma: float | None, config: PrivacyAuditExperiment) -> Privacy:
    """The case's protection with its one-run audit: canaries under DP-SGD's level (or plain),
    canary clients under client-level DP."""
    p = config.protocol
    if protection == "dp_sgd":
        privacy = dp_sgd(sigma, config) or Privacy()
        return privacy.model_copy(update={"audit": PrivacyAudit(canaries=p.canaries, confidence=p.audit_confidence)})
    return Privacy(client_dp=ClientDP(noise_multiplier=sigma, clipping_norm=p.client_dp_clipping_norm, delta=p.delta),
                   audit=PrivacyAudit(canary_clients=p.canary_clients, confidence=p.audit_confidence))


def make_algorithm(name: str, config: PrivacyAuditExperiment) -> Algorithm:
    """The algorithm a name above names: the method, under DP-SGD or client-level DP at its
    level if any, with its one-run audit when it ends in " audited"."""
    audited = name.endswith(_CANARIES)
    name = name.removesuffix(_CANARIES)
    if _CLIENT_DP in name:
        method, _, sigma = name.partition(_CLIENT_DP)
        privacy = one_run_privacy("client_dp", float(sigma), config)
    else:
        method, _, level = name.partition(_UNDER)
        privacy = one_run_privacy("dp_sgd", _level(level), config) if audited else dp_sgd(_level(level), config)
    t = config.train
    settings = TrainSettings(lr=t.lr, batch_size=t.batch_size, local_epochs=t.local_epochs, task=BINARY)
    if method == "FedAvg":
        algorithm = fedavg(settings, t.aggregation)
    elif method == "PFDL":
        algorithm = pfdl(settings, t.aggregation, finetune_epochs=t.pfdl_finetune_epochs)
    elif method == "FedBN":
        algorithm = fedbn(settings, t.aggregation)
    elif method == "local":
        algorithm = local(settings)
    else:
        raise ValueError(f"unknown privacy audit method {method!r}")
    return private_algorithm(algorithm, privacy)


def _level(text: str) -> Level:
    """The level `algorithm_name` wrote: '' (none), a float's repr, or a budget's quoted repr."""
    if not text:
        return None
    return text.strip("'") if text.startswith("'") else float(text)

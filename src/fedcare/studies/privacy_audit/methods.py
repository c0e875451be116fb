"""The privacy audit's model and its methods, each plain or under DP-SGD at one noise level.

An audited case is a method at a level; its algorithm is built by name (`algorithm_name`) so
that federations come from the runtime as in every study."""

from __future__ import annotations

from torch import nn

from fedcare.algorithms import Algorithm, fedavg, fedbn, local, pfdl
from fedcare.algorithms.training import TrainSettings
from fedcare.config import DPSGD, Privacy
from fedcare.privacy import private_algorithm
from fedcare.studies.privacy_audit.config import PrivacyAuditExperiment
from fedcare.tasks import BINARY

PLAIN = "none"  # the privacy level of a run without DP-SGD
_UNDER = " under DP-SGD sigma="


class SmallCNN(nn.Module):
    """The pain CNN's shape in small: a conv block with BatchNorm (`features`), a dense head."""

    def __init__(self, size: int):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(8 * (size // 2) ** 2, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.classifier(self.features(x)).squeeze(1)


def level_label(sigma: float | None) -> str:
    """The privacy column of the table: "none" or "DP sigma=0.6"."""
    return PLAIN if sigma is None else f"DP sigma={sigma:g}"


def cases(config: PrivacyAuditExperiment) -> list[tuple[float | None, str]]:
    """(noise multiplier or None, method) of every audited case, levels first. FedBN runs plain
    only: DP-SGD's GroupNorm replaces its BatchNorm, leaving FedAvg."""
    levels = [None, *config.protocol.noise_multipliers]
    return [(s, m) for s in levels for m in config.methods if not (m == "FedBN" and s is not None)]


def dp_sgd(sigma: float | None, config: PrivacyAuditExperiment) -> Privacy | None:
    p = config.protocol
    return None if sigma is None else Privacy(dp_sgd=DPSGD(noise_multiplier=sigma, max_grad_norm=p.max_grad_norm,
                                                           delta=p.delta))


def algorithm_name(method: str, sigma: float | None) -> str:
    return method if sigma is None else f"{method}{_UNDER}{sigma!r}"


def make_algorithm(name: str, config: PrivacyAuditExperiment) -> Algorithm:
    """The algorithm `algorithm_name` named: the method, under DP-SGD at its level if any."""
    method, _, sigma = name.partition(_UNDER)
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
    return private_algorithm(algorithm, dp_sgd(float(sigma) if sigma else None, config))

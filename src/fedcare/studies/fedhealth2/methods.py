"""The FedHealth 2 study's methods (the paper's names) and the algorithms behind them."""

from __future__ import annotations

from fedcare.algorithms import Algorithm, centralized, fedavg, local
from fedcare.algorithms.fedap import fedap
from fedcare.algorithms.fedbn import fedbn
from fedcare.algorithms.fedper import fedper
from fedcare.algorithms.fedprox import fedprox
from fedcare.algorithms.training import TrainSettings
from fedcare.studies.fedhealth2.config import FedHealth2Experiment
from fedcare.tasks import MULTICLASS

PRETRAIN = "pretrain"  # FedAP's pooled pretraining: centralized, one epoch per round


def make_algorithm(method: str, config: FedHealth2Experiment) -> Algorithm:
    t, o = config.train, config.options
    settings = TrainSettings(lr=t.lr, batch_size=t.batch_size, local_epochs=t.local_epochs, task=MULTICLASS)
    if method == PRETRAIN:
        return centralized(settings)
    if method == "local":
        return local(settings)
    if method == "fedavg":
        return fedavg(settings, t.aggregation)
    if method == "fedprox":
        return fedprox(settings, mu=o.fedprox_mu, squared=o.fedprox_squared, weighting=t.aggregation)
    if method == "fedbn":
        return fedbn(settings, weighting=t.aggregation)
    if method == "fedper":
        return fedper(settings, head_paths=tuple(o.fedper_private), weighting=t.aggregation)
    if method in ("fedap", "f-fedap"):
        return fedap(settings, lam=o.fedap_lambda, statistics="bn", weighting=t.aggregation)
    if method == "d-fedap":
        return fedap(settings, lam=o.fedap_lambda, statistics="classifier", weighting=t.aggregation)
    raise ValueError(f"unknown method {method!r}")

"""The FedHealth 2 study's methods (the paper's names) and the algorithms behind them."""

from __future__ import annotations

from fedcare.algorithms import Algorithm
from fedcare.algorithms.catalogue import build
from fedcare.algorithms.training import TrainSettings
from fedcare.studies.fedhealth2.config import FedHealth2Experiment
from fedcare.tasks import MULTICLASS

PRETRAIN = "pretrain"  # FedAP's pooled pretraining: centralized, one epoch per round
# the study's names that are not the library's: (algorithm, options of this method)
ALGORITHM_OF = {PRETRAIN: ("centralized", {}), "f-fedap": ("fedap", {}),
                "d-fedap": ("fedap", {"statistics": "classifier"})}


def make_algorithm(method: str, config: FedHealth2Experiment) -> Algorithm:
    t, o = config.train, config.options
    settings = TrainSettings(lr=t.lr, batch_size=t.batch_size, local_epochs=t.local_epochs, task=MULTICLASS)
    name, own = ALGORITHM_OF.get(method, (method, {}))
    options = dict(weighting=t.aggregation, mu=t.mu, squared=o.fedprox_squared, head_paths=tuple(o.fedper_private),
                   lam=o.fedap_lambda, statistics="bn")
    return build(name, settings, **{**options, **own})

"""The one algorithm catalogue (fedcare.algorithms.catalogue): studies build the library's
algorithms by name, each factory taking the options it has."""

import pytest

from fedcare.algorithms.catalogue import ALGORITHMS, build
from fedcare.algorithms.fedap import FedAPServer
from fedcare.algorithms.fedprox import FedProxClient
from fedcare.algorithms.training import TrainSettings
from fedcare.tasks import MULTICLASS

SETTINGS = TrainSettings(lr=0.1, batch_size=4, local_epochs=1, task=MULTICLASS)
STUDY_OPTIONS = dict(weighting="uniform", mu=0.25, squared=False, head_paths=("classifier",), lam=0.3,
                     statistics="classifier", shared_paths=("features",), finetune_epochs=2, lr_factor=4.0)


def test_each_factory_takes_the_options_it_has_and_ignores_the_others():
    prox = build("fedprox", SETTINGS, **STUDY_OPTIONS)
    assert isinstance(prox.client, FedProxClient) and (prox.client.mu, prox.client.squared) == (0.25, False)
    assert prox.server.weighting == "uniform" and prox.name == "fedprox"
    fedap = build("fedap", SETTINGS, **STUDY_OPTIONS)
    assert isinstance(fedap.server, FedAPServer) and fedap.client.statistics == "classifier"
    pfdl = build("pfdl", SETTINGS, **STUDY_OPTIONS).client
    assert (pfdl.finetune_epochs, pfdl.lr_factor) == (2, 4.0)
    assert build("centralized", SETTINGS, **STUDY_OPTIONS).pooled


def test_a_misspelt_option_or_an_unknown_algorithm_is_an_error():
    with pytest.raises(TypeError, match="no algorithm takes the option.*fedprox_mu"):
        build("fedprox", SETTINGS, fedprox_mu=0.1)
    with pytest.raises(ValueError, match="unknown algorithm 'fedproxx': the library has centralized, local, fedavg"):
        build("fedproxx", SETTINGS)


def test_the_studies_methods_are_the_catalogues_algorithms():
    from fedcare.studies.fedhealth2.methods import ALGORITHM_OF
    from fedcare.studies.pain.methods import FAMILY_ALGORITHM
    from fedcare.studies.surgical.config import FL_METHODS

    assert set(FAMILY_ALGORITHM.values()) <= set(ALGORITHMS)
    assert {name for name, _ in ALGORITHM_OF.values()} <= set(ALGORITHMS)
    assert set(FL_METHODS) <= set(ALGORITHMS)

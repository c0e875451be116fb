"""An algorithm from another installed package (an entry point in `fedcare.algorithms`) is built
by name as the library's own are; a name declared twice is an error naming both."""

import sys

import pytest
from support.distributions import fake_distribution, write_package

from fedcare.algorithms import catalogue
from fedcare.algorithms.training import TrainSettings
from fedcare.plugins import ALGORITHMS

# FedAvg with a server that halves every update: an algorithm the library does not have
HALVING = '''
from fedcare.algorithms import fedavg


def fedhalf(settings, weighting="examples", shrink=0.5):
    algorithm = fedavg(settings, weighting=weighting)
    algorithm.name = "fedhalf"
    algorithm.shrink = shrink
    return algorithm
'''


@pytest.fixture
def outside(tmp_path, monkeypatch):
    write_package(tmp_path, "fedcare_half", {"__init__": "", "algo": HALVING})
    fake_distribution(tmp_path, "fedcare-half", "0.3", {ALGORITHMS: {"fedhalf": "fedcare_half.algo:fedhalf"}})
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_an_outside_algorithm_is_built_by_name_with_its_own_options(outside):
    settings = TrainSettings(lr=0.1)
    algorithm = catalogue.build("fedhalf", settings, weighting="uniform", mu=0.1, shrink=0.25)
    assert algorithm.name == "fedhalf" and algorithm.shrink == 0.25 and algorithm.server.weighting == "uniform"
    assert catalogue.names()[-1] == "fedhalf" and catalogue.names()[:-1] == list(catalogue.ALGORITHMS)
    with pytest.raises(TypeError, match="no algorithm takes the option.s. shrinkk"):
        catalogue.build("fedavg", settings, shrinkk=1)  # a misspelt option is still an error
    with pytest.raises(ValueError, match=r"unknown algorithm 'fedhalve': the library has .*qfedavg, fedhalf$"):
        catalogue.build("fedhalve", settings)


def test_a_name_the_library_has_or_two_packages_declare_is_refused_naming_both(outside, tmp_path):
    fake_distribution(tmp_path / "b", "fedcare-shadow", "1.0", {ALGORITHMS: {"fedavg": "fedcare_half.algo:fedhalf"}})
    sys.path.insert(0, str(tmp_path / "b"))
    try:
        with pytest.raises(ValueError, match=r"algorithm 'fedavg' is fedcare's own and also fedcare_half.algo:fedhalf "
                                             r"\(entry point of fedcare-shadow 1.0\)"):
            catalogue.build("fedhalf", TrainSettings())
    finally:
        sys.path.remove(str(tmp_path / "b"))
    fake_distribution(tmp_path / "c", "fedcare-twin", "2.0", {ALGORITHMS: {"fedhalf": "fedcare_twin:fedhalf"}})
    sys.path.insert(0, str(tmp_path / "c"))
    try:
        with pytest.raises(ValueError, match=r"'fedhalf' is declared twice: fedcare_half.algo:fedhalf \(entry point "
                                             r"of fedcare-half 0.3\) and fedcare_twin:fedhalf \(entry point of "
                                             r"fedcare-twin 2.0\)"):
            catalogue.build("fedhalf", TrainSettings())
    finally:
        sys.path.remove(str(tmp_path / "c"))


def test_an_entry_point_that_names_no_factory_is_refused(tmp_path, monkeypatch):
    write_package(tmp_path, "fedcare_nofactory", {"__init__": "fedbad = 3\n"})
    fake_distribution(tmp_path / "a", "fedcare-nofactory", "0.1", {ALGORITHMS: {"fedbad": "fedcare_nofactory:fedbad"}})
    fake_distribution(tmp_path / "b", "fedcare-module", "0.1", {ALGORITHMS: {"fedmod": "fedcare_nofactory"}})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    with pytest.raises(ValueError, match=r"algorithm 'fedbad': fedcare_nofactory:fedbad is not a factory"):
        catalogue.build("fedbad", TrainSettings())
    assert catalogue.build("fedavg", TrainSettings()).name == "fedavg"  # the library's own still build
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    with pytest.raises(ValueError, match="'fedcare_nofactory' names no factory"):
        catalogue.names()

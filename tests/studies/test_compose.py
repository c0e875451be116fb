"""The protection stack is built once, in one place (fedcare.studies.compose): a study's own
`algorithm()` and `new_model()` stay plain, and a study built on another is composed once:
its robust rule accepts it (it once refused its own RobustServer) and its attacker poisons
once (it once poisoned twice)."""

from __future__ import annotations

import torch

from fedcare.runtime.refs import Split
from fedcare.algorithms.attack import AttackingClient
from fedcare.algorithms.base import ServerHalf
from fedcare.algorithms.robust import RobustServer
from fedcare.algorithms.training import Randomness
from fedcare.privacy.dp_sgd import DPSGDClient
from fedcare.privacy.secagg import SecureAggClient
from support.toy_study import ToyStudy
from support.toy_study.config import ToyExperiment
from support.toy_study.data import ToySite, generate

SCALE = 3.0


class BuiltOnToy(ToyStudy):
    """A study built on another: its model and algorithms are the parent's, called through super()."""

    def new_model(self):
        return super().new_model()

    def algorithm(self, name: str):
        return super().algorithm(name)


def experiment(**tables) -> ToyExperiment:
    return ToyExperiment.model_validate({"study": "toy", "title": "t", "seeds": [3], "methods": ["fedavg"], **tables})


ATTACKED = experiment(robustness={"rule": "median", "attack": {"clients": [0], "kind": "sign_flip", "scale": SCALE}})


def test_a_study_built_on_another_is_composed_once():
    algorithm = BuiltOnToy(ATTACKED).composed.algorithm("fedavg")  # the robust rule accepts it
    assert type(algorithm.server) is RobustServer and type(algorithm.server.inner) is ServerHalf
    assert type(algorithm.client) is AttackingClient and not isinstance(algorithm.client.inner, AttackingClient)
    private = BuiltOnToy(experiment(privacy={"dp_sgd": {}, "secure_aggregation": {}})).composed.algorithm("fedavg")
    assert type(private.client) is SecureAggClient and type(private.client.inner) is DPSGDClient
    assert not isinstance(private.client.inner.inner, DPSGDClient)


def test_the_study_s_own_methods_stay_plain():
    study = BuiltOnToy(ATTACKED)
    assert type(study.algorithm("fedavg").server) is ServerHalf
    assert type(study.algorithm("fedavg").client).__name__ == "ClientHalf"


def test_an_attacker_of_a_study_built_on_another_poisons_once(tmp_path):
    """Client 0's reply is received - scale x (its honest update): once, not scale squared."""
    data = ToySite(0, generate(tmp_path, 3, 4, 12)).data(Split("train"))
    study = BuiltOnToy(ATTACKED)

    def reply(algorithm) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        torch.manual_seed(0)  # the same initial model for both
        model = study.composed.new_model()
        received = algorithm.server.initial_message(model)
        sent, _ = algorithm.client.fit(model, received, algorithm.client.init_state(model), data,
                                       Randomness(3, "train", 0, 1))
        return received.tensors, sent.tensors

    received, honest = reply(study.algorithm("fedavg"))
    _, poisoned = reply(study.composed.algorithm("fedavg"))
    for name, before in received.items():
        update = honest[name].double() - before.double()
        assert update.abs().sum() > 0
        torch.testing.assert_close(poisoned[name].double(), before.double() - SCALE * update, atol=1e-6, rtol=0)

"""FedBN (and FedAP, whose private part is FedBN's) under DP-SGD: DP-SGD replaces every
BatchNorm by GroupNorm, and the replacement stays private as the BatchNorm it stands in for
(fedcare.algorithms.split.STANDS_IN_FOR). FedBN under DP-SGD once shared it, and its records
were FedAvg's."""

from __future__ import annotations

import json

import torch

from fedcare.algorithms import fedavg, fedbn
from fedcare.algorithms.fedap import input_statistics
from fedcare.algorithms.training import Randomness, TrainSettings
from fedcare.config import DPSGD, Privacy
from fedcare.privacy import private_algorithm, private_model
from fedcare.studies.run import run_study
from support.tiny import tiny_data, tiny_model

DP = Privacy(dp_sgd=DPSGD(noise_multiplier=0.5, max_grad_norm=1.0))
SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)
REPLACED = {"features.1.weight", "features.1.bias", "classifier.2.weight", "classifier.2.bias"}  # TinyNet's BatchNorms


def test_fedbn_under_dp_sgd_sends_all_but_the_groupnorm_that_replaced_batchnorm():
    model = private_model(tiny_model(), DP)
    assert {type(model.features[1]).__name__, type(model.classifier[2]).__name__} == {"GroupNorm"}
    algorithm = private_algorithm(fedbn(SETTINGS), DP)
    message = algorithm.server.initial_message(model)
    reply, state = algorithm.client.fit(model, message, algorithm.client.init_state(model), tiny_data(1),
                                        Randomness(0, "train", 1, 1))
    assert set(message.tensors) == set(reply.tensors) == set(model.state_dict()) - REPLACED
    assert REPLACED <= set(state)  # what does not leave the client: the GroupNorm layers, kept in its state
    fedavg_reply, _ = private_algorithm(fedavg(SETTINGS), DP).client.fit(
        model, message, {}, tiny_data(1), Randomness(0, "train", 1, 1))
    assert REPLACED <= set(fedavg_reply.tensors)  # FedAvg shares them, as it shares BatchNorm


def test_fedap_under_dp_sgd_observes_the_groupnorm_that_replaced_batchnorm():
    statistics = input_statistics(private_model(tiny_model(), DP), tiny_data(1))
    assert set(statistics) == {"features.1.mean", "features.1.var", "classifier.2.mean", "classifier.2.var"}


def test_fedbn_under_dp_sgd_is_not_fedavg(tmp_path):
    from fedcare.studies.fedhealth2.config import FedHealth2Experiment

    config = FedHealth2Experiment.model_validate({
        "study": "fedhealth2", "seeds": [1], "methods": ["fedavg", "fedbn"],
        "data": {"dataset": "pamap2", "synthetic": {"subjects": 3, "seconds_per_activity": 6.0}},
        "protocol": {"clients": 4, "dirichlet_alpha": 1.0}, "train": {"rounds": 2, "pretrain_rounds": 1},
        "runtime": {"threads": 1}, "privacy": {"dp_sgd": {"noise_multiplier": 0.5, "max_grad_norm": 1.0}},
    })
    run = run_study(config, tmp_path / "run")
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    by_method = {m: [(r["round"], r["client"], r["accuracy"], r["loss"]) for r in evals
                     if r["type"] == "client_eval" and r["method"] == m] for m in ("fedavg", "fedbn")}
    assert len(by_method["fedavg"]) == len(by_method["fedbn"]) > 0
    assert by_method["fedavg"] != by_method["fedbn"]
    assert all(torch.isfinite(torch.tensor(loss)) for *_, loss in by_method["fedbn"])

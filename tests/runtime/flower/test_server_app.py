"""fedcare's Flower apps from Python factories (`make_server_app`, `make_client_app`) give the in-
process simulator's numbers bit for bit: FedAvg, PFDL, and FedAP and FedDG with their setup
exchanges, through Flower's `run_simulation` with the in-process backend
(support/flower_inprocess.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from fedcare.algorithms import fedap, feddg, fedavg, pfdl
from fedcare.algorithms.training import TrainSettings
from fedcare.runtime.flower import make_client_app, make_server_app
from fedcare.runtime.federation import Federation

from support.flower_inprocess import InProcessBackend, simulation_backend
from support.tiny import tiny_data, tiny_model


SEED = 11


PHASE = "train"  # the ServerApp's default phase: both runtimes derive generators from it


ROUNDS = 2


SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)


CLIENTS = [1, 2, 3]  # partition-id i <-> client CLIENTS[i]


def _data(cid: int):
    return {1: tiny_data(1), 2: tiny_data(2), 3: tiny_data(3, n=24)}[cid]


ALGORITHMS: dict[str, Callable] = {
    "fedavg": lambda: fedavg(SETTINGS),
    "pfdl": lambda: pfdl(SETTINGS, finetune_epochs=2),
    "fedap": lambda: fedap(SETTINGS),  # a setup exchange, then a personal aggregate for each client
    "feddg": lambda: feddg(SETTINGS, bank_per_client=4),  # a setup exchange answered with an amplitude bank
}


WITH_SETUP = {"fedap", "feddg"}


def _simulator(name: str):
    federation = Federation(tiny_model(), ALGORITHMS[name](), SEED)
    train = {c: _data(c) for c in CLIENTS}
    if name in WITH_SETUP:
        federation.run_setup("setup", train)
    losses = [federation.run_round(PHASE, rnd, train)["train_loss"] for rnd in range(1, ROUNDS + 1)]
    return federation.global_message, federation.evaluate(train, "binary"), losses


def _flower(name: str):
    from flwr.simulation import run_simulation

    history: list[dict] = []
    server_app = make_server_app(ALGORITHMS[name], tiny_model, ROUNDS, SEED, CLIENTS, history.append, phase=PHASE,
                                 metrics="binary")
    client_app = make_client_app(ALGORITHMS[name], tiny_model, _data, SEED, client_ids=CLIENTS)
    InProcessBackend.finished.clear()
    InProcessBackend.workers = len(CLIENTS)
    with simulation_backend() as backend:
        run_simulation(server_app, client_app, num_supernodes=len(CLIENTS), backend_name=backend)
    # 1 greeting, the setup exchange if any, 2 exchanges per round (fit; PFDL's fine-tuning and
    # the setup answers ride along with the next message); replies come out of client order
    # (the greeting's exactly reversed; later ones vary with training time under load)
    exchanges = 1 + (name in WITH_SETUP) + 2 * ROUNDS
    assert sorted(InProcessBackend.finished) == sorted([0, 1, 2] * exchanges)
    assert InProcessBackend.finished[:3] == [2, 1, 0]
    assert [h["round"] for h in history] == list(range(1, ROUNDS + 1)), "the ServerApp did not finish its rounds"
    return history


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["fedavg", "pfdl", "fedap", "feddg"])
def test_flower_matches_the_in_process_simulator_bit_for_bit(name):
    history = _flower(name)
    expected_global, expected_metrics, expected_losses = _simulator(name)

    final = history[-1]
    got = final["global_message"].tensors
    assert list(got) == list(expected_global.tensors)
    for k, v in expected_global.tensors.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    assert [h["train_loss"] for h in history] == expected_losses
    assert final["clients_metrics"] == expected_metrics  # loss, ACC, PR-AUC, ... to the last bit
    if name == "fedap":  # each node received its own aggregate: the personal models differ
        assert len({m["loss"] for m in final["clients_metrics"].values()}) == len(CLIENTS)
    assert [final["clients_metrics"][c]["n"] for c in CLIENTS] == [len(_data(c)) for c in CLIENTS]

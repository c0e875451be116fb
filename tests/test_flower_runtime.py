"""fedcare's Flower apps give the same numbers as the in-process simulator (through Flower's
`run_simulation` with an in-process backend: see flower_inprocess.py)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from flower_inprocess import InProcessBackend, simulation_backend
from flwr.app import RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from tiny import tiny_data, tiny_model

from fedcare.algorithms import fedap, feddg, fedavg, pfdl
from fedcare.algorithms.messages import Message as FedMessage
from fedcare.algorithms.training import TrainSettings
from fedcare.runtime.flower import make_client_app, make_server_app
from fedcare.runtime.flower.client_app import client_id_from
from fedcare.runtime.sites import SiteError
from fedcare.runtime.clients import Evaluate, Fit, Snapshot
from fedcare.runtime.flower.records import Begin, decode_ops, decode_results, encode_ops, encode_results
from fedcare.runtime.refs import DataRefError, Split
from fedcare.studies.pain.cohort import PainSite, SessionFrames, TrainingSet
from fedcare.runtime.federation import Federation

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


# ------------------------------------------------------------------------------- records


def _wire(content: RecordDict) -> RecordDict:
    """Through Flower's own wire format (protobuf) and back."""
    proto = recorddict_to_proto(content)
    return recorddict_from_proto(type(proto).FromString(proto.SerializeToString()))


def test_operations_and_results_round_trip_bit_identically():
    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(3, 4, generator=g),
        "w64": torch.randn(2, 2, generator=g, dtype=torch.float64),
        "bn.num_batches_tracked": torch.tensor(7, dtype=torch.int64),  # a 0-d int64 buffer
        "tiny": torch.tensor([1e-45, -0.0, float("inf"), 3.4e38], dtype=torch.float32),
        "strided": torch.randn(4, 6, generator=g).t(),  # non-contiguous input
    }
    scalars = {"num_examples": 40.0, "train_loss": 0.1 + 0.2, "big": 2.0**60 + 1.0}
    message = FedMessage(tensors, scalars)
    ops = [("f1", Begin("pfdl", 5, message, reset=True)), ("f1", Fit("session-1", 2, message, TrainingSet(5, 0))),
           ("f1", Snapshot()), ("f1", Evaluate(message, SessionFrames(1), "binary"))]
    back = decode_ops(_wire(encode_ops(ops)), PainSite.data_refs)
    assert [(ns, type(op)) for ns, op in back] == [(ns, type(op)) for ns, op in ops]
    fit = back[1][1]
    assert (fit.phase, fit.round, fit.data) == ("session-1", 2, TrainingSet(5, 0)) and back[0][1].reset is True
    assert back[3][1].data == SessionFrames(1)
    with pytest.raises(DataRefError, match="unknown data reference"):  # a site decodes its own kinds only
        decode_ops(_wire(encode_ops(ops)), [Split])
    for carried in (back[0][1].model, back[1][1].message):
        assert list(carried.tensors) == list(tensors) and carried.scalars == scalars
        for k, v in tensors.items():
            b = carried.tensors[k]
            assert b.dtype == v.dtype and b.shape == v.shape, k
            assert np.array_equal(b.numpy().reshape(-1).view(np.uint8), v.contiguous().numpy().reshape(-1).view(np.uint8)), k
    assert len(encode_ops(ops).array_records) == 1, "a message carried by several operations travels once"

    metrics = {"loss": 0.1 + 0.2, "pr_auc": float("nan"), "n": 96}
    results = decode_results(_wire(encode_results([message, None, metrics])))
    assert results[1] is None and results[2]["loss"] == metrics["loss"] and math.isnan(results[2]["pr_auc"])
    assert torch.equal(results[0].tensors["w"], tensors["w"]) and results[0].scalars == scalars


# ---------------------------------------------------------------------------- simulation


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


def test_client_id_comes_from_node_config_never_from_flower_node_ids():
    assert client_id_from({"site": "hospital-a", "partition-id": 0}, CLIENTS) == "hospital-a"
    assert client_id_from({"partition-id": 2, "num-partitions": 3}, CLIENTS) == 3
    assert client_id_from({"partition-id": 2}, None) == 2
    with pytest.raises(SiteError, match="site"):
        client_id_from({}, CLIENTS)
    with pytest.raises(SiteError, match="partition-id 3"):
        client_id_from({"partition-id": 3}, CLIENTS)

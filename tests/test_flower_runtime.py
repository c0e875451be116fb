"""fedcare's Flower apps give the same numbers as the in-process simulator.

The Simulation Engine's only use of Ray is `RayBackend`, the pool that runs a ClientApp on a
(message, context); these tests put an in-process backend in its place (`_InProcessBackend`,
same `Backend` interface), which answers in reverse client order and starts in well under a
second (Ray takes 10 s or more here), and keep everything else of Flower's: `run_simulation`,
the SuperLink's in-memory LinkState, the Grid, message routing, node/partition ids and
per-node `Context.state`. Ray itself runs in the `flwr run` tests (test_flower_deploy.py).
"""

from __future__ import annotations

import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ClassVar

import numpy as np
import pytest
import torch
from flwr.app import Context, Message, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.server.superlink.fleet.vce.backend import Backend, BackendConfig
from tiny import tiny_data, tiny_model

from fedcare.algorithms import fedavg, pfdl
from fedcare.algorithms.messages import Message as FedMessage
from fedcare.algorithms.training import TrainSettings
from fedcare.runtime.flower import make_client_app, make_server_app
from fedcare.runtime.flower.apps import client_id_from
from fedcare.runtime.flower.site import SiteError
from fedcare.runtime.flower.records import (
    load_state,
    message_to_recorddict,
    recorddict_to_message,
    save_state,
)
from fedcare.runtime.simulation import Federation

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
}


# ------------------------------------------------------------------------------- records


def test_records_round_trip_is_bit_identical():
    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(3, 4, generator=g),
        "w64": torch.randn(2, 2, generator=g, dtype=torch.float64),
        "bn.num_batches_tracked": torch.tensor(7, dtype=torch.int64),  # a 0-d int64 buffer
        "idx": torch.arange(-5, 5, dtype=torch.int64).reshape(2, 5),
        "tiny": torch.tensor([1e-45, -0.0, float("inf"), 3.4e38], dtype=torch.float32),
        "strided": torch.randn(4, 6, generator=g).t(),  # non-contiguous input
    }
    scalars = {"num_examples": 40.0, "train_loss": 0.1 + 0.2, "big": 2.0**60 + 1.0}
    content = message_to_recorddict(FedMessage(tensors, scalars))
    wire = recorddict_to_proto(content).SerializeToString()  # through Flower's own wire format too
    content = recorddict_from_proto(type(recorddict_to_proto(content)).FromString(wire))
    back = recorddict_to_message(content)
    assert list(back.tensors) == list(tensors)
    for k, v in tensors.items():
        b = back.tensors[k]
        assert b.dtype == v.dtype and b.shape == v.shape, k
        assert np.array_equal(b.numpy().reshape(-1).view(np.uint8), v.contiguous().numpy().reshape(-1).view(np.uint8)), k
    assert back.scalars == scalars and all(type(x) is float for x in back.scalars.values())

    nan = torch.tensor([float("nan")], dtype=torch.float32)
    state_store = RecordDict()
    assert load_state(state_store) is None
    save_state(state_store, {"classifier.1.weight": tensors["w"], "nan": nan, "n": tensors["bn.num_batches_tracked"]})
    state = load_state(state_store)
    assert torch.equal(state["classifier.1.weight"], tensors["w"]) and state["n"].shape == () and state["n"].dtype == torch.int64
    assert state["nan"].numpy().view(np.uint32)[0] == nan.numpy().view(np.uint32)[0]


# ---------------------------------------------------------------------------- simulation


class _InProcessBackend(Backend):
    """Runs each ClientApp call in one of the engine's worker threads: what a Ray actor does,
    minus Ray. One worker per node, and a node with a lower partition id answers later, so
    replies reach the ServerApp in reverse client order: aggregation must not depend on it."""

    finished: ClassVar[list[int]] = []  # partition ids in the order their replies were produced
    lock = threading.Lock()

    def __init__(self, backend_config: BackendConfig) -> None:
        self.app_fn = None

    def build(self, app_fn) -> None:
        self.app_fn = app_fn

    @property
    def num_workers(self) -> int:
        return len(CLIENTS)

    def is_worker_idle(self) -> bool:
        return True

    def terminate(self) -> None:
        pass

    def process_message(self, message: Message, context: Context) -> tuple[Message, Context]:
        with self.lock:  # `tiny_model` seeds torch's global generator: not thread-safe
            reply = self.app_fn()(message=message, context=context)
        pid = int(context.node_config["partition-id"])
        time.sleep(0.1 * (len(CLIENTS) - 1 - pid))
        self.finished.append(pid)
        return reply, context


@contextmanager
def _simulation_backend() -> Iterator[str]:
    name = "flwr.server.superlink.fleet.vce.backend.raybackend"
    module = types.ModuleType(name)
    module.RayBackend = _InProcessBackend
    saved = sys.modules.get(name)
    sys.modules[name] = module
    try:
        yield "in-process"  # any name but "ray" skips run_simulation's Ray check
    finally:
        if saved is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = saved


def _simulator(name: str):
    federation = Federation(tiny_model(), ALGORITHMS[name](), SEED)
    train = {c: _data(c) for c in CLIENTS}
    losses = [federation.run_round(PHASE, rnd, train)["train_loss"] for rnd in range(1, ROUNDS + 1)]
    return federation.global_message, federation.evaluate(train, "binary"), losses


def _flower(name: str):
    from flwr.simulation import run_simulation

    history: list[dict] = []
    server_app = make_server_app(ALGORITHMS[name], tiny_model, ROUNDS, SEED, CLIENTS, history.append, phase=PHASE,
                                 metrics="binary")
    client_app = make_client_app(ALGORITHMS[name], tiny_model, _data, SEED, client_ids=CLIENTS)
    _InProcessBackend.finished.clear()
    with _simulation_backend() as backend:
        run_simulation(server_app, client_app, num_supernodes=len(CLIENTS), backend_name=backend)
    # 1 greeting + 2 exchanges per round (fit; PFDL's fine-tuning rides along with the
    # evaluation), each answered in reverse client order
    assert _InProcessBackend.finished == [2, 1, 0] * (1 + 2 * ROUNDS)
    assert [h["round"] for h in history] == list(range(1, ROUNDS + 1)), "the ServerApp did not finish its rounds"
    return history


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["fedavg", "pfdl"])
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
    assert [final["clients_metrics"][c]["n"] for c in CLIENTS] == [len(_data(c)) for c in CLIENTS]


def test_client_id_comes_from_node_config_never_from_flower_node_ids():
    assert client_id_from({"site": "hospital-a", "partition-id": 0}, CLIENTS) == "hospital-a"
    assert client_id_from({"partition-id": 2, "num-partitions": 3}, CLIENTS) == 3
    assert client_id_from({"partition-id": 2}, None) == 2
    with pytest.raises(SiteError, match="site"):
        client_id_from({}, CLIENTS)
    with pytest.raises(SiteError, match="partition-id 3"):
        client_id_from({"partition-id": 3}, CLIENTS)

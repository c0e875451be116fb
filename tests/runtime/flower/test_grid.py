"""The ServerApp survives the SuperLink's transient faults (`fedcare.runtime.flower.grid`): an HTTP
500 (what a SuperLink answers while its SQLite database is locked) and SQLite's own "database is
locked" are retried with backoff, within the round timeout, instead of ending the run; other
errors are not retried; a fault that outlasts the round timeout stops the run, saying so."""

import sqlite3
import time
from types import SimpleNamespace

import httpx
import pytest
import torch
from flwr.supercore.inflatable.inflatable_utils import ObjectPushError
from sqlalchemy.exc import OperationalError as SqlAlchemyOperationalError

from fedcare.algorithms import fedavg
from fedcare.algorithms.training import TrainSettings
from fedcare.runtime.federation import Federation
from fedcare.runtime.flower import make_client_app, make_server_app
from fedcare.runtime.flower.grid import CoordinatorUnavailable, PatientGrid, transient

from support.flower_inprocess import InProcessBackend, simulation_backend
from support.tiny import tiny_data, tiny_model


def http_error(status: int, path: str = "/v1/runtime/pull-messages") -> httpx.HTTPStatusError:
    request = httpx.Request("POST", f"http://127.0.0.1:9091{path}")
    response = httpx.Response(status, request=request, text="Internal Server Error")
    return httpx.HTTPStatusError(f"Server error '{status}'", request=request, response=response)


LOCKED = sqlite3.OperationalError("database is locked")


class FaultyGrid:
    """A Grid whose calls first raise `faults` (one per call, in order), then answer."""

    def __init__(self, faults):
        self.faults = list(faults)
        self.calls: list[str] = []

    def _answer(self, name, value):
        self.calls.append(name)
        if self.faults:
            raise self.faults.pop(0)
        return value

    def get_node_ids(self):
        return self._answer("get_node_ids", [1, 2])

    def push_messages(self, messages):
        return self._answer("push_messages", [f"m{i}" for i, _ in enumerate(messages)])

    def pull_messages(self, ids):
        return self._answer("pull_messages", [f"reply to {i}" for i in ids])


# a push whose objects the SuperLink could not store (its database locked mid-push: the chaos test)
UNSTORED = ObjectPushError("4d32", 1, "s1")


@pytest.mark.parametrize("fault", [http_error(500), LOCKED, SqlAlchemyOperationalError("UPDATE ...", {}, LOCKED),
                                   UNSTORED], ids=["http-500", "sqlite-locked", "sqlalchemy-locked", "push-unstored"])
def test_a_transient_fault_is_retried_logged_and_recorded(fault, caplog):
    inner = FaultyGrid([fault, fault])
    grid = PatientGrid(inner, budget=30, first_wait=0.01)
    with caplog.at_level("WARNING", logger="fedcare.flower"):
        assert list(grid.pull_messages(["m0", "m1"])) == ["reply to m0", "reply to m1"]
    assert inner.calls == ["pull_messages"] * 3
    retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == 2 and retries[0].startswith("fedcare: the SuperLink failed pull_messages (")
    assert any("pull_messages succeeded after 3 tries" in r.getMessage() for r in caplog.records)
    assert [(f["call"], f["tries"]) for f in grid.faults] == [("pull_messages", 3)]
    assert grid.faults[0]["error"] in ("HTTP 500 from /v1/runtime/pull-messages", "OperationalError: database is locked",
                                       "OperationalError: (sqlite3.OperationalError) database is locked\n"
                                       "[SQL: UPDATE ...]\n(Background on this error at: https://sqlalche.me/e/21/e3q8)",
                                       "ObjectPushError: Failed to push object with ID '4d32' for run 1 using session "
                                       "'s1'. The push session may have expired or been replaced.")


@pytest.mark.parametrize("fault", [http_error(403), http_error(400), sqlite3.OperationalError("no such table: run"),
                                   ValueError("Malformed PushMessages")], ids=["403", "400", "sqlite-schema", "value"])
def test_other_errors_are_not_retried(fault):
    inner = FaultyGrid([fault])
    with pytest.raises(type(fault)):
        PatientGrid(inner, budget=30, first_wait=0.01).push_messages(["a"])
    assert inner.calls == ["push_messages"] and not transient(fault)


def test_a_fault_that_outlasts_the_budget_stops_the_run_saying_so():
    inner = FaultyGrid([http_error(500, "/v1/runtime/get-nodes")] * 1000)
    t0 = time.monotonic()
    with pytest.raises(CoordinatorUnavailable, match=r"the SuperLink kept failing for 1 s \(the round timeout\): "
                                                     r"get_node_ids: HTTP 500 from /v1/runtime/get-nodes\. "
                                                     r"The run stops here; its finished units are kept"):
        PatientGrid(inner, budget=1, first_wait=0.05, longest_wait=1).get_node_ids()
    assert 1 <= time.monotonic() - t0 < 5 and len(inner.calls) > 2


def test_send_and_receive_pulls_until_every_reply_came_over_retried_calls():
    class Later(FaultyGrid):
        def pull_messages(self, ids):
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i))
                    for i in self._answer("pull_messages", list(ids))]

    inner = Later([LOCKED])
    replies = PatientGrid(inner, budget=30, first_wait=0.01).send_and_receive(["x", "y"], timeout=10)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1"]


# -- through Flower's Simulation Engine: the SuperLink's state fails now and then ---------------

SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)
CLIENTS = [1, 2, 3]


def _data(cid: int):
    return tiny_data(cid)


def _run_on_flower(rounds: int) -> list[dict]:
    from flwr.simulation import run_simulation

    history: list[dict] = []
    algorithm = lambda: fedavg(SETTINGS)  # noqa: E731
    server_app = make_server_app(algorithm, tiny_model, rounds, 5, CLIENTS, history.append, metrics="binary")
    client_app = make_client_app(algorithm, tiny_model, _data, 5, client_ids=CLIENTS)
    InProcessBackend.workers = len(CLIENTS)
    with simulation_backend() as backend:
        run_simulation(server_app, client_app, num_supernodes=len(CLIENTS), backend_name=backend)
    return history


@pytest.mark.timeout(300)
def test_a_serverapp_whose_superlink_fails_now_and_then_ends_with_the_undisturbed_numbers(monkeypatch):
    """Every 4th call of each of the ServerApp's Grid methods fails (HTTP 500, or SQLite's locked database,
    alternately) where the SuperLink's state is reached: the run ends, every round, with the
    simulator's global model and metrics bit for bit (on fedcare 0.2 the first fault ended it)."""
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    injected = []

    def failing(name):
        original = getattr(InMemoryGrid, name)

        def call(self, *args):
            if injected.count(name) < 4 and calls.count(name) % 4 == 3:  # each method: its 4th, 8th, ... call, 4 at most
                calls.append(name)
                injected.append(name)
                raise (http_error(500) if len(injected) % 2 else sqlite3.OperationalError("database is locked"))
            calls.append(name)
            return original(self, *args)
        return call

    calls: list[str] = []
    for name in ("get_node_ids", "push_messages", "pull_messages"):
        monkeypatch.setattr(InMemoryGrid, name, failing(name))
    rounds = 2
    history = _run_on_flower(rounds)
    assert len(injected) >= 6 and {"push_messages", "pull_messages"} <= set(injected)
    assert [h["round"] for h in history] == [1, 2], "the ServerApp did not finish its rounds"

    federation = Federation(tiny_model(), fedavg(SETTINGS), 5)
    train = {c: _data(c) for c in CLIENTS}
    losses = [federation.run_round("train", rnd, train)["train_loss"] for rnd in range(1, rounds + 1)]
    assert [h["train_loss"] for h in history] == losses
    for k, v in federation.global_message.tensors.items():
        assert torch.equal(history[-1]["global_message"].tensors[k], v), k
    assert history[-1]["clients_metrics"] == federation.evaluate(train, "binary")

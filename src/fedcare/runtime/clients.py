"""What the clients of a federation do, as operations the server side asks for.

The server side (`Federation`: sampling, aggregation, early stopping) never touches a client's
data or state; it asks its clients for operations: fit, after-aggregation, setup, evaluate,
snapshot, restore. Two runtimes carry them out with the same per-client code (`ClientRunner`):

- `LocalClients`, in this process: every client's state in memory, one working model;
- `fedcare.runtime.flower.FlowerClients`: each operation travels to the client's site.

An operation's data (`Data`) is a `fedcare.runtime.refs.DataRef` naming some of the client's
data, which its site resolves on its own data (the server never holds a site's data), or, in
process only, the `ClientData` itself (pooled data, a pretraining split).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, Union

from torch import nn

from fedcare.algorithms.base import ClientHalf, ClientId
from fedcare.algorithms.messages import ClientState, Message, clone_state
from fedcare.algorithms.training import ClientData, Randomness, TrainingDiverged
from fedcare.runtime.refs import DataRef

Data = Union[DataRef, ClientData]  # what an operation's data is: a reference, or (in process) the data
DataResolver = Callable[[ClientId, DataRef], ClientData]
PRIVACY_LEDGER = "extra/privacy/"  # client-state entries that account for privacy spent (fedcare.privacy)
Work = Mapping[ClientId, tuple[Message, Data]]  # per client: the message it receives, the data to use


# ------------------------------------------------------------------------------ operations


@dataclass(frozen=True)
class Fit:
    phase: str
    round: int
    message: Message
    data: Data


@dataclass(frozen=True)
class AfterAggregation:
    phase: str
    round: int
    message: Message
    data: Data


@dataclass(frozen=True)
class Setup:
    phase: str
    message: Message
    data: Data


@dataclass(frozen=True)
class ReceiveSetup:
    message: Message


@dataclass(frozen=True)
class Evaluate:
    message: Message
    data: Data
    metrics: str  # which metrics the client computes on its data: a kind its task knows (`fedcare.tasks`)


@dataclass(frozen=True)
class Exchange:
    """A named exchange of a protocol around the algorithm (`ClientHalf.exchange`)."""

    name: str
    round: int
    message: Message


@dataclass(frozen=True)
class Snapshot:
    """Keep a copy of the current state (the best round so far, under early stopping)."""


@dataclass(frozen=True)
class Restore:
    """Go back to the snapshot."""


Operation = Union[Fit, AfterAggregation, Setup, ReceiveSetup, Evaluate, Exchange, Snapshot, Restore]


class ClientRunner:
    """One client within one federation: its algorithm half, its private state and the
    snapshot of it, and the operations above run on a working model."""

    def __init__(self, half: ClientHalf, seed: int, client: ClientId, state: ClientState):
        self.half = half
        self.seed = seed
        self.client = client
        self.state = state
        self.best: ClientState | None = None

    def run(self, op: Operation, model: nn.Module, data: ClientData | None) -> Message | dict | None:
        """Message for Fit, Setup (None: no setup) and Exchange, metrics for Evaluate, else None."""
        with diverges_as(self.client):
            return self._run(op, model, data)

    def _run(self, op: Operation, model: nn.Module, data: ClientData | None) -> Message | dict | None:
        half = self.half
        if isinstance(op, Fit):
            reply, self.state = half.fit(model, op.message, self.state, data, self._rng(op.phase, op.round))
            return reply
        if isinstance(op, AfterAggregation):
            self.state = half.after_aggregation(model, op.message, self.state, data, self._rng(op.phase, op.round))
            return None
        if isinstance(op, Setup):
            return half.setup(model, op.message, self.state, data, self._rng(op.phase, 0))
        if isinstance(op, ReceiveSetup):
            self.state = half.receive_setup(op.message, self.state)
            return None
        if isinstance(op, Evaluate):
            return half.evaluate(model, op.message, self.state, data, op.metrics, self._rng("evaluate", 0))
        if isinstance(op, Exchange):
            reply, self.state = half.exchange(op.name, op.message, self.state)
            return reply
        if isinstance(op, Snapshot):
            self.best = clone_state(self.state)
            return None
        if isinstance(op, Restore):
            if self.best is None:
                raise RuntimeError(f"client {self.client!r}: restore without a snapshot")
            # privacy ledgers are never rolled back: the updates after the snapshot were released
            ledgers = {k: v for k, v in self.state.items() if k.startswith(PRIVACY_LEDGER)}
            self.state = {**clone_state(self.best), **ledgers}
            return None
        raise TypeError(f"unknown operation {op!r}")

    def _rng(self, phase: str, rnd: int) -> Randomness:
        return Randomness(self.seed, phase, self.client, rnd)


@contextmanager
def diverges_as(client: ClientId) -> Iterator[None]:
    """Training that diverges inside is `client`'s divergence: its TrainingDiverged names the client."""
    try:
        yield
    except TrainingDiverged as e:
        raise TrainingDiverged(f"{e} (client {client!r})") from e


# --------------------------------------------------------------------------- the interface


class Clients(Protocol):
    """The client side of a federation, as the server side sees it. Every method takes the
    clients it addresses in `work` and returns replies keyed by client; a runtime may return
    fewer replies than asked (a site that dropped out) but never reorders arithmetic: callers
    iterate in sorted client order. `min_replies`: the fewest valid replies an exchange goes
    on with (a deployment's quorum; 1 when absent)."""

    min_replies: int

    def fit(self, phase: str, rnd: int, work: Work) -> dict[ClientId, Message]: ...

    def after_aggregation(self, phase: str, rnd: int, work: Work) -> None: ...

    def setup(self, phase: str, work: Work) -> dict[ClientId, Message]: ...

    def receive_setup(self, answers: Mapping[ClientId, Message]) -> None: ...

    def evaluate(self, work: Work, metrics: str) -> dict[ClientId, dict]: ...

    def exchange(self, name: str, rnd: int, messages: Mapping[ClientId, Message]) -> dict[ClientId, Message]: ...

    def snapshot(self) -> None: ...

    def restore(self) -> None: ...

    def pooled(self, refs: Mapping[ClientId, Data]) -> ClientData: ...


class LocalClients:
    """Every client in this process, one after another on a single working model (no per-client
    model copies, the memory trap of PFLlib#130): before a client runs, its model is assembled
    from the message it receives and its private state."""

    min_replies = 1  # every client here answers: an exchange goes on while one valid reply is left

    def __init__(self, model: nn.Module, half: ClientHalf, seed: int, resolve: DataResolver | None = None):
        self.model = model
        self.half = half
        self.seed = seed
        self.resolve = resolve
        self._initial_state = half.init_state(model)
        self.runners: dict[ClientId, ClientRunner] = {}
        self._in_snapshot: set[ClientId] = set()

    def runner(self, client: ClientId) -> ClientRunner:
        if client not in self.runners:
            self.runners[client] = ClientRunner(self.half, self.seed, client, clone_state(self._initial_state))
        return self.runners[client]

    @property
    def states(self) -> dict[ClientId, ClientState]:
        return {c: r.state for c, r in self.runners.items()}

    def data(self, client: ClientId, ref: Data) -> ClientData:
        return ref if isinstance(ref, ClientData) else self.resolve(client, ref)

    def pooled(self, refs: Mapping[ClientId, Data]) -> ClientData:
        """Every client's data in one (centralized training): possible only in process."""
        return ClientData.concat(self.data(c, refs[c]) for c in sorted(refs))

    def _run(self, client: ClientId, op: Operation) -> Any:
        data = self.data(client, op.data) if hasattr(op, "data") else None
        return self.runner(client).run(op, self.model, data)

    def fit(self, phase: str, rnd: int, work: Work) -> dict[ClientId, Message]:
        return {c: self._run(c, Fit(phase, rnd, m, d)) for c, (m, d) in sorted(work.items())}

    def after_aggregation(self, phase: str, rnd: int, work: Work) -> None:
        for c, (m, d) in sorted(work.items()):
            self._run(c, AfterAggregation(phase, rnd, m, d))

    def setup(self, phase: str, work: Work) -> dict[ClientId, Message]:
        replies = {c: self._run(c, Setup(phase, m, d)) for c, (m, d) in sorted(work.items())}
        return {c: r for c, r in replies.items() if r is not None}

    def receive_setup(self, answers: Mapping[ClientId, Message]) -> None:
        for c, m in sorted(answers.items()):
            self._run(c, ReceiveSetup(m))

    def evaluate(self, work: Work, metrics: str) -> dict[ClientId, dict]:
        return {c: self._run(c, Evaluate(m, d, metrics)) for c, (m, d) in sorted(work.items())}

    def exchange(self, name: str, rnd: int, messages: Mapping[ClientId, Message]) -> dict[ClientId, Message]:
        return {c: self._run(c, Exchange(name, rnd, m)) for c, m in sorted(messages.items())}

    def snapshot(self) -> None:
        for r in self.runners.values():  # any order: each client's copy is its own
            r.run(Snapshot(), self.model, None)
        self._in_snapshot = set(self.runners)

    def restore(self) -> None:
        """Every client back to the snapshot; a client that first ran after it starts afresh."""
        self.runners = {c: r for c, r in self.runners.items() if c in self._in_snapshot}
        for r in self.runners.values():
            r.run(Restore(), self.model, None)

    # -- a resumable run's checkpoint (`fedcare.studies.checkpoint`) -----------------------
    def state_dict(self) -> dict:
        """Every client's state and snapshot, copied."""
        return {"clients": {c: (clone_state(r.state), None if r.best is None else clone_state(r.best))
                            for c, r in self.runners.items()},
                "in_snapshot": list(self._in_snapshot)}

    def load_state_dict(self, saved: dict) -> None:
        self.runners = {}
        for c, (state, best) in saved["clients"].items():
            self.runners[c] = ClientRunner(self.half, self.seed, c, clone_state(state))
            self.runners[c].best = None if best is None else clone_state(best)
        self._in_snapshot = set(saved["in_snapshot"])

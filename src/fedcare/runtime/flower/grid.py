"""The Grid fedcare's ServerApp talks to the SuperLink through: it survives the SuperLink's
transient faults instead of dying of them.

Flower's HTTP Grid retries transport errors and HTTP 502, 503 and 504 itself, and lets an
HTTP 500 end the ServerApp. The SuperLink answers 500 when its SQLite database stays locked
for longer than its busy timeout (5 s), which happens on a loaded coordinator:
`sqlite3.OperationalError: database is locked` on `/v1/runtime/pull-messages` (reproduced by
holding a write lock on the database for 8 s mid-run). `PatientGrid` wraps the Grid
the ServerApp is given and retries such a call with exponential backoff and jitter (Flower's
own `RetryInvoker`), logging every retry, for at most `budget` seconds after its first failure
(the experiment's round timeout); then the run stops with an error that says so, its finished
units kept for `fedcare flower run --resume`. A Grid that reaches the state in process (Flower's
`InMemoryGrid`) raises the database error itself: it is retried the same way.

A locked database also fails a push half-way: the SuperLink cannot store one of the message's
objects and Flower raises `ObjectPushError` ("the push session may have expired or been
replaced"; met in the chaos test, tests/deployment/test_cli_deployed_chaos.py): it is retried too.

Every call can be repeated: the SuperLink takes a message pushed again (its id is its content's
hash) once, and a push of its objects in a new session replaces the unfinished one; a pull that
failed before the SuperLink claimed the replies claimed nothing. Flower's pull is not one
transaction, though: a failure after the SuperLink handed a reply over (while its objects are
fetched) loses that reply, and the site is then late for that exchange (`late_sites`).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterable
from typing import Any

import httpx
from flwr.app import Message
from flwr.serverapp import Grid
from flwr.supercore.inflatable.inflatable_utils import ObjectPushError
from flwr.supercore.retry import RetryInvoker, RetryState, exponential

from fedcare.errors import UserError

log = logging.getLogger("fedcare.flower")

TRANSIENT_STATUS = frozenset({httpx.codes.INTERNAL_SERVER_ERROR})  # Flower retries 502, 503, 504 itself


class CoordinatorUnavailable(UserError, RuntimeError):
    """The SuperLink kept failing for longer than the budget: the run stops, resumable."""


def transient(error: BaseException) -> bool:
    """Whether `error` is a fault of the SuperLink that a later try may not meet: an HTTP 500,
    SQLite's locked or busy database (raised in process, or wrapped by SQLAlchemy), or a push
    whose objects the SuperLink could not store (its database locked)."""
    if isinstance(error, ObjectPushError):
        return True
    if isinstance(error, httpx.HTTPStatusError):
        return error.response.status_code in TRANSIENT_STATUS
    database = error if isinstance(error, sqlite3.OperationalError) else getattr(error, "orig", None)
    return isinstance(database, sqlite3.OperationalError) and any(
        word in str(database).lower() for word in ("locked", "busy"))


def describe(error: BaseException) -> str:
    if isinstance(error, httpx.HTTPStatusError):
        return f"HTTP {error.response.status_code} from {error.request.url.path}"
    return f"{type(error).__name__}: {error}"


class PatientGrid(Grid):
    """`grid` with its SuperLink calls retried on transient faults for up to `budget` seconds each
    (see the module docstring). `faults` lists the faults survived: the call, the error, the
    tries and the seconds it took."""

    def __init__(self, grid: Grid, budget: float, first_wait: float = 0.2, longest_wait: int = 10):
        self.grid = grid
        self.budget = budget
        self.faults: list[dict[str, Any]] = []
        self._error = ""  # the last fault met, for `faults`
        self._retry = RetryInvoker(
            lambda: exponential(base_delay=first_wait, max_delay=longest_wait),
            (httpx.HTTPStatusError, sqlite3.OperationalError, ObjectPushError, *_sqlalchemy_errors()),
            max_tries=None, max_time=budget, should_giveup=lambda e: not transient(e),
            on_backoff=self._retrying, on_success=self._survived)

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return self._retry.invoke(getattr(self.grid, name), *args)
        except Exception as e:
            if not transient(e):
                raise
            raise CoordinatorUnavailable(
                f"the SuperLink kept failing for {self.budget:.0f} s (the round timeout): {name}: {describe(e)}. "
                "The run stops here; its finished units are kept") from e

    def _retrying(self, state: RetryState) -> None:
        self._error = describe(state.exception)
        log.warning("fedcare: the SuperLink failed %s (%s); retrying, try %d, %.1f s of %.0f s",
                    state.target.__name__, describe(state.exception), state.tries + 1, state.elapsed_time, self.budget)

    def _survived(self, state: RetryState) -> None:
        if state.tries > 1:
            self.faults.append({"call": state.target.__name__, "error": self._error,
                                "tries": state.tries, "seconds": round(state.elapsed_time, 1)})
            log.warning("fedcare: %s succeeded after %d tries (%.1f s)", state.target.__name__, state.tries,
                        state.elapsed_time)

    # -- Flower's Grid -----------------------------------------------------------------
    def set_run(self, run: Any) -> None:
        self.grid.set_run(run)

    @property
    def run(self) -> Any:
        return self.grid.run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:  # noqa: ANN001
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return self._call("get_node_ids")

    def get_nodes(self) -> Iterable[Any]:
        return self._call("get_nodes")

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self._call("push_messages", list(messages))

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self._call("pull_messages", list(message_ids))

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Flower's own loop (3 s between pulls), over the retried calls."""
        ids = set(self.push_messages(messages))
        end = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while ids and (end is None or time.monotonic() < end):
            pulled = list(self.pull_messages(ids))
            replies += pulled
            ids -= {m.metadata.reply_to_message_id for m in pulled}
            if ids:
                time.sleep(3)
        return replies


def _sqlalchemy_errors() -> tuple[type[Exception], ...]:
    """SQLAlchemy's OperationalError (around sqlite3's), where SQLAlchemy is installed (Flower's SuperLink needs it)."""
    try:
        from sqlalchemy.exc import OperationalError
    except ImportError:  # pragma: no cover - flwr brings SQLAlchemy
        return ()
    return (OperationalError,)

"""A site's side of a Flower run: the client operations of `fedcare.runtime.clients`, run on
the site's own data, with the client's private state kept in `Context.state` and, because
`Context.state` lives only in the SuperNode's memory, in a state file after every message.

A site is a `fedcare.runtime.sites.Site` (its client id and its data by reference) with a
`Builder` (the study's model and algorithms by name). `SiteNode` holds one federation's
client state at a time (beginning the next federation drops the last: studies run their
federations one after another). With a state folder it also keeps the site's own record of
what it trained on and sent (`fedcare.runtime.flower.site_record`).

A message can come twice: its reply was lost (the SuperNode was killed after the site ran it)
or dropped as invalid, and a coordinator that waits for its sites (`late_sites = "wait"`)
sends it again. The site knows it by its number (`Mark`): it goes back to its state from
before that message (kept in memory, and on disk as the state file before it: `before_file`)
and runs it again, so the reply is the one the first run made.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from flwr.app import ConfigRecord, RecordDict
from torch import nn

from fedcare.algorithms.base import Algorithm, ClientId
from fedcare.algorithms.messages import ClientState, clone_state
from fedcare.algorithms.split import load_tensors
from fedcare.algorithms.training import ClientData
from fedcare.files import atomic_write_bytes
from fedcare.runtime.clients import AfterAggregation, ClientRunner, Fit
from fedcare.runtime.refs import DataRef, Split
from fedcare.runtime.sites import Builder, Site, SiteError
from fedcare.runtime.flower.records import Begin, Mark, Resume, record_to_tensors, tensors_to_record
from fedcare.runtime.flower.site_record import SiteRecord

SITE_META = "fedcare-site"


def before_file(state_file: Path) -> Path:
    """Where the state file before the last message is kept (`SiteNode.save_after_message`)."""
    return state_file.with_suffix(".before.pt")


@dataclass
class FactorySite:
    """A site built from Python factories (`make_client_app`), its own builder: data
    references `Split("train")` and `Split("eval")` name the client's training and evaluation data."""

    data_refs: ClassVar[tuple[type[DataRef], ...]] = (Split,)

    client: ClientId
    algorithm_factory: Callable[[], Algorithm]
    model_factory: Callable[[], nn.Module]
    train_data: Callable[[ClientId], ClientData]
    eval_data: Callable[[ClientId], ClientData]
    seed: int = 0  # the run seed (a plain Flower strategy does not send one)
    synthetic: bool = False

    def summary(self) -> dict:
        return {}

    def data(self, ref: DataRef) -> ClientData:
        if ref == Split("train"):
            return self.train_data(self.client)
        if ref == Split("eval"):
            return self.eval_data(self.client)
        raise SiteError(f"client {self.client!r}: unknown data reference {ref} (expected split/train or split/eval)")

    def new_model(self) -> nn.Module:
        return self.model_factory()

    def algorithm(self, name: str) -> Algorithm:
        return self.algorithm_factory()


class SiteNode:
    """One site's client within the current federation, run operation by operation."""

    def __init__(self, site: Site, builder: Builder, kept_file: Path | None = None, record: SiteRecord | None = None,
                 state_file: Path | None = None):
        self.site = site
        self.record = record  # the site's own record of the models its data touched (None: no state folder)
        self.builder = builder
        self.model = builder.new_model()
        self.namespace: str | None = None
        self.algorithm_name = ""
        self.runner: ClientRunner | None = None
        self.seq = 0  # the last message of this federation the site ran (`Mark`)
        self.kept: int | None = None  # the message after which `kept_file` holds this federation's state
        self.kept_file = kept_file  # the state a coordinator's checkpoint refers to (None: no state folder)
        # the message being handled, (federation, seq), and the state from before it
        self.before: tuple[tuple[str, int], dict] | None = None
        self.state_path = state_file  # where the state is saved after every message (None: no state folder)
        self.repeated = False  # the last message handled had come before

    def handle(self, ops: list[tuple[str, Any]]) -> list:
        self._before_message(ops)
        results = []
        seq = None
        for namespace, op in ops:
            if isinstance(op, Begin):
                if op.reset or namespace != self.namespace:
                    self._begin(namespace, op)
                results.append(None)
                continue
            if isinstance(op, Resume):
                self._continue(namespace, op)
                results.append(None)
                continue
            if namespace != self.namespace or self.runner is None:
                raise SiteError(f"client {self.site.client!r}: no state for federation {namespace!r} (it never began here)")
            if isinstance(op, Mark):
                self._keep(op.kept)
                seq = op.seq
                results.append(None)
                continue
            data = self.site.data(op.data) if hasattr(op, "data") else None
            result = self.runner.run(op, self.model, data)
            if self.record is not None and isinstance(op, (Fit, AfterAggregation)):  # what trained on its data
                self.record.note(namespace, self.algorithm_name, self.runner.seed, op, result)
            results.append(result)
        if seq is not None:
            self.seq = seq
        return results

    def _begin(self, namespace: str, op: Begin) -> None:
        algorithm = self.builder.algorithm(op.algorithm)
        load_tensors(self.model, op.model.tensors)
        self.namespace, self.algorithm_name = namespace, op.algorithm
        self.runner = ClientRunner(algorithm.client, op.seed, self.site.client, algorithm.client.init_state(self.model))
        self.seq, self.kept = 0, None

    # -- a message that comes again: answered from the state before it ---------------------
    def _before_message(self, ops: list[tuple[str, Any]]) -> None:
        """Keep the state from before a new message; go back to it for one that came before."""
        mark = next(((namespace, op.seq) for namespace, op in ops if isinstance(op, Mark)), None)
        if mark is None:
            return
        self.repeated = self.runner is not None and mark == (self.namespace, self.seq)
        if self.repeated:
            self._undo(mark)
        else:
            self.before = (mark, self._payload(clone=True))

    def _undo(self, message: tuple[str, int]) -> None:
        namespace, seq = message
        if self.before is not None and self.before[0] == message:
            payload = self.before[1]
        else:  # a restarted SuperNode: the state file before this one (written before the reply was lost)
            payload = self._read(self.before_path) if self.before_path is not None else None
            meta = (payload or {}).get("meta") or {}
            if payload is None or (meta.get("namespace") == namespace and meta.get("seq") != seq - 1):
                raise SiteError(f"client {self.site.client!r}: message {seq} of federation {namespace!r} came again, "
                                "but the state from before it is not kept (a state folder keeps it)")
            self.before = (message, payload)
        self._set(payload)

    def _payload(self, clone: bool = False) -> dict:
        copy = clone_state if clone else (lambda state: state)
        return {"meta": self.meta(), "state": copy(self.runner.state) if self.runner else None,
                "best": copy(self.runner.best) if self.runner and self.runner.best is not None else None}

    def _set(self, payload: dict) -> None:
        if payload["meta"]:
            state = clone_state(payload["state"])  # the kept copy stays as it is, for a third time
            self._resume(payload["meta"], state, None if payload["best"] is None else clone_state(payload["best"]))
        else:  # before the federation's first message
            self.namespace, self.algorithm_name, self.runner, self.seq, self.kept = None, "", None, 0, None

    @property
    def before_path(self) -> Path | None:
        return None if self.state_path is None else before_file(self.state_path)

    # -- a coordinator's checkpoint: the site keeps its side of it ---------------------------
    def _keep(self, kept: int | None) -> None:
        """The coordinator checkpointed this site's state after message `kept`: copy it aside
        (once), before this message changes it. A site without a state folder keeps nothing."""
        if kept is None or kept == self.kept or kept != self.seq or self.kept_file is None:
            return
        self.kept = kept
        self.save(self.kept_file)

    def _continue(self, namespace: str, op: Resume) -> None:
        """A resumed coordinator continues this federation after message `op.seq`: the current
        state if the site ran nothing since, else the copy kept at the checkpoint."""
        if namespace == self.namespace and self.runner is not None and self.seq == op.seq:
            return
        if self.kept_file is not None and self.kept_file.is_file():
            payload = torch.load(self.kept_file, weights_only=True)
            meta = payload["meta"]
            if meta.get("namespace") == namespace and meta.get("seq") == op.seq:
                self._resume(meta, payload["state"], payload["best"])
                return
        where = f"in {self.kept_file.parent}" if self.kept_file is not None else "(it runs without a state folder)"
        raise SiteError(f"client {self.site.client!r}: cannot continue this run: no state of its federation "
                        f"{namespace!r} after message {op.seq} is kept {where}; the state folder was lost or "
                        "belongs to another run")

    # -- persistence: Context.state and the state file hold the same thing -----------------
    def meta(self) -> dict:
        if self.runner is None:
            return {}
        return {"namespace": self.namespace, "algorithm": self.algorithm_name, "seed": self.runner.seed,
                "has_best": self.runner.best is not None, "seq": self.seq, "kept": self.kept}

    def store(self, context_state: RecordDict) -> None:
        context_state[SITE_META] = ConfigRecord({"json": json.dumps(self.meta())})
        if self.runner is not None:
            context_state["fedcare-state"] = tensors_to_record(self.runner.state)
            if self.runner.best is not None:
                context_state["fedcare-best"] = tensors_to_record(self.runner.best)

    def restore_from(self, context_state: RecordDict) -> bool:
        """Take the federation state kept in `Context.state`; False if there is none."""
        if SITE_META not in context_state.config_records:
            return False
        meta = json.loads(str(context_state.config_records[SITE_META]["json"]))
        if meta:
            best = record_to_tensors(context_state.array_records["fedcare-best"]) if meta["has_best"] else None
            self._resume(meta, record_to_tensors(context_state.array_records["fedcare-state"]), best)
        return True

    def save(self, path: Path) -> None:
        """Write the state file atomically: a crash mid-write leaves the previous file whole."""
        buffer = io.BytesIO()
        torch.save(self._payload(), buffer)
        atomic_write_bytes(path, buffer.getvalue(), private=True)  # the private layers: 0600 from creation

    def save_after_message(self, path: Path) -> None:
        """The state file after a message; the one before it is kept beside it (`before_file`),
        unless the message came again (the file before it is still the one kept)."""
        self.state_path = path
        if not self.repeated and path.is_file():
            os.replace(path, before_file(path))
        self.save(path)

    def load(self, path: Path) -> bool:
        """Resume from the state file (a restarted SuperNode); False if there is none. A
        SuperNode killed between keeping the file before and writing the new one left only the
        file before: it is the state."""
        self.state_path = path
        payload = self._read(path) if path.is_file() else self._read(before_file(path))
        if payload is None:
            return False
        if payload["meta"]:
            self._resume(payload["meta"], payload["state"], payload["best"])
        return True

    @staticmethod
    def _read(path: Path) -> dict | None:
        return torch.load(path, weights_only=True) if path.is_file() else None

    def _resume(self, meta: dict, state: ClientState, best: ClientState | None) -> None:
        algorithm = self.builder.algorithm(meta["algorithm"])
        self.namespace, self.algorithm_name = meta["namespace"], meta["algorithm"]
        self.runner = ClientRunner(algorithm.client, int(meta["seed"]), self.site.client, state)
        self.runner.best = best
        self.seq, self.kept = int(meta.get("seq", 0)), meta.get("kept")

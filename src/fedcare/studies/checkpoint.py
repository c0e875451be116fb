"""Resuming an interrupted run from its last finished unit.

A protocol divides its work into units (pain: a pretraining, or one session of one method of
one seed; FedHealth 2: one round of one method of one seed) and calls `Checkpoint.commit`
after each, with the state it needs to continue from there (the running federation's, the
pretrained starts). A commit syncs metrics.jsonl, then atomically replaces `checkpoint.pt`
with: the finished units, that state, and the size of metrics.jsonl at that point.

The run's lineage (`fedcare.runtime.lineage`) is committed with the unit, before the
checkpoint: its records and models, and lineage.jsonl's size in the checkpoint.

`fedcare resume DIR` reruns the protocol: it skips finished units (`finished`), takes its
state back (`state`), truncates metrics.jsonl and lineage.jsonl to the committed sizes
(dropping what an unfinished unit wrote), and goes on. Every random draw is derived from (seed, phase, client,
round, purpose) and the state is saved bit for bit, so the records end byte-identical to an
uninterrupted run's.
"""

from __future__ import annotations

import io
import pickle
import re
import zipfile
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import torch

from fedcare.device import to_host
from fedcare.errors import InputError
from fedcare.files import atomic_write_bytes
from fedcare.runtime.lineage import Lineage
from fedcare.studies.rundir import RESUME_STATE_FILE, RecordsWriter

CHECKPOINT_FILE = RESUME_STATE_FILE


def unit_key(key: tuple) -> tuple:
    """Keys are compared after a round trip through the file: plain tuples of str/int."""
    return tuple(key)


def state_classes() -> list[type]:
    """What a checkpoint may name besides tensors: the server halves (their state is pickled
    whole: FedAP's statistics, FedDyn's h, server optimizer moments, ...), the messages and
    parameter splits they hold, and the module types a split names."""
    import fedcare.algorithms.catalogue  # noqa: F401  (imports every algorithm's module)
    import fedcare.algorithms.robust  # noqa: F401  (its server half wraps an algorithm's under [robustness])
    from fedcare.config import ClientDP
    from fedcare.privacy.client_dp import Ledger  # its server half wraps any algorithm's, with its settings
    from fedcare.algorithms.base import ServerHalf
    from fedcare.algorithms.fedbn import FEDBN_SPLIT
    from fedcare.algorithms.messages import Message
    from fedcare.algorithms.server_optimizers import CosineAnneal  # a server optimizer's rate schedule
    from fedcare.algorithms.split import ParameterSplit

    classes, todo = set(), [ServerHalf]
    while todo:
        cls = todo.pop()
        if cls not in classes:
            classes.add(cls)
            todo += cls.__subclasses__()
    return [*sorted(classes, key=lambda c: c.__qualname__), Message, ParameterSplit, *FEDBN_SPLIT.private_types,
            ClientDP, Ledger, CosineAnneal, set, frozenset]


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


class NoCheckpoint:
    """A protocol run outside `run_study` (tests): nothing finished before, nothing kept."""

    units_total = 0
    units_done = 0

    def finished(self, *key: Hashable) -> bool:
        return False

    def state(self, name: str, default: Any = None) -> Any:
        return default

    def commit(self, *key: Hashable, **state: Any) -> None:
        pass


class Checkpoint:
    """The finished units of a run in `run_dir` and the state after the last one. `on_commit(key,
    units done, units total)` hears of each unit once it is durable (the run's bookkeeping:
    `fedcare.studies.run_record.RunRecord.unit_finished`)."""

    def __init__(self, run_dir: Path, records: RecordsWriter, saved: dict | None,
                 on_commit: Callable[[tuple, int, int], None], lineage: Lineage | None = None):
        self.run_dir = Path(run_dir)
        self.records = records
        self.lineage = lineage
        self.on_commit = on_commit
        saved = saved or {}
        self.finished_units: list[tuple] = [unit_key(k) for k in saved.get("units", [])]
        self._done = set(self.finished_units)
        self._state: dict[str, Any] = saved.get("state", {})
        self.units_total = 0

    @staticmethod
    def load(run_dir: Path) -> dict | None:
        """What the last commit saved (None: nothing finished yet)."""
        path = Path(run_dir) / CHECKPOINT_FILE
        if not path.is_file():
            return None
        # Run directories are shared and copied: a checkpoint is read weights-only, with fedcare's
        # own state classes allowed by name (a pickle naming anything else could run code); on the
        # CPU, whatever device wrote it (a run begun on a GPU continues on a machine without one).
        try:
            with torch.serialization.safe_globals(state_classes()):
                saved = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            named = re.search(r"GLOBAL ([\w.]+)", str(e))
            raise InputError(f"{path}: refused: it names {named.group(1) if named else 'something'}, not tensors or "
                             "fedcare's own state (loading it could run code); a checkpoint fedcare wrote never "
                             "does") from None
        except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, KeyError) as e:
            raise InputError(f"{path}: damaged, cannot be read ({_first_line(e)}); the run cannot be resumed "
                             "from it") from None
        if not isinstance(saved, dict) or not isinstance(saved.get("units", []), list):
            raise InputError(f"{path}: not a fedcare checkpoint")
        return saved

    def finished(self, *key: Hashable) -> bool:
        return unit_key(key) in self._done

    def state(self, name: str, default: Any = None) -> Any:
        """A piece of state saved by the last commit (e.g. "federation")."""
        return self._state.get(name, default)

    @property
    def units_done(self) -> int:
        return len(self.finished_units)

    def commit(self, *key: Hashable, **state: Any) -> None:
        """Unit `key` is finished; `state` (name -> value; None removes it; a callable is
        called here, so the copying happens only where a checkpoint is kept) is what
        continuing after it needs. Durable before it returns; counted as finished only once its
        checkpoint is on disk (a full disk's failed write does not count it in "kept ...")."""
        units = [*self.finished_units, unit_key(key)]
        new_state = dict(self._state)
        for name, value in state.items():
            if value is None:
                new_state.pop(name, None)
            else:
                new_state[name] = to_host(value() if callable(value) else value)  # device-free
        offset = self.records.sync()
        lineage_offset = self.lineage.commit(unit_key(key)) if self.lineage is not None else None
        buffer = io.BytesIO()
        torch.save({"units": units, "state": new_state, "offset": offset, "lineage_offset": lineage_offset}, buffer)
        atomic_write_bytes(self.run_dir / CHECKPOINT_FILE, buffer.getvalue(), private=True)
        self.finished_units, self._state = units, new_state
        self._done.add(unit_key(key))
        self.on_commit(unit_key(key), self.units_done, self.units_total)

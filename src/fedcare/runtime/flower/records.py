"""Client operations and their results as Flower 1.41 and 1.42 records.

A message to a site is a list of (federation, operation) pairs: the operations' fields as JSON
in a `ConfigRecord`, each fedcare `Message` they carry as an `ArrayRecord` (its tensors) and a
`MetricRecord` (its scalars). Tensors travel as numpy arrays (Flower serialises them with
`np.save`), so dtype, shape and every bit survive the round trip; scalars are Python floats
(float64) and survive exactly too. Tensor order is kept: `ArrayRecord` preserves insertion
order. A client's private state is an `ArrayRecord` in `Context.state` (see `site.py`).
An operation's data reference travels in its plain form (`DataRef.plain`, JSON) and is turned
back into one of the site's own kinds when decoded there (`decode_ops(content, data_refs)`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedcare.algorithms.messages import Message
from fedcare.runtime.clients import (
    AfterAggregation,
    Evaluate,
    Exchange,
    Fit,
    Operation,
    ReceiveSetup,
    Restore,
    Setup,
    Snapshot,
)
from fedcare.runtime.refs import DataRef


def tensors_to_record(tensors: Mapping[str, torch.Tensor]) -> ArrayRecord:
    # .copy(order="C"), not np.ascontiguousarray: the latter turns 0-d tensors (BatchNorm's
    # num_batches_tracked) into shape (1,)
    return ArrayRecord({k: Array(v.detach().cpu().numpy().copy(order="C")) for k, v in tensors.items()})


def record_to_tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    # np.array(..., copy) gives a writable array that torch can own
    return {k: torch.from_numpy(np.array(a.numpy(), copy=True)) for k, a in record.items()}


# ------------------------------------------------------------------- operations on the wire


@dataclass(frozen=True)
class Begin:
    """Start a federation at a site: the algorithm (by the study's name for it), the run seed
    and the full initial model, from which the client takes its first private state.
    `reset`: start afresh even if the site already holds this federation's state."""

    algorithm: str
    seed: int
    model: Message
    reset: bool = False


@dataclass(frozen=True)
class Resume:
    """Continue a federation that the coordinator checkpointed (a resumed run, `fedcare flower
    run --resume`): from the client state this site had after the federation's message `seq`,
    kept on the site's own disk (see `Mark`)."""

    algorithm: str
    seed: int
    seq: int


@dataclass(frozen=True)
class Mark:
    """Opens every message of a federation to a site: it is message `seq`, and the coordinator's
    last checkpoint holds this site's state after message `kept` (None: none yet). The site keeps
    a copy of that state until the next checkpoint, so that a resumed run can go back to it."""

    seq: int
    kept: int | None = None


_OP_NAMES = {Fit: "fit", AfterAggregation: "after_aggregation", Setup: "setup", ReceiveSetup: "receive_setup",
             Evaluate: "evaluate", Exchange: "exchange", Snapshot: "snapshot", Restore: "restore", Begin: "begin",
             Resume: "resume", Mark: "mark"}
_OP_TYPES = {v: k for k, v in _OP_NAMES.items()}
OPS = "fedcare-ops"
RESULTS = "fedcare-results"


def encode_ops(ops: list[tuple[str, Operation | Begin]]) -> RecordDict:
    """(federation, operation) pairs as one RecordDict. A message that several operations
    carry (after-aggregation and evaluate share the new global model) travels once."""
    content = RecordDict()
    keys: dict[int, str] = {}
    described = []
    for namespace, op in ops:
        d = {"op": _OP_NAMES[type(op)], "ns": namespace}
        for field, value in vars(op).items():
            if isinstance(value, Message):
                if id(value) not in keys:
                    keys[id(value)] = key = f"m{len(keys)}"
                    content[key] = tensors_to_record(value.tensors)
                    content[key + ".scalars"] = MetricRecord({k: float(v) for k, v in value.scalars.items()})
                d[field] = {"message": keys[id(value)]}
            elif field == "data":
                d[field] = {"ref": plain_data(value)}
            else:
                d[field] = value
        described.append(d)
    content[OPS] = ConfigRecord({"json": json.dumps(described)})
    return content


def plain_data(data: Any) -> dict:
    """An operation's data as it travels: a reference's plain form. A plain form already (an
    operation taken back from a coordinator's checkpoint) stays as it is: the coordinator only
    forwards it, and the site that resolves it checks it."""
    if isinstance(data, DataRef):
        return data.plain()
    if isinstance(data, dict):
        return data
    raise TypeError(f"{type(data).__name__}: only a data reference travels to a site, never the data")


def op_to_plain(op: Operation) -> dict:
    """An operation as a dict of plain values and `Message`s, its data reference in its plain
    form: what a coordinator's checkpoint may hold (`fedcare.studies.checkpoint` reads only
    tensors, messages and plain data)."""
    plain = {"op": _OP_NAMES[type(op)], **vars(op)}
    if "data" in plain:
        plain["data"] = plain_data(plain["data"])
    return plain


def op_from_plain(plain: dict) -> Operation:
    """The operation `op_to_plain` wrote; its data reference stays in its plain form."""
    fields = dict(plain)
    return _OP_TYPES[fields.pop("op")](**fields)


def _message(content: RecordDict, key: str) -> Message:
    scalars = content.metric_records[key + ".scalars"]
    return Message(record_to_tensors(content.array_records[key]), {k: float(v) for k, v in scalars.items()})


def decode_ops(content: RecordDict, data_refs: Sequence[type[DataRef]] = ()) -> list[tuple[str, Operation | Begin]]:
    """The (federation, operation) pairs `encode_ops` wrote, each data reference as one of
    `data_refs` (the site's own kinds; `fedcare.runtime.refs.DataRefError` for any other)."""
    ops = []
    for d in json.loads(str(content.config_records[OPS]["json"])):
        kind, namespace = _OP_TYPES[d.pop("op")], d.pop("ns")
        fields = {k: _decode_field(content, v, data_refs) for k, v in d.items()}
        ops.append((namespace, kind(**fields)))
    return ops


def _decode_field(content: RecordDict, value: Any, data_refs: Sequence[type[DataRef]]) -> Any:
    if isinstance(value, dict) and "message" in value:
        return _message(content, value["message"])
    if isinstance(value, dict) and "ref" in value:
        return DataRef.from_plain(value["ref"], data_refs)
    return value


def encode_results(results: list[Message | dict | None]) -> RecordDict:
    """One result per operation: a Message (fit, setup), a metrics dict (evaluate) or None.
    Metrics travel as JSON: Python writes floats so that they read back bit for bit (NaN too)."""
    content = RecordDict()
    described = []
    for i, r in enumerate(results):
        if isinstance(r, Message):
            content[f"r{i}"] = tensors_to_record(r.tensors)
            content[f"r{i}.scalars"] = MetricRecord({k: float(v) for k, v in r.scalars.items()})
            described.append({"message": f"r{i}"})
        else:
            described.append({"metrics": r})
    content[RESULTS] = ConfigRecord({"json": json.dumps(described)})
    return content


def decode_results(content: RecordDict) -> list[Message | dict | None]:
    out = []
    for d in json.loads(str(content.config_records[RESULTS]["json"])):
        out.append(_message(content, d["message"]) if "message" in d else d["metrics"])
    return out

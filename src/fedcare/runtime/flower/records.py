"""Conversion between fedcare's `Message` / `ClientState` and Flower 1.41 records.

A fedcare `Message` becomes a `RecordDict` with an `ArrayRecord` "tensors" and a
`MetricRecord` "scalars"; a client's private state becomes an `ArrayRecord` kept in
`Context.state`. Tensors travel as numpy arrays (Flower serialises them with `np.save`), so
dtype, shape and every bit survive the round trip; scalars are Python floats (float64) and
survive exactly too. Tensor order is kept: `ArrayRecord` preserves insertion order.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from fedcare.algorithms.messages import ClientState, Message

TENSORS = "tensors"
SCALARS = "scalars"
STATE = "fedcare-client-state"


def tensors_to_record(tensors: Mapping[str, torch.Tensor]) -> ArrayRecord:
    # .copy(order="C"), not np.ascontiguousarray: the latter turns 0-d tensors (BatchNorm's
    # num_batches_tracked) into shape (1,)
    return ArrayRecord({k: Array(v.detach().cpu().numpy().copy(order="C")) for k, v in tensors.items()})


def record_to_tensors(record: ArrayRecord) -> dict[str, torch.Tensor]:
    # np.array(..., copy) gives a writable array that torch can own
    return {k: torch.from_numpy(np.array(a.numpy(), copy=True)) for k, a in record.items()}


def message_to_recorddict(message: Message) -> RecordDict:
    return RecordDict(
        {
            TENSORS: tensors_to_record(message.tensors),
            SCALARS: MetricRecord({k: float(v) for k, v in message.scalars.items()}),
        }
    )


def recorddict_to_message(content: RecordDict) -> Message:
    tensors = record_to_tensors(content.array_records[TENSORS]) if TENSORS in content.array_records else {}
    scalars = {k: float(v) for k, v in content.metric_records[SCALARS].items()} if SCALARS in content.metric_records else {}
    return Message(tensors, scalars)


def save_state(context_state: RecordDict, state: ClientState) -> None:
    """Store a client's private state in `Context.state` (replacing the previous one)."""
    context_state[STATE] = tensors_to_record(state)


def load_state(context_state: RecordDict) -> ClientState | None:
    """The client's private state from `Context.state`; None on the client's first message."""
    if STATE not in context_state.array_records:
        return None
    return record_to_tensors(context_state.array_records[STATE])

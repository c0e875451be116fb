"""Client operations and their results as Flower records (fedcare.runtime.flower.records): through
Flower's own wire format and back, bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto

from fedcare.algorithms.messages import Message as FedMessage
from fedcare.runtime.clients import Evaluate, Fit, Snapshot
from fedcare.runtime.flower.records import Begin, decode_ops, decode_results, encode_ops, encode_results
from fedcare.runtime.refs import DataRefError, Split
from fedcare.studies.pain.cohort import PainSite, SessionFrames, TrainingSet


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

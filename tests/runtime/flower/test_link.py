"""A coordinator's checkpoint of a federation across sites: the operations waiting for a site keep
their data references in plain form, and a checkpoint from before typed references is refused."""

import io
from types import SimpleNamespace

import pytest
import torch
from support.tiny import tiny_model

from fedcare.algorithms.messages import Message
from fedcare.runtime.clients import AfterAggregation, Restore
from fedcare.runtime.flower.link import FlowerClients, FlowerRunError
from fedcare.runtime.flower.records import decode_ops, encode_ops
from fedcare.studies.checkpoint import state_classes
from fedcare.studies.facerec.data import FaceSite, Training


def clients() -> FlowerClients:
    return FlowerClients(SimpleNamespace(), "federation-1", "fedavg", 0, tiny_model())


def through_a_checkpoint(state: dict) -> dict:
    """As `fedcare.studies.checkpoint` writes and reads it: weights-only, fedcare's own classes by name."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    with torch.serialization.safe_globals(state_classes()):
        return torch.load(buffer, weights_only=True)


def test_a_waiting_operations_reference_survives_the_checkpoint_and_reaches_the_site_as_it_was():
    before = clients()
    message = Message({"w": torch.ones(2)}, {"num_examples": 3.0})
    before.pending = {1: [AfterAggregation("train", 4, message, Training("global")), Restore()]}
    after = clients()
    after.load_state_dict(through_a_checkpoint(before.state_dict()))
    ((_, op), (_, restore)) = decode_ops(encode_ops([("federation-1", op) for op in after.pending[1]]),
                                         FaceSite.data_refs)
    assert isinstance(restore, Restore) and (op.phase, op.round, op.data) == ("train", 4, Training("global"))
    assert torch.equal(op.message.tensors["w"], message.tensors["w"])


def test_a_checkpoint_whose_waiting_operations_name_data_by_string_is_refused():
    saved = {"namespace": "federation-1", "kept": {1: 3}, "in_snapshot": [], "reset": [],
             "pending": {1: [{"op": "after_aggregation", "phase": "train", "round": 3,
                              "message": Message({}, {}), "data": "train/global"}]}}
    with pytest.raises(FlowerRunError, match="written before typed data references .* names its data 'train/global'"):
        clients().load_state_dict(through_a_checkpoint(saved))

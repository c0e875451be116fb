"""A site's fit reply through the Flower link (`FlowerClients`) is checked by the federation as
the simulator's are (`fedcare.runtime.replies`): an invalid one is dropped naming the site's
client, and one that leaves fewer valid replies than `min_sites` stops the round, one line."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from flwr.app import ConfigRecord, RecordDict

from fedcare.algorithms import fedavg
from fedcare.algorithms.base import NUM_EXAMPLES, TRAIN_LOSS
from fedcare.algorithms.messages import Message
from fedcare.algorithms.training import TrainSettings
from fedcare.runtime.clients import Fit
from fedcare.runtime.federation import Federation
from fedcare.runtime.flower.link import HELLO, FlowerClients, LinkSettings, SiteLink
from fedcare.runtime.flower.records import decode_ops, encode_results
from fedcare.runtime.refs import Split
from fedcare.runtime.replies import InvalidReplies

from support.flower_offline import task_identity
from support.tiny import tiny_model


@pytest.fixture(autouse=True)
def _a_serverapp_run():
    with task_identity():  # what Flower sets in a ServerApp's process: messages need it
        yield


class SitesGrid:
    """Nodes 1, 2, 3 are clients "a", "b", "c"; each answers a fit at once with the message it
    received, nudged; site "c" puts a NaN into its reply (through Flower's records, as a site would)."""

    clients = {1: "a", 2: "b", 3: "c"}

    def __init__(self):
        self.pushed: dict[str, tuple[int, object]] = {}

    def get_node_ids(self):
        return list(self.clients)

    def push_messages(self, messages):
        ids = [f"m{len(self.pushed) + i}" for i in range(len(messages))]
        self.pushed.update({i: (m.metadata.dst_node_id, m) for i, m in zip(ids, messages)})
        return ids

    def pull_messages(self, ids):
        replies = []
        for i in ids:
            node, m = self.pushed[i]
            client = self.clients[node]
            if HELLO in m.content.config_records:
                answer = {"client": client, "site": f"site-{client}", "summary": {}, "synthetic": False}
                content = RecordDict({HELLO: ConfigRecord({"json": json.dumps(answer)})})
            else:
                fit = next(op for _, op in decode_ops(m.content, [Split]) if isinstance(op, Fit))
                tensors = {k: v + 0.01 if v.is_floating_point() else v for k, v in fit.message.tensors.items()}
                if client == "c":
                    tensors["features.0.weight"] = tensors["features.0.weight"] * math.nan
                content = encode_results([Message(tensors, {NUM_EXAMPLES: 10.0, TRAIN_LOSS: 0.5})])
            replies.append(SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i), content=content,
                                           has_error=lambda: False))
        return replies


def federation(min_sites: int) -> Federation:
    link = SiteLink(SitesGrid(), {}, LinkSettings(min_sites=min_sites, round_timeout=5, connect_timeout=5,
                                                  poll_interval=0.01))
    link.connect(["a", "b", "c"])
    model = tiny_model()
    algorithm = fedavg(TrainSettings(lr=0.05, batch_size=8, local_epochs=1))
    return Federation(model, algorithm, 0, clients=FlowerClients(link, "federation-1", "fedavg", 0, model))


def test_a_sites_nan_reply_is_dropped_naming_its_client_and_the_round_goes_on():
    fed = federation(min_sites=2)
    info = fed.run_round("train", 1, {c: Split("train") for c in ("a", "b", "c")})
    assert info["rejected"] == {"c": "tensor 'features.0.weight' holds NaN"} and info["clients"] == 2
    assert all(bool(torch.isfinite(t).all()) for t in fed.global_message.tensors.values() if t.is_floating_point())


def test_a_dropped_reply_that_leaves_fewer_than_min_sites_stops_the_round():
    fed = federation(min_sites=3)
    assert fed.clients.min_replies == 3
    with pytest.raises(InvalidReplies, match=r"fedavg \(seed 0\), round 1 of phase 'train': 2 valid replies left of "
                                             r"3 \(needed 3\); dropped client 'c': tensor 'features.0.weight' holds NaN"):
        fed.run_round("train", 1, {c: Split("train") for c in ("a", "b", "c")})

"""The surgical study's update statistics (fedcare.studies.surgical.updates) on hand-made
aggregates: CosSim and GradDiff per client, the server's step and the clients' weighted update."""

from __future__ import annotations

import math

import pytest
import torch

from fedcare.algorithms.messages import Message
from fedcare.studies.surgical.updates import server_statistics, update_statistics


def test_cossim_and_graddiff_on_a_hand_made_aggregate():
    before = Message({"w": torch.tensor([0.0, 0.0]), "b": torch.tensor([1.0])})
    after = Message({"w": torch.tensor([0.5, 0.5]), "b": torch.tensor([1.0])})
    replies = {"a": Message({"w": torch.tensor([1.0, 0.0]), "b": torch.tensor([1.0])}, {"num_examples": 3.0}),
               "b": Message({"w": torch.tensor([0.0, 2.0]), "b": torch.tensor([1.0])}, {"num_examples": 1.0})}
    stats = update_statistics(before, replies, after)
    # a: update (1, 0), global (0.5, 0.5): cos = 0.5 / (1 * sqrt(0.5)); ||(1, 0) - (0.5, 0.5)||^2 = 0.5
    assert stats["a"]["cossim"] == pytest.approx(1 / math.sqrt(2))
    assert stats["a"]["graddiff"] == pytest.approx(0.5)
    # b: update (0, 2): cos = 1 / (2 * sqrt(0.5)); ||(0, 2) - (0.5, 0.5)||^2 = 0.25 + 2.25
    assert stats["b"]["cossim"] == pytest.approx(1 / math.sqrt(2))
    assert stats["b"]["graddiff"] == pytest.approx(2.5)
    assert stats["a"]["n"] == 3.0
    # FedRep sends the body only: the statistics see what was sent and nothing else
    body = update_statistics(Message({"w": before.tensors["w"]}), {c: Message({"w": m.tensors["w"]}) for c, m in
                                                                   replies.items()}, Message({"w": after.tensors["w"]}))
    assert body["b"]["graddiff"] == pytest.approx(2.5)
    still = update_statistics(before, replies, before)  # no global update: the cosine is undefined
    assert math.isnan(still["a"]["cossim"])


def test_server_step_and_the_clients_weighted_update_on_a_hand_made_aggregate():
    before = Message({"w": torch.tensor([3.0, 4.0])})  # norm 5
    replies = {"a": Message({"w": torch.tensor([4.0, 4.0])}, {"num_examples": 3.0}),  # update (1, 0)
               "b": Message({"w": torch.tensor([3.0, 8.0])}, {"num_examples": 1.0})}  # update (0, 4)
    after = Message({"w": torch.tensor([3.0, 4.0 + 5.0])})  # the server stepped (0, 5)
    stats = server_statistics(before, replies, after)
    assert stats["server_step"] == pytest.approx(5 / 5)
    # weighted by frames: (3 * (1, 0) + 1 * (0, 4)) / 4 = (0.75, 1), norm 1.25
    assert stats["mean_update"] == pytest.approx(1.25 / 5)

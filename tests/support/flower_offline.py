"""Driving a Flower 1.41 `flwr.serverapp.strategy` offline, the way `Strategy.start` does.

`Strategy.start` calls `configure_train(round, arrays, config, grid)`, sends the
instructions, and hands the replies to `aggregate_train(round, replies)`. Offline, a
stand-in grid that only answers `get_node_ids()` lets `configure_train` sample nodes, and
each reply is a `Message(content, reply_to=instruction)` carrying one ArrayRecord and one
MetricRecord with `num-examples` (and `train_loss` for QFedAvg). Creating the instruction
Messages outside a run needs `TaskIdentity` set. Strategies keep state between rounds and
consume their inputs (QFedAvg empties the ArrayRecords it reads), so every check uses a
fresh strategy and freshly built records.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from torch import nn

from fedcare.algorithms.base import NUM_EXAMPLES, TRAIN_LOSS, ServerHalf
from fedcare.algorithms.messages import Message as FedcareMessage
from fedcare.algorithms.qfedavg import LOSS_AT_GLOBAL

Tensors = dict[str, torch.Tensor]


class StandInGrid:
    """All a strategy's `configure_train` asks of the grid: which nodes are connected."""

    def __init__(self, node_ids):
        self.node_ids = [int(n) for n in node_ids]

    def get_node_ids(self) -> list[int]:
        return list(self.node_ids)


@contextmanager
def task_identity(run_id: int = 1, node_id: int = 0, task_id: int = 1) -> Iterator[None]:
    """Set the process-wide TaskIdentity Messages need, and put the old one back after."""
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, node_id, task_id
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def to_record(tensors: Mapping[str, torch.Tensor]) -> ArrayRecord:
    return ArrayRecord({k: Array(v.detach().cpu().numpy().copy()) for k, v in tensors.items()})


def from_record(record: ArrayRecord) -> Tensors:
    return {k: torch.from_numpy(np.array(a.numpy())) for k, a in record.items()}


def flower_round(
    strategy,
    server_round: int,
    current: Mapping[str, torch.Tensor],
    results: Mapping[int, tuple[Mapping[str, torch.Tensor], Mapping[str, float]]],
) -> Tensors:
    """One training round: node id -> (the tensors it sends back, its metrics)."""
    grid = StandInGrid(results)
    instructions = list(strategy.configure_train(server_round, to_record(current), ConfigRecord(), grid))
    assert sorted(m.metadata.dst_node_id for m in instructions) == sorted(results), "every node must be sampled"
    replies = []
    for instruction in instructions:
        tensors, metrics = results[instruction.metadata.dst_node_id]
        content = RecordDict({"arrays": to_record(tensors), "metrics": MetricRecord(dict(metrics))})
        replies.append(Message(content, reply_to=instruction))
    arrays, _ = strategy.aggregate_train(server_round, replies)
    assert arrays is not None
    return from_record(arrays)


def run_flower(strategy, initial: Mapping[str, torch.Tensor], rounds) -> list[Tensors]:
    """Rounds 1, 2, ... as Strategy.start numbers them; `rounds` lists each round's results.
    Returns the global tensors after every round."""
    out = []
    current = dict(initial)
    with task_identity():
        for server_round, results in enumerate(rounds, start=1):
            current = flower_round(strategy, server_round, current, results)
            out.append(current)
    return out


# -- the same client results for a Flower strategy and for our server half ------------------
ROUNDS = 3
EXAMPLES = {3: 12, 7: 45, 11: 130}  # node id -> example count


class Weights(nn.Module):
    """Parameters only (no buffers), with the shapes of a small conv net, a 0-d one included."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)
        self.fc = nn.Linear(8, 5)
        self.scale = nn.Parameter(torch.tensor(1.5))


def weights_model() -> Weights:
    torch.manual_seed(0)
    return Weights()


def client_results(initial: dict[str, torch.Tensor], rounds: int = ROUNDS):
    """Per round, per node: (tensors sent back, loss). Fixed by (round, node) only, so the
    very same results can go to Flower and to us."""
    out = []
    for r in range(1, rounds + 1):
        results = {}
        for node in EXAMPLES:
            g = torch.Generator().manual_seed(1000 * r + node)
            tensors = {k: v + 0.3 * torch.randn(v.shape, generator=g) + 0.02 * node for k, v in initial.items()}
            loss = 0.2 + 1.5 * torch.rand((), generator=g).item()
            results[node] = (tensors, loss)
        out.append(results)
    return out


def for_flower(rounds):
    return [
        {n: (t, {"num-examples": EXAMPLES[n], "train_loss": loss}) for n, (t, loss) in results.items()}
        for results in rounds
    ]


def run_ours(server: ServerHalf, model: nn.Module, rounds) -> list[dict[str, torch.Tensor]]:
    current = server.initial_message(model)
    out = []
    for results in rounds:
        replies = {
            n: FedcareMessage({k: v.clone() for k, v in t.items()},
                       {NUM_EXAMPLES: float(EXAMPLES[n]), TRAIN_LOSS: loss, LOSS_AT_GLOBAL: loss})
            for n, (t, loss) in results.items()
        }
        current = server.aggregate(current, replies)
        out.append(current.tensors)
    return out

"""FedAvg: the server's average by hand (by example count or uniform), independent of the replies'
arrival order; after a round every client holds the global model."""

import torch

from fedcare.algorithms import fedavg
from fedcare.algorithms.base import ServerHalf
from fedcare.algorithms.messages import Message
from fedcare.algorithms.training import TrainSettings
from fedcare.runtime.federation import Federation

from support.tiny import tiny_data, tiny_model


SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)


def _reply(value: float, n: int) -> Message:
    return Message({"w": torch.full((2,), value), "count": torch.tensor(n)}, {"num_examples": float(n), "train_loss": 0.0})


def test_weighted_average_matches_hand_computation():
    current = Message({"w": torch.zeros(2), "count": torch.tensor(0)})
    replies = {2: _reply(1.0, 10), 1: _reply(4.0, 30)}
    out = ServerHalf(weighting="examples").aggregate(current, replies)
    assert torch.allclose(out.tensors["w"], torch.full((2,), (1.0 * 10 + 4.0 * 30) / 40))
    assert out.tensors["count"].dtype == torch.int64 and out.tensors["count"].item() == 25  # (10*10+30*30)/40
    uniform = ServerHalf(weighting="uniform").aggregate(current, replies)
    assert torch.allclose(uniform.tensors["w"], torch.full((2,), 2.5))


def test_aggregation_does_not_depend_on_arrival_order():
    g = torch.Generator().manual_seed(0)
    replies = {c: Message({"w": torch.randn(1000, generator=g)}, {"num_examples": float(c + 1)}) for c in range(7)}
    current = Message({"w": torch.zeros(1000)})
    forward = ServerHalf().aggregate(current, replies)
    backward = ServerHalf().aggregate(current, dict(reversed(list(replies.items()))))
    assert torch.equal(forward.tensors["w"], backward.tensors["w"])


def test_fedavg_round_leaves_every_client_with_the_global_model():
    federation = Federation(tiny_model(), fedavg(SETTINGS), seed=1)
    train = {1: tiny_data(1), 2: tiny_data(2, n=20)}
    federation.run_round("p", 1, train)
    a = {k: v.clone() for k, v in federation.personal_model(1).state_dict().items()}
    b = federation.personal_model(2).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)

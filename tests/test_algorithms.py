import torch

from fedcare.algorithms import fedavg, local, pfdl
from fedcare.algorithms.base import ServerHalf
from fedcare.algorithms.messages import Message
from fedcare.algorithms.training import Randomness, TrainSettings
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


def test_pfdl_finetuning_leaves_frozen_conv_blocks_untouched():
    algorithm = pfdl(SETTINGS, finetune_epochs=2, lr_factor=10)
    model = tiny_model()
    message = algorithm.server.initial_message(model)
    state = algorithm.client.init_state(model)
    new_state = algorithm.client.after_aggregation(model, message, state, tiny_data(3), Randomness(0, "t", 1, 1))
    after = model.state_dict()
    for name, tensor in message.tensors.items():  # conv weights and BatchNorm statistics alike
        assert torch.equal(after[name], tensor), name
    assert any(not torch.equal(new_state[k], state[k]) for k in state)  # the private head did train
    assert all(p.requires_grad for p in model.parameters())  # unfrozen afterwards
    assert model.training


def test_pfdl_finetune_runs_at_reduced_learning_rate():
    model = tiny_model()
    data = tiny_data(3)
    changes = {}
    for factor in (1.0, 100.0):
        algorithm = pfdl(SETTINGS, finetune_epochs=1, lr_factor=factor)
        message = algorithm.server.initial_message(model)
        state = algorithm.client.init_state(model)
        new = algorithm.client.after_aggregation(model, message, state, data, Randomness(0, "t", 1, 1))
        changes[factor] = sum((new[k] - state[k]).abs().sum().item() for k in state if new[k].is_floating_point()
                              and "running" not in k)
    assert changes[100.0] < changes[1.0] / 10


def test_fedavg_round_leaves_every_client_with_the_global_model():
    federation = Federation(tiny_model(), fedavg(SETTINGS), seed=1)
    train = {1: tiny_data(1), 2: tiny_data(2, n=20)}
    federation.run_round("p", 1, train)
    a = {k: v.clone() for k, v in federation.personal_model(1).state_dict().items()}
    b = federation.personal_model(2).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_local_models_never_communicate():
    federation = Federation(tiny_model(), local(SETTINGS), seed=1)
    federation.run_round("p", 1, {1: tiny_data(1), 2: tiny_data(2)})
    assert federation.global_message.tensors == {}
    w1 = federation.states[1]["classifier.1.weight"]
    w2 = federation.states[2]["classifier.1.weight"]
    assert not torch.equal(w1, w2)

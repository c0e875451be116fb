"""Invariant 3: which tensors leave a client is declared by rule and checked on real messages."""

import pytest
import torch
from torch import nn

from fedcare.algorithms import centralized, fedavg, local, pfdl
from fedcare.algorithms.fedbn import fedbn
from fedcare.algorithms.feddyn import feddyn, gradient_key
from fedcare.algorithms.fedper import fedper
from fedcare.algorithms.fedprox import fedprox
from fedcare.algorithms.fedrep import fedrep
from fedcare.algorithms.split import SHARE_ALL, SHARE_NOTHING, ParameterSplit, load_tensors
from fedcare.algorithms.training import Randomness, TrainSettings
from fedcare.models.pain_cnn import PainCNN

from support.tiny import BATCHNORM_PREFIXES, fit_once, parameter_names, tiny_data, tiny_model


SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)


def test_pfdl_split_shares_exactly_the_conv_blocks_with_their_batchnorm():
    model = PainCNN(32)
    split = ParameterSplit(("features",))
    shared = split.shared_keys(model)
    assert shared and all(k.startswith("features.") for k in shared)
    assert "features.0.1.running_mean" in shared  # conv-block BatchNorm statistics travel too
    assert set(split.private_keys(model)) == {k for k in model.state_dict() if k.startswith("classifier.")}


def test_batchnorm_is_found_by_type_not_by_name():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.Linear(2, 2)  # named "bn" but not a BatchNorm
            self.norm = nn.BatchNorm1d(2)  # a BatchNorm without "bn" in its name

    split = ParameterSplit(("",), (nn.modules.batchnorm._BatchNorm,))
    model = Odd()
    assert set(split.shared_keys(model)) == {"bn.weight", "bn.bias"}
    assert set(split.private_keys(model)) == {"norm.weight", "norm.bias", "norm.running_mean", "norm.running_var",
                                              "norm.num_batches_tracked"}


@pytest.mark.parametrize(
    "algorithm, expected",
    [
        (fedavg(SETTINGS), lambda m: set(m.state_dict())),
        (centralized(SETTINGS), lambda m: set(m.state_dict())),
        (pfdl(SETTINGS, finetune_epochs=1), lambda m: {k for k in m.state_dict() if k.startswith("features.")}),
        (local(SETTINGS), lambda m: set()),
    ],
    ids=["fedavg", "centralized", "pfdl", "local"],
)
def test_outgoing_message_holds_exactly_the_declared_shared_tensors(algorithm, expected):
    model = tiny_model()
    message = algorithm.server.initial_message(model)
    state = algorithm.client.init_state(model)
    reply, new_state = algorithm.client.fit(model, message, state, tiny_data(1), Randomness(0, "t", 1, 1))
    assert set(reply.tensors) == expected(model)
    assert set(reply.scalars) == {"num_examples", "train_loss"}
    # what does not leave the client is exactly its private state
    assert set(new_state) == set(model.state_dict()) - expected(model)


def test_load_tensors_rejects_unknown_names():
    with pytest.raises(KeyError, match="not in the model"):
        load_tensors(tiny_model(), {"nope": torch.zeros(1)})


def test_share_all_and_nothing_partition_the_state():
    model = tiny_model()
    assert set(SHARE_ALL.shared_keys(model)) == set(model.state_dict())
    assert SHARE_NOTHING.shared_keys(model) == []


def test_private_paths_keep_a_head_on_the_client():
    model = PainCNN(32)
    split = ParameterSplit(private_paths=("classifier",))
    assert set(split.shared_keys(model)) == {k for k in model.state_dict() if k.startswith("features.")}
    assert set(split.private_keys(model)) == {k for k in model.state_dict() if k.startswith("classifier.")}
    assert ParameterSplit(private_paths=("classifier.1",)).shared_keys(model).count("classifier.4.weight") == 1
    with pytest.raises(ValueError, match="whole model"):
        ParameterSplit(private_paths=("",))


# -- the personalized algorithms: each declares what it shares and keeps ----------------------------
@pytest.mark.parametrize(
    "make, shared, private",
    [
        (lambda: fedprox(SETTINGS, mu=0.1), lambda m: set(m.state_dict()), lambda m: set()),
        (lambda: fedprox(SETTINGS, mu=0.1, squared=False), lambda m: set(m.state_dict()), lambda m: set()),
        (lambda: fedbn(SETTINGS), lambda m: {k for k in m.state_dict() if not k.startswith(BATCHNORM_PREFIXES)},
         lambda m: {k for k in m.state_dict() if k.startswith(BATCHNORM_PREFIXES)}),
        (lambda: fedper(SETTINGS), lambda m: {k for k in m.state_dict() if k.startswith("features.")},
         lambda m: {k for k in m.state_dict() if k.startswith("classifier.")}),
        (lambda: fedrep(SETTINGS), lambda m: {k for k in m.state_dict() if k.startswith("features.")},
         lambda m: {k for k in m.state_dict() if k.startswith("classifier.")}),
        (lambda: feddyn(SETTINGS), lambda m: set(m.state_dict()), lambda m: {gradient_key(n) for n in parameter_names(m)}),
    ],
    ids=["fedprox", "fedprox-unsquared", "fedbn", "fedper", "fedrep", "feddyn"],
)
def test_a_personalized_algorithms_message_holds_exactly_its_shared_tensors(make, shared, private):
    algorithm = make()
    model, message, _, reply, new_state = fit_once(algorithm)
    assert set(message.tensors) == shared(model)  # the server sends the same set
    assert set(reply.tensors) == shared(model)
    assert set(reply.scalars) == {"num_examples", "train_loss"}
    assert set(new_state) == private(model)
    assert all(torch.isfinite(t.double()).all() for t in reply.tensors.values())

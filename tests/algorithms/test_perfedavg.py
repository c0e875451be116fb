"""Per-FedAvg / HF-MAML: the finite-difference Hessian-vector product, the meta step against a
hand-composed formula, the first-order variant, what leaves a client, and determinism."""

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call

from fedcare.algorithms.perfedavg import (
    BATCH_PURPOSE,
    adapt,
    finite_difference_hvp,
    perfedavg,
    sample_step_batches,
)
from fedcare.algorithms.training import ClientData, Randomness, TrainSettings
from fedcare.runtime.federation import Federation
from fedcare.tasks import BINARY

from support.tiny import tiny_data, tiny_model


SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)
LOSS = BINARY.batch_loss(None)  # the binary task's loss, whatever the data


class SmoothMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 6), nn.Tanh())
        self.head = nn.Linear(6, 1)

    def forward(self, x):
        return self.head(self.body(x)).squeeze(1)


def _mlp_and_data(seed=0, n=30):
    torch.manual_seed(seed)
    model = SmoothMLP().double()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(n, 5, generator=g, dtype=torch.float64)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).double()
    return model, ClientData(x, y)


def _exact_hvp(model, params, vector, batch):
    names = list(params)

    def loss(*p):
        return BINARY.loss(functional_call(model, dict(zip(names, p)), (batch.x,)), batch.y)

    _, hv = torch.autograd.functional.hvp(loss, tuple(params[k] for k in names), tuple(vector))
    return list(hv)


def _rel_error(approx, exact):
    num = sum((a - e).pow(2).sum() for a, e in zip(approx, exact)).sqrt()
    den = sum(e.pow(2).sum() for e in exact).sqrt()
    return float(num / den)


def _gradient_vector(model, params, batch):
    leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    loss = BINARY.loss(functional_call(model, leaves, (batch.x,)), batch.y)
    return [g.detach() for g in torch.autograd.grad(loss, list(leaves.values()))]


def _unit_random_vector(params):
    g = torch.Generator().manual_seed(7)
    v = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in params.values()]
    norm = sum(t.pow(2).sum() for t in v).sqrt()
    return [t / norm for t in v]


@pytest.mark.parametrize("kind", ["gradient", "unit-random"])
def test_finite_difference_hvp_matches_torch_exact_hvp_and_degrades_with_large_delta(kind):
    model, data = _mlp_and_data(n=30)
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    d1, d2 = ClientData(data.x[:10], data.y[:10]), ClientData(data.x[10:], data.y[10:])
    # as in HF-MAML: the vector is a gradient on another batch (D′), the Hessian is on D″
    vector = _gradient_vector(model, params, d1) if kind == "gradient" else _unit_random_vector(params)
    exact = _exact_hvp(model, params, vector, d2)
    assert sum(e.abs().sum() for e in exact) > 1e-2  # a nonzero reference
    small = _rel_error(finite_difference_hvp(model, params, vector, d2, delta=1e-3, loss=LOSS), exact)
    large = _rel_error(finite_difference_hvp(model, params, vector, d2, delta=1.0, loss=LOSS), exact)
    assert small < 1e-5
    assert large > 1000 * small and large > 1e-3  # the O(δ²) truncation error shows up
    # the model itself is untouched
    assert all(torch.equal(p, params[k]) for k, p in model.named_parameters())


def test_finite_difference_hvp_leaves_batchnorm_statistics_untouched():
    model = tiny_model().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    vector = [torch.ones_like(p) for p in params.values()]
    finite_difference_hvp(model, params, vector, tiny_data(1, n=8), delta=1e-3, loss=LOSS)
    after = model.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before)


def _double_tiny(seed=0):
    return tiny_model(seed).double().train()


def _float_data(seed, n):
    d = tiny_data(seed, n=n)
    return ClientData(d.x.double() / 255.0, d.y.double())


def _grad(model, batch):
    """∇f on `batch` with the model's current weights (a plain forward/backward, train mode)."""
    loss = BINARY.loss(model(batch.x), batch.y)
    return torch.autograd.grad(loss, list(model.parameters()))


def _set(model, tensors):
    with torch.no_grad():
        for p, t in zip(model.parameters(), tensors):
            p.copy_(t)


@pytest.mark.parametrize("first_order", [False, True], ids=["hf-maml", "fo-maml"])
def test_one_client_step_equals_the_hand_composed_formula(first_order):
    alpha, beta, delta = 0.01, 0.1, 1e-3
    model, data = _double_tiny(), _float_data(3, n=40)
    start = copy.deepcopy(model)
    algorithm = perfedavg(SETTINGS, alpha, beta, delta, steps_per_round=1, first_order=first_order)
    rng = Randomness(5, "t", 1, 1)
    message = algorithm.server.initial_message(model)
    reply, _ = algorithm.client.fit(model, message, algorithm.client.init_state(model), data, rng)

    d, d1, d2 = sample_step_batches(data, SETTINGS.batch_size, rng.torch(BATCH_PURPOSE))
    assert len(d) == len(d1) == len(d2) == SETTINGS.batch_size  # n >= 3B: three full batches
    hand = copy.deepcopy(start)
    w = [p.detach().clone() for p in hand.parameters()]
    grad_d = _grad(hand, d)  # forward at w on D
    w_tilde = [wi - alpha * gi for wi, gi in zip(w, grad_d)]
    _set(hand, w_tilde)
    g = _grad(hand, d1)  # forward at w̃ on D′
    expected_buffers = {k: b.clone() for k, b in hand.named_buffers()}
    if first_order:
        expected = [wi - beta * gi for wi, gi in zip(w, g)]
    else:
        probe = copy.deepcopy(start)
        _set(probe, [wi + delta * gi for wi, gi in zip(w, g)])
        plus = _grad(probe, d2)
        _set(probe, [wi - delta * gi for wi, gi in zip(w, g)])
        minus = _grad(probe, d2)
        hg = [(p - m) / (2 * delta) for p, m in zip(plus, minus)]
        expected = [wi - beta * (gi - alpha * hi) for wi, gi, hi in zip(w, g, hg)]
        # the Hessian term matters: HF-MAML differs from FO-MAML here
        assert max((e - (wi - beta * gi)).abs().max().item() for e, wi, gi in zip(expected, w, g)) > 1e-6

    names = [k for k, _ in start.named_parameters()]
    for name, e in zip(names, expected):
        assert torch.allclose(reply.tensors[name], e, rtol=0, atol=1e-6), name
    assert any(not torch.equal(reply.tensors[n], start.state_dict()[n]) for n in names)
    # BatchNorm statistics: updated by the forwards on D and D′ only, never by the ± δ probes
    for name, b in expected_buffers.items():
        assert torch.allclose(reply.tensors[name].to(b.dtype), b, rtol=0, atol=1e-12), name


@pytest.mark.parametrize(
    "head_paths, expected",
    [
        (None, lambda m: set(m.state_dict())),
        (("classifier",), lambda m: {k for k in m.state_dict() if k.startswith("features.")}),
    ],
    ids=["share-all", "private-head"],
)
def test_outgoing_message_holds_exactly_the_declared_shared_tensors(head_paths, expected):
    algorithm = perfedavg(SETTINGS, steps_per_round=2, head_paths=head_paths)
    model = tiny_model()
    message = algorithm.server.initial_message(model)
    state = algorithm.client.init_state(model)
    assert set(message.tensors) == expected(model)
    reply, new_state = algorithm.client.fit(model, message, state, tiny_data(1), Randomness(0, "t", 1, 1))
    assert set(reply.tensors) == expected(model)
    assert set(reply.scalars) == {"num_examples", "train_loss"}
    assert set(new_state) == set(model.state_dict()) - expected(model)
    if head_paths:  # the private head is meta-trained too, and kept by the client
        assert any(not torch.equal(new_state[k], state[k]) for k in state if new_state[k].is_floating_point())


def test_private_head_stays_per_client_in_a_federation():
    federation = Federation(tiny_model(), perfedavg(SETTINGS, steps_per_round=2, head_paths=("classifier",)), seed=1)
    federation.run_round("p", 1, {1: tiny_data(1), 2: tiny_data(2)})
    a = {k: v.clone() for k, v in federation.personal_model(1).state_dict().items()}
    b = federation.personal_model(2).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a if k.startswith("features."))
    assert not torch.equal(a["classifier.1.weight"], b["classifier.1.weight"])


def _fit(seed, rnd, data):
    algorithm = perfedavg(SETTINGS, steps_per_round=3)
    model = tiny_model()
    message = algorithm.server.initial_message(model)
    reply, _ = algorithm.client.fit(model, message, algorithm.client.init_state(model), data, Randomness(seed, "t", 1, rnd))
    return reply


def test_same_seed_same_result_and_another_round_other_batches():
    data = tiny_data(4, n=40)
    first, again = _fit(0, 1, data), _fit(0, 1, data)
    assert all(torch.equal(first.tensors[k], again.tensors[k]) for k in first.tensors)
    assert first.scalars == again.scalars
    other = _fit(0, 2, data)
    assert any(not torch.equal(first.tensors[k], other.tensors[k]) for k in first.tensors)
    b1 = sample_step_batches(data, 8, Randomness(0, "t", 1, 1).torch(BATCH_PURPOSE))
    b2 = sample_step_batches(data, 8, Randomness(0, "t", 1, 2).torch(BATCH_PURPOSE))
    assert not torch.equal(b1[0].x, b2[0].x)


def test_step_batches_are_disjoint_when_the_client_has_enough_data():
    data = ClientData(torch.arange(30).double().unsqueeze(1), torch.zeros(30))
    d, d1, d2 = sample_step_batches(data, 8, torch.Generator().manual_seed(0))
    ids = [set(b.x.squeeze(1).long().tolist()) for b in (d, d1, d2)]
    assert all(len(s) == 8 for s in ids)
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    small = sample_step_batches(ClientData(data.x[:10], data.y[:10]), 8, torch.Generator().manual_seed(0))
    assert [len(b) for b in small] == [8, 8, 8]  # fewer than 3B: independent draws of B


def test_adapt_takes_plain_sgd_steps_at_alpha():
    model, data = _mlp_and_data(n=12)
    expected = copy.deepcopy(model)
    for _ in range(2):  # full-batch steps, so the batch order does not matter
        grads = _grad(expected, data)
        _set(expected, [p.detach() - 0.05 * g for p, g in zip(expected.parameters(), grads)])
    model.eval()
    settings = TrainSettings(lr=0.05, batch_size=len(data))
    out = adapt(model, data, settings, steps=2, generator=torch.Generator().manual_seed(0))
    assert out is model and not model.training  # mode restored
    for p, e in zip(model.parameters(), expected.parameters()):
        assert torch.allclose(p, e, rtol=0, atol=1e-12)


def test_a_meta_step_that_overflows_the_weights_is_the_clients_divergence():
    """Per-FedAvg steps outside the training loop: its fit checks its weights as the loop does,
    so a diverged client fails by name instead of sending NaN weights on."""
    from fedcare.algorithms.training import TrainingDiverged

    fed = Federation(tiny_model(), perfedavg(TrainSettings(lr=1e30, batch_size=8, local_epochs=1), alpha=1e30, beta=1e30),
                     seed=0)
    with pytest.raises(TrainingDiverged, match=r"the weights after its meta steps are not finite .* \(client 1\)$"):
        fed.run_round("train", 1, {1: tiny_data(1)})

"""FedProx, FedBN, FedPer, FedRep and FedDyn: what leaves a client, and hand-checked behaviour."""

import io

import pytest
import torch
from torch import nn

from fedcare.algorithms import fedavg
from fedcare.algorithms.fedbn import fedbn
from fedcare.algorithms.feddyn import FedDynServer, feddyn, gradient_key
from fedcare.algorithms.fedper import fedper
from fedcare.algorithms.fedprox import fedprox, proximal_term, trainable_pairs
from fedcare.algorithms.fedrep import fedrep
from fedcare.algorithms.messages import Message
from fedcare.algorithms.training import ClientData, Randomness, TrainSettings
from fedcare.runtime.federation import Federation

from support.tiny import tiny_data, tiny_model

SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)
RNG = Randomness(0, "t", 1, 1)
BN_PREFIXES = ("features.1.", "classifier.2.")  # TinyNet's two BatchNorm layers


def _fit(algorithm, model=None, data=None, rng=RNG):
    model = model if model is not None else tiny_model()
    message = algorithm.server.initial_message(model)
    state = algorithm.client.init_state(model)
    reply, new_state = algorithm.client.fit(model, message, state, data or tiny_data(1), rng)
    return model, message, state, reply, new_state


def _distance(tensors, reference, names):
    return sum(float((tensors[n].double() - reference[n].double()).pow(2).sum()) for n in names) ** 0.5


def _keys(model):
    return set(model.state_dict())


def _params(model):
    return [n for n, _ in model.named_parameters()]


# --- invariant 3: the outgoing message holds exactly the declared shared tensors ------------------------

@pytest.mark.parametrize(
    "make, shared, private",
    [
        (lambda: fedprox(SETTINGS, mu=0.1), lambda m: _keys(m), lambda m: set()),
        (lambda: fedprox(SETTINGS, mu=0.1, squared=False), lambda m: _keys(m), lambda m: set()),
        (lambda: fedbn(SETTINGS), lambda m: {k for k in _keys(m) if not k.startswith(BN_PREFIXES)},
         lambda m: {k for k in _keys(m) if k.startswith(BN_PREFIXES)}),
        (lambda: fedper(SETTINGS), lambda m: {k for k in _keys(m) if k.startswith("features.")},
         lambda m: {k for k in _keys(m) if k.startswith("classifier.")}),
        (lambda: fedrep(SETTINGS), lambda m: {k for k in _keys(m) if k.startswith("features.")},
         lambda m: {k for k in _keys(m) if k.startswith("classifier.")}),
        (lambda: feddyn(SETTINGS), lambda m: _keys(m), lambda m: {gradient_key(n) for n in _params(m)}),
    ],
    ids=["fedprox", "fedprox-unsquared", "fedbn", "fedper", "fedrep", "feddyn"],
)
def test_outgoing_message_holds_exactly_the_declared_shared_tensors(make, shared, private):
    algorithm = make()
    model, message, _, reply, new_state = _fit(algorithm)
    assert set(message.tensors) == shared(model)  # the server sends the same set
    assert set(reply.tensors) == shared(model)
    assert set(reply.scalars) == {"num_examples", "train_loss"}
    assert set(new_state) == private(model)
    assert all(torch.isfinite(t.double()).all() for t in reply.tensors.values())


# --- FedBN -----------------------------------------------------------------------------------------------

class NamedToMislead(nn.Module):
    """A Linear called `bn` (shared) and a BatchNorm called `norm` (private)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.bn = nn.Linear(64, 4)
        self.norm = nn.BatchNorm1d(4)
        self.out = nn.Linear(4, 1)

    def forward(self, x):
        return self.out(torch.relu(self.norm(self.bn(x.flatten(1))))).squeeze(1)


def test_fedbn_finds_batchnorm_by_type_never_by_name():
    _, _, _, reply, state = _fit(fedbn(SETTINGS), model=NamedToMislead())
    assert set(reply.tensors) == {"bn.weight", "bn.bias", "out.weight", "out.bias"}
    assert set(state) == {"norm.weight", "norm.bias", "norm.running_mean", "norm.running_var", "norm.num_batches_tracked"}


def test_fedbn_keeps_batchnorm_statistics_on_each_client_across_rounds():
    data = {1: tiny_data(1), 2: tiny_data(2, n=24)}
    federation = Federation(tiny_model(), fedbn(SETTINGS), seed=0)
    for rnd in (1, 2):
        federation.run_round("p", rnd, data)
        assert not any(k.startswith(BN_PREFIXES) for k in federation.global_message.tensors)
    s1, s2 = federation.states[1], federation.states[2]
    assert not torch.equal(s1["features.1.running_mean"], s2["features.1.running_mean"])
    assert s1["features.1.num_batches_tracked"].item() == 2 * 5  # 40 examples / batch 8, two rounds: own count
    assert s2["features.1.num_batches_tracked"].item() == 2 * 3
    m1 = {k: v.clone() for k, v in federation.personal_model(1).state_dict().items()}
    m2 = federation.personal_model(2).state_dict()
    assert all(torch.equal(m1[k], m2[k]) for k in federation.global_message.tensors)  # shared parts agree


def test_fedbn_averages_uniformly_by_default():
    server = fedbn(SETTINGS).server
    replies = {1: Message({"w": torch.tensor([1.0])}, {"num_examples": 1.0}),
               2: Message({"w": torch.tensor([4.0])}, {"num_examples": 3.0})}
    assert server.aggregate(Message({"w": torch.zeros(1)}), replies).tensors["w"].item() == 2.5
    weighted = fedbn(SETTINGS, weighting="examples").server
    assert weighted.aggregate(Message({"w": torch.zeros(1)}), replies).tensors["w"].item() == pytest.approx(3.25)


# --- FedProx ---------------------------------------------------------------------------------------------

def test_proximal_term_matches_hand_computation():
    w = nn.Parameter(torch.tensor([3.0, 0.0]))
    v = nn.Parameter(torch.tensor([[4.0]]))
    pairs = [(w, torch.zeros(2)), (v, torch.zeros(1, 1))]  # one norm over both tensors: sqrt(9 + 16) = 5
    assert proximal_term(pairs, mu=0.1, squared=True).item() == pytest.approx(0.05 * 25)
    assert proximal_term(pairs, mu=0.1, squared=False).item() == pytest.approx(0.05 * 5)
    proximal_term(pairs, mu=0.1, squared=True).backward()
    assert torch.allclose(w.grad, 0.1 * torch.tensor([3.0, 0.0]))  # μ (w − w_g)
    w.grad = None
    proximal_term(pairs, mu=0.1, squared=False).backward()
    assert torch.allclose(w.grad, 0.05 * torch.tensor([3.0, 0.0]) / 5)  # (μ/2) (w − w_g) / ‖w − w_g‖
    assert proximal_term([(w, w.detach().clone())], mu=0.1, squared=False) is None  # no NaN at zero


def test_proximal_term_covers_trainable_parameters_only():
    model = tiny_model()
    model.features[0].bias.requires_grad_(False)
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    pairs = trainable_pairs(model, model.state_dict())
    assert len(pairs) == len(names)
    assert not any(p is model.features[0].bias for p, _ in pairs)
    assert all(isinstance(p, nn.Parameter) for p, _ in pairs)  # no running statistics


def test_fedprox_with_mu_zero_is_fedavgs_client_bit_for_bit():
    _, _, _, prox_reply, prox_state = _fit(fedprox(SETTINGS, mu=0.0), data=tiny_data(4))
    _, _, _, avg_reply, avg_state = _fit(fedavg(SETTINGS), data=tiny_data(4))
    assert prox_reply.scalars == avg_reply.scalars
    assert set(prox_reply.tensors) == set(avg_reply.tensors)
    assert all(torch.equal(prox_reply.tensors[k], avg_reply.tensors[k]) for k in avg_reply.tensors)
    assert prox_state == avg_state == {}


def test_larger_mu_keeps_the_client_closer_to_the_global_model():
    settings = TrainSettings(lr=0.05, batch_size=8, local_epochs=4)
    distances = {}
    for mu in (0.0, 1.0, 10.0):  # lr * mu < 1: the proximal pull is a contraction
        model, message, _, reply, _ = _fit(fedprox(settings, mu=mu), data=tiny_data(5))
        distances[mu] = _distance(reply.tensors, message.tensors, _params(model))
    assert distances[10.0] < distances[1.0] < distances[0.0]
    assert distances[10.0] < 0.7 * distances[0.0]


def test_squared_and_unsquared_proximal_terms_differ():
    settings = TrainSettings(lr=0.05, batch_size=8, local_epochs=4)
    _, message, _, squared, _ = _fit(fedprox(settings, mu=1.0, squared=True), data=tiny_data(5))
    model, _, _, unsquared, _ = _fit(fedprox(settings, mu=1.0, squared=False), data=tiny_data(5))
    assert any(not torch.equal(squared.tensors[n], unsquared.tensors[n]) for n in _params(model))
    assert all(torch.isfinite(unsquared.tensors[n]).all() for n in _params(model))
    # the pulls: μ‖d‖ (squared) against a constant μ/2 (unsquared); within ‖d‖ < 1/2 the unsquared pulls harder
    d_sq = _distance(squared.tensors, message.tensors, _params(model))
    d_un = _distance(unsquared.tensors, message.tensors, _params(model))
    assert d_un < d_sq < 0.5


def test_fedprox_pulls_towards_the_weights_received_this_round():
    # Round 2 of a federation starts from the averaged model: FedProx with a huge pull stays there.
    settings = TrainSettings(lr=0.05, batch_size=8, local_epochs=3)
    data = {1: tiny_data(1), 2: tiny_data(2)}
    near = Federation(tiny_model(), fedprox(settings, mu=15.0), seed=0)
    far = Federation(tiny_model(), fedprox(settings, mu=0.0), seed=0)
    for federation in (near, far):
        federation.run_round("p", 1, data)
    seen = {}
    for label, federation in (("near", near), ("far", far)):
        start = federation.global_message.clone()
        reply, _ = federation.algorithm.client.fit(federation.model, start, {}, data[1], Randomness(0, "p", 1, 2))
        seen[label] = _distance(reply.tensors, start.tensors, _params(federation.model))
    assert seen["near"] < seen["far"]


# --- FedPer ----------------------------------------------------------------------------------------------

def _record_fits(federation):
    """Wrap the client's fit to record (incoming message, incoming state, reply, new state) per call."""
    calls = []
    client = federation.algorithm.client
    original = client.fit

    def fit(model, message, state, data, rng):
        incoming = message.clone(), {k: v.clone() for k, v in state.items()}
        reply, new_state = original(model, message, state, data, rng)
        calls.append((rng.client, rng.round, *incoming, reply.clone(), {k: v.clone() for k, v in new_state.items()}))
        return reply, new_state

    client.fit = fit
    return calls


def test_fedper_heads_stay_private_and_persist_across_rounds():
    data = {1: tiny_data(1), 2: tiny_data(2, n=24)}
    federation = Federation(tiny_model(), fedper(SETTINGS), seed=0)
    initial_head = {k: v.clone() for k, v in federation.state_of(1).items()}
    calls = _record_fits(federation)
    federation.run_round("p", 1, data)
    after_one = {c: {k: v.clone() for k, v in federation.states[c].items()} for c in (1, 2)}
    assert set(after_one[1]) == {k for k in _keys(federation.model) if k.startswith("classifier.")}
    assert not any(k.startswith("classifier.") for k in federation.global_message.tensors)
    assert any(not torch.equal(after_one[1][k], after_one[2][k]) for k in after_one[1])  # personal heads
    assert any(not torch.equal(after_one[1][k], initial_head[k]) for k in initial_head)  # the head trained

    # the global body is the example-weighted average of the bodies sent
    replies = {c: r for c, rnd, _, _, r, _ in calls if rnd == 1}
    w = federation.global_message.tensors["features.0.weight"]
    expected = (40 * replies[1].tensors["features.0.weight"].double() + 24 * replies[2].tensors["features.0.weight"].double()) / 64
    assert torch.allclose(w.double(), expected, atol=1e-7)

    federation.run_round("p", 2, data)
    for c in (1, 2):  # round 2 started from this client's own round-1 head
        (_, _, message, state, _, _), = [call for call in calls if call[0] == c and call[1] == 2]
        assert set(state) == set(after_one[c])
        assert all(torch.equal(state[k], after_one[c][k]) for k in state)
        assert not any(k.startswith("classifier.") for k in message.tensors)
    personal = federation.personal_model(1).state_dict()
    assert all(torch.equal(personal[k], federation.states[1][k]) for k in federation.states[1])


def test_fedper_rejects_a_head_path_the_model_lacks():
    with pytest.raises(ValueError, match="not modules"):
        _fit(fedper(SETTINGS, head_paths=("head",)))
    with pytest.raises(ValueError):
        fedper(SETTINGS, head_paths=())


# --- FedRep ----------------------------------------------------------------------------------------------

def _head(state):
    return {k: v for k, v in state.items() if k.startswith("classifier.")}


def test_fedrep_head_epochs_leave_the_body_untouched_batchnorm_statistics_included():
    model, message, state, reply, new_state = _fit(fedrep(SETTINGS, head_epochs=2, body_epochs=0))
    for name, tensor in message.tensors.items():  # conv weights and the body's BatchNorm statistics
        assert torch.equal(reply.tensors[name], tensor), name
    assert any(not torch.equal(new_state[k], state[k]) for k in state if new_state[k].is_floating_point())
    assert not torch.equal(new_state["classifier.2.running_mean"], state["classifier.2.running_mean"])
    assert all(p.requires_grad for p in model.parameters()) and model.training


def test_fedrep_body_epochs_leave_the_head_untouched():
    model, message, state, reply, new_state = _fit(fedrep(SETTINGS, head_epochs=0, body_epochs=2))
    assert set(new_state) == set(state)
    assert all(torch.equal(new_state[k], state[k]) for k in state)  # head weights and head BatchNorm statistics
    assert all(not torch.equal(reply.tensors[k], message.tensors[k]) for k in ("features.0.weight", "features.1.running_mean"))
    assert all(p.requires_grad for p in model.parameters()) and model.training


def test_fedrep_trains_the_head_first_then_the_body():
    data = tiny_data(7)
    _, _, _, _, head_state = _fit(fedrep(SETTINGS, head_epochs=1, body_epochs=0), data=data)
    _, _, _, body_only, _ = _fit(fedrep(SETTINGS, head_epochs=0, body_epochs=1), data=data)
    _, _, _, both, both_state = _fit(fedrep(SETTINGS, head_epochs=1, body_epochs=1), data=data)
    # the head after the round is the head after the head phase: frozen while the body trains
    assert all(torch.equal(both_state[k], head_state[k]) for k in head_state)
    # the body trained on top of the new head, so it differs from a body trained on the old one
    assert any(not torch.equal(both.tensors[k], body_only.tensors[k]) for k in both.tensors if both.tensors[k].is_floating_point())


def test_fedrep_frozen_part_runs_in_inference_mode():
    modes = {}
    model = tiny_model()
    hooks = [model.features[1].register_forward_pre_hook(lambda m, i: modes.setdefault("body", set()).add(m.training)),
             model.classifier[2].register_forward_pre_hook(lambda m, i: modes.setdefault("head", set()).add(m.training))]
    _fit(fedrep(SETTINGS, head_epochs=1, body_epochs=0), model=model)
    assert modes == {"body": {False}, "head": {True}}
    modes.clear()
    _fit(fedrep(SETTINGS, head_epochs=0, body_epochs=1), model=model)
    assert modes == {"body": {True}, "head": {False}}
    for h in hooks:
        h.remove()


def test_fedrep_sends_only_the_body_through_a_federation():
    data = {1: tiny_data(1), 2: tiny_data(2)}
    federation = Federation(tiny_model(), fedrep(SETTINGS), seed=0)
    calls = _record_fits(federation)
    federation.run_round("p", 1, data)
    federation.run_round("p", 2, data)
    for _, _, message, state, reply, new_state in calls:
        assert all(k.startswith("features.") for k in reply.tensors) and set(reply.tensors) == set(message.tensors)
        assert all(k.startswith("classifier.") for k in new_state)
    assert not torch.equal(federation.states[1]["classifier.4.weight"], federation.states[2]["classifier.4.weight"])


# --- FedDyn ----------------------------------------------------------------------------------------------

class Hand(nn.Module):
    """One parameter and one buffer: the server's formulas by hand."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0, 2.0]))
        self.register_buffer("b", torch.zeros(2))


def _r(w, b, n=1.0):
    return Message({"w": torch.tensor(w), "b": torch.tensor(b)}, {"num_examples": n, "train_loss": 0.0})


def test_feddyn_server_matches_hand_computation_over_two_rounds():
    server = FedDynServer(alpha=0.5)
    current = server.initial_message(Hand())
    assert set(server.h) == {"w"}  # buffers are not in h
    # round 1: drift = (2,2)−(1,2) + (0,4)−(1,2) = (0,2); h = −0.5·(0,2)/2 = (0,−0.5)
    # θ = mean (1,3) − h/0.5 = (1,4); the buffer is averaged plainly: (2,3)
    out = server.aggregate(current, {2: _r([0.0, 4.0], [3.0, 5.0]), 1: _r([2.0, 2.0], [1.0, 1.0])})
    assert torch.allclose(server.h["w"], torch.tensor([0.0, -0.5], dtype=torch.float64))
    assert torch.equal(out.tensors["w"], torch.tensor([1.0, 4.0]))
    assert torch.equal(out.tensors["b"], torch.tensor([2.0, 3.0]))
    # round 2 from (1,4): drift = (0,0) + (2,0); h = (0,−0.5) − 0.5·(2,0)/2 = (−0.5,−0.5); θ = (2,4) + (1,1)
    out = server.aggregate(out, {1: _r([1.0, 4.0], [0.0, 0.0]), 2: _r([3.0, 4.0], [2.0, 2.0])})
    assert torch.allclose(server.h["w"], torch.tensor([-0.5, -0.5], dtype=torch.float64))
    assert torch.equal(out.tensors["w"], torch.tensor([3.0, 5.0]))
    assert torch.equal(out.tensors["b"], torch.tensor([1.0, 1.0]))


def test_feddyn_server_divides_by_all_clients_and_weights_the_mean_as_asked():
    replies = {1: _r([2.0, 2.0], [1.0, 1.0], n=1.0), 2: _r([0.0, 4.0], [3.0, 5.0], n=3.0)}
    server = FedDynServer(alpha=0.5, num_clients=4)  # m = 4 clients, 2 took part
    out = server.aggregate(server.initial_message(Hand()), replies)
    # h = −0.5·(0,2)/4 = (0,−0.25); θ = (1,3) + (0,0.5)
    assert torch.equal(out.tensors["w"], torch.tensor([1.0, 3.5]))
    weighted = FedDynServer(alpha=0.5, weighting="examples")
    out = weighted.aggregate(weighted.initial_message(Hand()), replies)
    # mean = (1·(2,2) + 3·(0,4))/4 = (0.5,3.5); h = (0,−0.5); θ = (0.5,4.5); buffer (2.5,4)
    assert torch.allclose(out.tensors["w"], torch.tensor([0.5, 4.5]))
    assert torch.allclose(out.tensors["b"], torch.tensor([2.5, 4.0]))


def test_feddyn_server_needs_the_model_structure_first():
    with pytest.raises(RuntimeError, match="initial_message"):
        FedDynServer().aggregate(Message({"w": torch.zeros(2)}), {1: _r([1.0, 1.0], [0.0, 0.0])})
    with pytest.raises(ValueError):
        feddyn(SETTINGS, alpha=0.0)


def test_feddyn_client_step_adds_the_correction_term_and_updates_it():
    settings = TrainSettings(lr=0.1, batch_size=64, local_epochs=1)  # one full batch: one SGD step
    data = tiny_data(3)
    algorithm = feddyn(settings, alpha=0.3)
    model = tiny_model()
    message = algorithm.server.initial_message(model)
    g = torch.Generator().manual_seed(9)
    state = {k: torch.randn(v.shape, generator=g) for k, v in algorithm.client.init_state(model).items()}
    reply, new_state = algorithm.client.fit(model, message, state, data, RNG)
    _, _, _, avg_reply, _ = _fit(fedavg(settings), data=data)
    for name in _params(model):
        g_k = state[gradient_key(name)]
        # at θ = θ^{t−1} the proximal gradient is zero: the step is FedAvg's plus lr·g_k
        assert torch.allclose(reply.tensors[name], avg_reply.tensors[name] + 0.1 * g_k, atol=1e-6), name
        # g_k ← g_k − α(θ_k − θ^{t−1})
        expected = g_k - 0.3 * (reply.tensors[name] - message.tensors[name])
        assert torch.allclose(new_state[gradient_key(name)], expected, atol=1e-7), name


def test_feddyn_with_zero_correction_and_one_step_is_fedavg():
    settings = TrainSettings(lr=0.1, batch_size=64, local_epochs=1)
    _, _, state, reply, _ = _fit(feddyn(settings, alpha=0.3), data=tiny_data(3))
    _, _, _, avg_reply, _ = _fit(fedavg(settings), data=tiny_data(3))
    assert all(torch.allclose(reply.tensors[k], avg_reply.tensors[k], atol=1e-7) for k in avg_reply.tensors)
    assert all(torch.count_nonzero(v) == 0 for v in state.values())


def test_feddyn_state_carries_the_correction_across_rounds():
    data = {1: tiny_data(1), 2: tiny_data(2, n=24)}
    alpha = 0.1
    federation = Federation(tiny_model(), feddyn(SETTINGS, alpha=alpha), seed=0)
    calls = _record_fits(federation)
    federation.run_round("p", 1, data)
    federation.run_round("p", 2, data)
    by = {(c, rnd): (message, state, reply, new_state) for c, rnd, message, state, reply, new_state in calls}
    for c in (1, 2):
        m1, s1, r1, n1 = by[(c, 1)]
        m2, s2, r2, n2 = by[(c, 2)]
        assert all(torch.count_nonzero(v) == 0 for v in s1.values())  # g_k starts at zero
        assert all(torch.equal(s2[k], n1[k]) for k in n1)  # round 2 starts from round 1's g_k
        for name in _params(federation.model):
            k = gradient_key(name)
            g1 = -alpha * (r1.tensors[name] - m1.tensors[name])
            assert torch.allclose(n1[k], g1, atol=1e-7)
            assert torch.allclose(n2[k], g1 - alpha * (r2.tensors[name] - m2.tensors[name]), atol=1e-7)
    # the global model after round 1 follows the server formula with m = 2 participants
    m1 = by[(1, 1)][0]
    server_h = {}
    for name in _params(federation.model):
        drift = sum(by[(c, 1)][2].tensors[name].double() - m1.tensors[name].double() for c in (1, 2))
        server_h[name] = -alpha * drift / 2
        expected = sum(by[(c, 1)][2].tensors[name].double() for c in (1, 2)) / 2 - server_h[name] / alpha
        assert torch.allclose(by[(1, 2)][0].tensors[name].double(), expected, atol=1e-6), name
    # the state is plain tensors: torch.save / torch.load round-trips it
    buffer = io.BytesIO()
    torch.save(federation.states[1], buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert set(loaded) == set(federation.states[1])
    assert all(torch.equal(loaded[k], federation.states[1][k]) for k in loaded)


def test_every_algorithm_runs_a_short_federation_deterministically():
    data = {1: tiny_data(1, n=20), 2: tiny_data(2, n=20)}
    for make in (lambda: fedprox(SETTINGS, mu=0.1), lambda: fedbn(SETTINGS), lambda: fedper(SETTINGS),
                 lambda: fedrep(SETTINGS), lambda: feddyn(SETTINGS)):
        results = []
        for _ in range(2):
            federation = Federation(tiny_model(), make(), seed=3)
            info = federation.run_round("p", 1, data)
            results.append((info["train_loss"], federation.evaluate({1: ClientData(data[1].x, data[1].y)}, "loss")[1]["loss"]))
        assert results[0] == results[1]

"""Every client reply checked before anything aggregates it (`Federation.run_round` and
`run_setup`, `fedcare.runtime.replies`), issue 35 item 2: the probe's matrix of bad replies x
the six aggregation rules (each cell a named drop or one clear error, never silent, never an
unhandled exception), the quorum, the setup exchange, and a global model that is never kept
when it is not finite."""

from __future__ import annotations

import math

import pytest
import torch

from fedcare.algorithms import fedavg
from fedcare.algorithms.base import NUM_EXAMPLES, TRAIN_LOSS
from fedcare.algorithms.fedap import fedap
from fedcare.algorithms.feddg import AMPLITUDES, feddg
from fedcare.algorithms.messages import Message
from fedcare.algorithms.qfedavg import LOSS_AT_GLOBAL, qfedavg
from fedcare.algorithms.robust import RULES, robust_algorithm
from fedcare.algorithms.training import TrainingDiverged, TrainSettings
from fedcare.config import ClientDP, Robustness
from fedcare.errors import UserError
from fedcare.privacy.client_dp import ClientDPServer
from fedcare.runtime.federation import Federation
from fedcare.runtime.replies import InvalidReplies

from support.tiny import tiny_data, tiny_model

SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)
CLIENTS = list(range(8))  # Bulyan with byzantine = 1 needs 7 replies: 8 leave one to drop
BAD = 5
WEIGHT = "features.0.weight"  # a floating-point tensor every algorithm here shares


def honest_reply(client: int, sent: Message) -> Message:
    """Near the global model, a little apart from the others; a whole example count per client."""
    g = torch.Generator().manual_seed(100 + client)
    tensors = {k: (v + 0.01 * torch.randn(v.shape, generator=g, dtype=v.dtype) if v.is_floating_point() else v.clone())
               for k, v in sent.tensors.items()}
    return Message(tensors, {NUM_EXAMPLES: float(10 + client), TRAIN_LOSS: 0.5 + client / 10})


class ScriptedClients:
    """Clients that answer a fit at once (no training): honest replies, `bad` changed by `corrupt`."""

    def __init__(self, corrupt=None, bad=(BAD,), min_replies: int = 1, scalars: dict | None = None):
        self.corrupt, self.bad, self.min_replies, self.scalars = corrupt, set(bad), min_replies, scalars or {}

    def fit(self, phase, rnd, work):
        replies = {}
        for c, (sent, _) in sorted(work.items()):
            reply = honest_reply(c, sent)
            reply.scalars.update(self.scalars)  # what an algorithm's client adds (q-FedAvg's loss at the global model)
            replies[c] = self.corrupt(reply) if c in self.bad and self.corrupt else reply
        return replies

    def after_aggregation(self, phase, rnd, work):
        self.after = sorted(work)


def with_tensor(reply: Message, value) -> Message:
    return Message({**reply.tensors, WEIGHT: value}, reply.scalars)


def without(reply: Message, *, tensor=None, scalar=None) -> Message:
    return Message({k: v for k, v in reply.tensors.items() if k != tensor},
                   {k: v for k, v in reply.scalars.items() if k != scalar})


def with_scalar(reply: Message, key: str, value) -> Message:
    return Message(reply.tensors, {**reply.scalars, key: value})


def poked(reply: Message, value: float) -> Message:
    t = reply.tensors[WEIGHT].clone()
    t.view(-1)[3] = value
    return with_tensor(reply, t)


# the probe's bad replies: (kind, what the client sends instead, what the drop's reason says)
BAD_REPLIES = [
    ("nan-tensor", lambda r: poked(r, math.nan), "tensor 'features.0.weight' holds NaN"),
    ("inf-tensor", lambda r: poked(r, -math.inf), "tensor 'features.0.weight' holds an infinite value"),
    ("0-d-tensor", lambda r: with_tensor(r, torch.tensor(334.0)), "has shape (), expected (4, 1, 3, 3)"),
    ("wrong-shape", lambda r: with_tensor(r, r.tensors[WEIGHT][:2]), "has shape (2, 1, 3, 3), expected (4, 1, 3, 3)"),
    ("int-dtype", lambda r: with_tensor(r, r.tensors[WEIGHT].round().long()), "is torch.int64, expected torch.float32"),
    ("float64", lambda r: with_tensor(r, r.tensors[WEIGHT].double()), "is torch.float64, expected torch.float32"),
    ("complex", lambda r: with_tensor(r, r.tensors[WEIGHT].to(torch.complex64)), "is torch.complex64, expected"),
    ("missing-tensor", lambda r: without(r, tensor=WEIGHT), "missing tensor 'features.0.weight'"),
    ("extra-tensor", lambda r: Message({**r.tensors, "smuggled": torch.zeros(3)}, r.scalars), "unexpected tensor 'smuggled'"),
    ("empty-message", lambda r: Message(), "an empty reply"),
    ("count-nan", lambda r: with_scalar(r, NUM_EXAMPLES, math.nan), "num_examples is nan"),
    ("count-inf", lambda r: with_scalar(r, NUM_EXAMPLES, math.inf), "num_examples is inf"),
    ("count-negative", lambda r: with_scalar(r, NUM_EXAMPLES, -15.0), "num_examples is -15, not a positive whole number"),
    ("count-zero", lambda r: with_scalar(r, NUM_EXAMPLES, 0.0), "num_examples is 0, not a positive whole number"),
    ("count-fraction", lambda r: with_scalar(r, NUM_EXAMPLES, 2.5), "num_examples is 2.5, not a positive whole number"),
    ("count-bool", lambda r: with_scalar(r, NUM_EXAMPLES, True), "num_examples is True, not a number"),
    ("count-string", lambda r: with_scalar(r, NUM_EXAMPLES, "15"), "num_examples is '15', not a number"),
    ("count-missing", lambda r: without(r, scalar=NUM_EXAMPLES), "no num_examples"),
    ("loss-nan", lambda r: with_scalar(r, TRAIN_LOSS, math.nan), "train_loss is nan"),
    ("loss-missing", lambda r: without(r, scalar=TRAIN_LOSS), "no train_loss"),
    ("not-a-message", lambda r: None, "a NoneType, not a message"),
    ("not-a-tensor", lambda r: with_tensor(r, r.tensors[WEIGHT].tolist()), "is a list, not a tensor"),
]


def algorithm_for(rule: str):
    options = {"median": {}, "trimmed_mean": {}, "krum": {"byzantine": 1}, "multi_krum": {"byzantine": 1, "multi_krum_keep": 3},
               "bulyan": {"byzantine": 1}, "mean": {}}[rule]
    return robust_algorithm(fedavg(SETTINGS), Robustness(rule=rule, **options))


def federation(rule: str, clients: ScriptedClients) -> Federation:
    return Federation(tiny_model(), algorithm_for(rule), seed=0, clients=clients)


def expected_without_bad(rule: str) -> Message:
    """The rule's aggregate over the honest replies alone, from a server of its own."""
    server = algorithm_for(rule).server
    start = server.initial_message(tiny_model())
    return server.aggregate(start, {c: honest_reply(c, start) for c in CLIENTS if c != BAD})


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("kind,corrupt,reason", BAD_REPLIES, ids=[k for k, _, _ in BAD_REPLIES])
def test_each_bad_reply_is_dropped_by_name_and_the_round_is_the_others_aggregate(rule, kind, corrupt, reason):
    clients = ScriptedClients(corrupt)
    fed = federation(rule, clients)
    info = fed.run_round("train", 1, {c: None for c in CLIENTS})
    assert list(info["rejected"]) == [str(BAD)] and reason in info["rejected"][str(BAD)]
    assert info["clients"] == len(CLIENTS) - 1 and BAD not in clients.after  # a failed client: no after-aggregation
    assert info["n_train"] == sum(10 + c for c in CLIENTS if c != BAD) and math.isfinite(info["train_loss"])
    expected = expected_without_bad(rule)
    assert all(torch.equal(fed.global_message.tensors[k], v) for k, v in expected.tensors.items())


@pytest.mark.parametrize("rule", RULES)
def test_counts_summing_to_zero_leave_no_valid_reply_and_stop_with_one_line_naming_each(rule):
    fed = federation(rule, ScriptedClients(lambda r: with_scalar(r, NUM_EXAMPLES, 0.0), bad=CLIENTS))
    before = fed.global_message.clone()
    with pytest.raises(InvalidReplies) as e:
        fed.run_round("train", 1, {c: None for c in CLIENTS})
    assert isinstance(e.value, UserError) and "\n" not in str(e.value)
    assert "0 valid replies left of 8" in str(e.value)
    assert all(f"client {c}: num_examples is 0" in str(e.value) for c in CLIENTS)
    assert all(torch.equal(fed.global_message.tensors[k], v) for k, v in before.tensors.items())


@pytest.mark.parametrize("rule", RULES[1:])
def test_a_huge_but_finite_update_is_the_robust_rules_to_bound(rule):
    """A finite value is no malformed reply: validation passes it, and each robust rule keeps
    the aggregate within the honest replies' values (docs/robustness.md)."""
    fed = federation(rule, ScriptedClients(lambda r: with_tensor(r, torch.full_like(r.tensors[WEIGHT], 1e30))))
    info = fed.run_round("train", 1, {c: None for c in CLIENTS})
    assert "rejected" not in info
    start = algorithm_for(rule).server.initial_message(tiny_model())
    honest = torch.stack([honest_reply(c, start).tensors[WEIGHT] for c in CLIENTS if c != BAD])
    assert bool((fed.global_message.tensors[WEIGHT] <= honest.max(0).values + 1e-6).all())


def test_a_huge_but_finite_update_moves_the_plain_mean_as_documented():
    fed = federation("mean", ScriptedClients(lambda r: with_tensor(r, torch.full_like(r.tensors[WEIGHT], 1e30))))
    info = fed.run_round("train", 1, {c: None for c in CLIENTS})
    assert "rejected" not in info and float(fed.global_message.tensors[WEIGHT].min()) > 1e28


def test_a_bad_reply_below_the_deployments_quorum_stops_the_round_naming_it():
    fed = federation("mean", ScriptedClients(lambda r: poked(r, math.nan), min_replies=len(CLIENTS)))
    with pytest.raises(InvalidReplies, match=r"7 valid replies left of 8 \(needed 8\); dropped client 5: tensor "
                                             r"'features.0.weight' holds NaN"):
        fed.run_round("train", 1, {c: None for c in CLIENTS})


def test_bulyan_left_with_too_few_replies_after_a_drop_says_which_was_dropped():
    fed = federation("bulyan", ScriptedClients(lambda r: poked(r, math.nan)))
    with pytest.raises(InvalidReplies, match=r"needs at least 7 replies in a round; this round had 6; dropped before "
                                             r"it: client 5: tensor 'features.0.weight' holds NaN"):
        fed.run_round("train", 1, {c: None for c in CLIENTS[:7]})


def test_a_dropped_reply_is_told_on_the_terminal(caplog):
    fed = federation("mean", ScriptedClients(lambda r: with_scalar(r, NUM_EXAMPLES, -1.0)))
    fed.run_round("train", 3, {c: None for c in CLIENTS})
    assert [r.getMessage() for r in caplog.records if r.name == "fedcare.runtime"] == [
        "fedavg (seed 0), round 3 of phase 'train': dropped client 5's reply: num_examples is -1, not a positive whole "
        "number"]


# -- in process, with training: a site's NaN reply no longer poisons the honest sites -----
class CorruptingClient:
    """Wraps a client half: client `bad`'s fit reply in round `rnd` has a NaN tensor."""

    def __init__(self, inner, bad: int, rnd: int):
        self.inner, self.bad, self.rnd = inner, bad, rnd

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def fit(self, model, message, state, data, rng):
        reply, state = self.inner.fit(model, message, state, data, rng)
        if rng.client == self.bad and rng.round == self.rnd:
            reply = poked(reply, math.nan)
        return reply, state


def test_a_nan_reply_leaves_the_next_rounds_and_the_checkpoint_finite():
    """It made the global model NaN; the next round failed blaming an honest site, and a resume
    failed the same way for ever (the checkpoint held the NaN model)."""
    algorithm = fedavg(SETTINGS)
    algorithm.client = CorruptingClient(algorithm.client, bad=2, rnd=1)
    fed = Federation(tiny_model(), algorithm, seed=0)
    train = {c: tiny_data(c, n=16) for c in (1, 2, 3)}
    infos = [fed.run_round("train", r, train) for r in (1, 2, 3)]
    assert [sorted(i.get("rejected", {})) for i in infos] == [["2"], [], []]
    assert [i["clients"] for i in infos] == [2, 3, 3]
    saved = fed.state_dict()["global_message"]
    assert all(bool(torch.isfinite(t).all()) for t in saved.tensors.values() if t.is_floating_point())


# -- the setup exchange -----------------------------------------------------------------
class SetupClients(ScriptedClients):
    """Clients whose setup replies are given per client."""

    def __init__(self, replies: dict):
        super().__init__()
        self.replies = replies

    def setup(self, phase, work):
        return {c: self.replies[c] for c in sorted(work)}

    def receive_setup(self, answers):
        self.answered = sorted(answers)


def fedap_statistics(fed: Federation, value: float = 1.0) -> Message:
    return Message({k: torch.full(shape, value) for k, shape in fed.server.expected.items()}, {NUM_EXAMPLES: 10.0})


@pytest.mark.parametrize("kind,change,reason", [
    ("nan", lambda m: Message({k: v * math.nan for k, v in m.tensors.items()}, m.scalars), "holds NaN"),
    ("negative-variance", lambda m: Message({k: -v if k.endswith(".var") else v for k, v in m.tensors.items()}, m.scalars),
     "holds a negative variance"),
    ("wrong-shape", lambda m: Message({k: v[:1] for k, v in m.tensors.items()}, m.scalars), "has shape (1,), expected"),
    ("missing", lambda m: Message(dict(list(m.tensors.items())[1:]), m.scalars), "missing statistic"),
    ("count", lambda m: Message(m.tensors, {NUM_EXAMPLES: -2.0}), "num_examples is -2"),
    ("int", lambda m: Message({k: v.long() for k, v in m.tensors.items()}, m.scalars), "not floating point"),
])
def test_fedaps_statistics_are_checked_and_a_bad_client_is_left_out_by_name(kind, change, reason):
    fed = Federation(tiny_model(), fedap(SETTINGS), seed=0, clients=SetupClients({}))
    good = fedap_statistics(fed)
    fed.clients.replies = {0: good, 1: fedap_statistics(fed, 2.0), 2: change(good)}
    fed.run_setup("setup", {c: None for c in (0, 1, 2)})
    assert sorted(fed.server.statistics) == [0, 1]
    info = fed.run_round("train", 1, {c: None for c in (0, 1, 2)})
    assert list(info["rejected_setup"]) == ["2"] and reason in info["rejected_setup"]["2"]
    assert "rejected_setup" not in fed.run_round("train", 2, {c: None for c in (0, 1, 2)})  # told once


def test_feddgs_amplitudes_of_another_shape_than_most_clients_are_left_out():
    def amplitudes(size: int) -> Message:
        return Message({AMPLITUDES: torch.ones(2, 1, size, size)}, {NUM_EXAMPLES: 10.0})

    clients = SetupClients({0: amplitudes(8), 1: amplitudes(8), 2: amplitudes(16)})
    fed = Federation(tiny_model(), feddg(SETTINGS), seed=0, clients=clients)
    fed.run_setup("setup", {c: None for c in (0, 1, 2)})
    assert clients.answered == [0, 1]
    assert "differ from most clients'" in fed.setup_rejected[2]


def test_two_feddg_clients_that_disagree_cannot_be_told_apart_and_stop_the_setup():
    clients = SetupClients({0: Message({AMPLITUDES: torch.ones(2, 1, 8, 8)}),
                            1: Message({AMPLITUDES: torch.ones(2, 1, 16, 16)})})
    fed = Federation(tiny_model(), feddg(SETTINGS), seed=0, clients=clients)
    with pytest.raises(InvalidReplies, match="0 valid replies left of 2.*client 0: .*client 1: "):
        fed.run_setup("setup", {c: None for c in (0, 1)})


# -- the global model -------------------------------------------------------------------
def test_an_aggregate_that_is_not_finite_is_never_kept():
    """Client-level DP with noise_multiplier = 1e300 gave an infinite model, infinite losses
    and no note; now the round stops as that method's divergence, naming the aggregate. (The
    config refuses 1e300 now: built unvalidated, it stands for any server whose sum overflows.)"""
    algorithm = fedavg(SETTINGS)
    algorithm.server = ClientDPServer(algorithm.server, ClientDP.model_construct(noise_multiplier=1e300), "fedavg")
    fed = Federation(tiny_model(), algorithm, seed=0, clients=ScriptedClients())
    before = fed.global_message.clone()
    with pytest.raises(TrainingDiverged, match=r"round 1 of phase 'train': the aggregate of 8 valid replies "
                                               r"\(ClientDPServer\) '.*' holds an infinite value"):
        fed.run_round("train", 1, {c: None for c in CLIENTS})
    assert all(torch.equal(fed.global_message.tensors[k], v) for k, v in before.tensors.items())


def test_client_dp_drops_one_clients_infinite_update_instead_of_a_nan_model():
    algorithm = fedavg(SETTINGS)
    algorithm.server = ClientDPServer(algorithm.server, ClientDP(noise_multiplier=0.5), "fedavg")
    fed = Federation(tiny_model(), algorithm, seed=0, clients=ScriptedClients(lambda r: poked(r, math.inf)))
    info = fed.run_round("train", 1, {c: None for c in CLIENTS})
    assert list(info["rejected"]) == [str(BAD)]
    assert all(bool(torch.isfinite(t).all()) for t in fed.global_message.tensors.values())


@pytest.mark.parametrize("change,reason", [
    (lambda r: without(r, scalar=LOSS_AT_GLOBAL), "no loss_at_global (q-FedAvg weighs each update by it)"),
    (lambda r: with_scalar(r, LOSS_AT_GLOBAL, -1.0), "loss_at_global is -1"),
    (lambda r: with_scalar(r, LOSS_AT_GLOBAL, math.inf), "loss_at_global is inf"),
])
def test_what_a_servers_own_rule_reads_is_checked_too(change, reason):
    """q-FedAvg weighs each update by the client's loss at the global model: a reply without it
    stopped the run with a KeyError, a negative one with a ValueError."""
    clients = ScriptedClients(change, scalars={LOSS_AT_GLOBAL: 0.7})
    fed = Federation(tiny_model(), qfedavg(SETTINGS), seed=0, clients=clients)
    info = fed.run_round("train", 1, {c: None for c in CLIENTS})
    assert info["rejected"] == {str(BAD): reason}

"""Independent checks of the server halves against Flower 1.41's strategies and by hand.

For every algorithm Flower also ships (FedAvg, FedProx's server side, FedAdam, FedYogi,
FedAdagrad, FedAvgM, QFedAvg) the same client results go to Flower's strategy, driven
offline as `Strategy.start` drives it (tests/support/flower_offline.py), and to ours, for three
consecutive rounds (the optimizers carry moments), and the global tensors must agree to 1e-6.

Where our definition differs from Flower's, the difference is pinned here and our
definition is checked by hand instead:
- Integer tensors (BatchNorm's num_batches_tracked): Flower's FedOpt family and QFedAvg
  apply their update to every array, so an int64 counter comes back as a moved float; ours
  take the plain average. The equivalence runs use floating-point tensors only; the tests
  `test_flower_moves_integer_arrays_we_average_them` and the hand checks pin both sides.
- Floating-point buffers (running statistics): Flower cannot tell them from parameters and
  optimizes them; our default averages them (buffers="optimize" matches Flower). The
  equivalence runs use a model made only of parameters.
- FedAvgM's default momentum: Flower 0.0 (= FedAvg), ours 0.9 (Hsu et al.); the runs pass
  the momentum explicitly and also check Flower's default against ours at 0.0.
- q-FedAvg: Flower takes L = 1 / client_learning_rate and whatever loss the client put
  under `train_loss`; q-FFL's F_k is the loss at the global model before local training,
  which our client half measures (checked against `predict` on the received model). The
  server formulas agree given the same loss; FedLab's client-side sum-of-last-epoch loss is
  described in fedcare.algorithms.qfedavg and not run here (FedLab is not a dependency).
- AdamW has no Flower counterpart: it is checked against torch.optim.AdamW stepping a
  parameter whose .grad is −Δ.
"""

from __future__ import annotations

import math

import pytest
import torch
from flwr.app import ConfigRecord
from flwr.serverapp.strategy import FedAdagrad, FedAdam, FedAvg, FedAvgM, FedProx, FedYogi, QFedAvg
from torch import nn

from fedcare.algorithms import fedavg
from fedcare.algorithms.base import NUM_EXAMPLES, TRAIN_LOSS, ServerHalf
from fedcare.algorithms.messages import Message
from fedcare.algorithms.qfedavg import LOSS_AT_GLOBAL, QFedAvgServer, qfedavg
from fedcare.algorithms.server_optimizers import DEFAULTS, CosineAnneal, OptimizedServer, with_server_optimizer
from fedcare.algorithms.training import TrainSettings
from fedcare.runtime.federation import Federation

from support.flower_offline import (EXAMPLES, ROUNDS, StandInGrid, client_results, flower_round, for_flower, run_flower, run_ours,
                                    task_identity, to_record, weights_model)
from support.tiny import tiny_data, tiny_model


SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)


TOL = 1e-6


def assert_rounds_agree(ours, theirs):
    assert len(ours) == len(theirs) == ROUNDS
    for r, (a, b) in enumerate(zip(ours, theirs), start=1):
        assert set(a) == set(b)
        for k in a:
            assert a[k].shape == b[k].shape, (r, k)
            diff = (a[k].double() - b[k].double()).abs().max().item()
            assert diff <= TOL, f"round {r}, {k}: max |ours - flower| = {diff:.3g}"


def fedavg_server() -> ServerHalf:
    return fedavg(SETTINGS, weighting="examples").server


# (name, our server factory, Flower strategy factory)
CASES = [
    ("fedavg", fedavg_server, lambda: FedAvg()),
    # FedProx changes only the client's loss; its server half is FedAvg's (fedcare and Flower alike)
    ("fedprox", fedavg_server, lambda: FedProx(proximal_mu=0.01)),
    ("fedadam-defaults", lambda: OptimizedServer(fedavg_server(), "fedadam"), lambda: FedAdam()),
    ("fedadam", lambda: OptimizedServer(fedavg_server(), "fedadam", eta=0.03, beta_1=0.8, beta_2=0.95, tau=1e-2),
     lambda: FedAdam(eta=0.03, beta_1=0.8, beta_2=0.95, tau=1e-2)),
    ("fedyogi-defaults", lambda: OptimizedServer(fedavg_server(), "fedyogi"), lambda: FedYogi()),
    ("fedyogi", lambda: OptimizedServer(fedavg_server(), "fedyogi", eta=0.05, beta_1=0.5, beta_2=0.9, tau=1e-2),
     lambda: FedYogi(eta=0.05, beta_1=0.5, beta_2=0.9, tau=1e-2)),
    ("fedadagrad-defaults", lambda: OptimizedServer(fedavg_server(), "fedadagrad"), lambda: FedAdagrad()),
    ("fedadagrad", lambda: OptimizedServer(fedavg_server(), "fedadagrad", eta=0.2, tau=1e-1),
     lambda: FedAdagrad(eta=0.2, tau=1e-1)),
    ("fedavgm", lambda: OptimizedServer(fedavg_server(), "fedavgm", server_momentum=0.9),
     lambda: FedAvgM(server_momentum=0.9)),
    ("fedavgm-lr", lambda: OptimizedServer(fedavg_server(), "fedavgm", server_learning_rate=0.7, server_momentum=0.5),
     lambda: FedAvgM(server_learning_rate=0.7, server_momentum=0.5)),
    ("fedavgm-no-momentum", lambda: OptimizedServer(fedavg_server(), "fedavgm", server_momentum=0.0),
     lambda: FedAvgM()),  # Flower's default momentum 0.0
    # q-FedAvg: L = 1 / client_learning_rate in Flower
    ("qfedavg-thesis", lambda: QFedAvgServer(q=0.001, lipschitz=100.0),
     lambda: QFedAvg(client_learning_rate=0.01, q=0.001)),
    ("qfedavg-q0.5", lambda: QFedAvgServer(q=0.5, lipschitz=20.0), lambda: QFedAvg(client_learning_rate=0.05, q=0.5)),
    ("qfedavg-q2", lambda: QFedAvgServer(q=2.0, lipschitz=10.0), lambda: QFedAvg(client_learning_rate=0.1, q=2.0)),
]


@pytest.mark.parametrize("name,ours,theirs", CASES, ids=[c[0] for c in CASES])
def test_same_client_results_give_flowers_aggregate(name, ours, theirs):
    model = weights_model()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rounds = client_results(initial)
    flower = run_flower(theirs(), initial, for_flower(rounds))  # fresh strategy and records
    mine = run_ours(ours(), model, rounds)
    assert_rounds_agree(mine, flower)
    # and the optimizers do something: the result is not FedAvg's (except the FedAvg-like cases)
    plain = run_ours(fedavg_server(), weights_model(), rounds)
    moved = max((mine[-1][k] - plain[-1][k]).abs().max().item() for k in plain[-1])
    if name in ("fedavg", "fedprox", "fedavgm-no-momentum"):
        assert moved <= TOL
    else:
        assert moved > 1e-3


def test_fedprox_strategy_only_adds_mu_to_the_config():
    """Why FedProx's server side is FedAvg's: Flower's FedProx only puts proximal-mu into the
    instruction; aggregation is inherited from FedAvg."""
    assert FedProx.aggregate_train is FedAvg.aggregate_train
    with task_identity():
        strategy = FedProx(proximal_mu=0.25)
        instructions = list(strategy.configure_train(1, to_record({"w": torch.zeros(2)}), ConfigRecord(), StandInGrid([1, 2])))
    assert all(m.content["config"]["proximal-mu"] == 0.25 for m in instructions)


@pytest.mark.parametrize("optimizer,strategy", [("fedadam", FedAdam), ("fedyogi", FedYogi), ("fedadagrad", FedAdagrad)])
def test_fedopt_defaults_are_flowers(optimizer, strategy):
    flower = strategy()
    for name, value in DEFAULTS[optimizer].items():
        if hasattr(flower, name):
            assert getattr(flower, name) == value, name
    assert DEFAULTS["fedadam"]["bias_correction"] == "flower"


def test_fedavgm_default_momentum_differs_from_flower_on_purpose():
    assert FedAvgM().server_momentum == 0.0  # Flower: FedAvgM defaults to plain FedAvg
    assert DEFAULTS["fedavgm"] == {"server_learning_rate": 1.0, "server_momentum": 0.9}
    assert FedAvgM().server_learning_rate == DEFAULTS["fedavgm"]["server_learning_rate"]


@pytest.mark.parametrize("name,strategy", [("fedadam", lambda: FedAdam()),
                                           ("qfedavg", lambda: QFedAvg(client_learning_rate=0.01, q=0.001))],
                         ids=["fedadam", "qfedavg"])
def test_flower_moves_integer_arrays_we_average_them(name, strategy):
    """The documented difference: Flower's FedAdam updates num_batches_tracked like a weight
    (a float comes back, not the average) and its QFedAvg raises on an integer array; ours
    keep an integer average."""
    current = {"w": torch.zeros(3), "count": torch.tensor(10)}
    results = {1: ({"w": torch.ones(3), "count": torch.tensor(14)}, {"num-examples": 10, "train_loss": 0.5}),
               2: ({"w": 2 * torch.ones(3), "count": torch.tensor(20)}, {"num-examples": 30, "train_loss": 0.9})}
    with task_identity():
        if name == "qfedavg":  # Flower 1.41's QFedAvg cannot even take them: L·(w − w_k) in place on int64
            with pytest.raises(TypeError, match="Cannot cast"):
                flower_round(strategy(), 1, current, results)
            out = None
        else:
            out = flower_round(strategy(), 1, current, results)
    if out is not None:
        assert out["count"].is_floating_point()
        assert out["count"].item() not in (10.0, 14.0, 20.0, 18.5, 17.0)  # not a counter, not an average
    replies = {c: Message(dict(t), {NUM_EXAMPLES: float(m["num-examples"]), LOSS_AT_GLOBAL: m["train_loss"]})
               for c, (t, m) in results.items()}
    inner = ServerHalf(weighting="examples")
    for server in (OptimizedServer(inner, "fedadam", buffers="optimize"), QFedAvgServer(weighting="examples")):
        ours = server.aggregate(Message(dict(current)), replies)
        assert ours.tensors["count"].dtype == torch.int64 and ours.tensors["count"].item() == round((14 * 10 + 20 * 30) / 40)


# --- our definitions by hand -------------------------------------------------------------

def _bn_model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))


def _bn_replies(model: nn.Module) -> dict[int, Message]:
    replies = {}
    for c, n in ((1, 10), (2, 30)):
        g = torch.Generator().manual_seed(c)
        t = {k: (v + torch.randn(v.shape, generator=g) if v.is_floating_point() else v + 4 * c)
             for k, v in model.state_dict().items()}
        replies[c] = Message(t, {NUM_EXAMPLES: float(n), TRAIN_LOSS: 0.0})
    return replies


@pytest.mark.parametrize("bias_correction", ["flower", "adam", "none"])
def test_fedadam_first_step_by_hand(bias_correction):
    """Step 1 from zero moments: m = (1−β1)Δ, v = (1−β2)Δ², w + α m/(√v + τ); buffers and the
    integer counter take the average."""
    model = _bn_model()
    server = OptimizedServer(ServerHalf(weighting="examples"), "fedadam", eta=0.1, beta_1=0.9, beta_2=0.99, tau=1e-3,
                             bias_correction=bias_correction)
    current = server.initial_message(model)
    replies = _bn_replies(model)
    out = server.aggregate(current, replies).tensors
    avg = ServerHalf(weighting="examples").aggregate(current, replies).tensors
    k = {"flower": 2, "adam": 1, "none": None}[bias_correction]
    alpha = 0.1 if k is None else 0.1 * math.sqrt(1 - 0.99**k) / (1 - 0.9**k)
    for name in ("0.weight", "0.bias", "1.weight", "1.bias"):
        delta = avg[name] - current.tensors[name]
        expected = current.tensors[name] + alpha * (0.1 * delta) / ((0.01 * delta**2).sqrt() + 1e-3)
        torch.testing.assert_close(out[name], expected, atol=1e-6, rtol=0)
    for name in ("1.running_mean", "1.running_var", "1.num_batches_tracked"):
        assert torch.equal(out[name], avg[name]), name
    assert out["1.num_batches_tracked"].dtype == torch.int64


def test_buffers_optimize_moves_running_statistics_too():
    model = _bn_model()
    server = OptimizedServer(ServerHalf(), "fedavgm", buffers="optimize", server_learning_rate=0.5, server_momentum=0.0)
    current = server.initial_message(model)
    replies = _bn_replies(model)
    out = server.aggregate(current, replies).tensors
    avg = ServerHalf().aggregate(current, replies).tensors
    for name in ("1.running_mean", "1.running_var", "0.weight"):
        torch.testing.assert_close(out[name], current.tensors[name] + 0.5 * (avg[name] - current.tensors[name]))
    assert torch.equal(out["1.num_batches_tracked"], avg["1.num_batches_tracked"])


def test_fedyogi_and_fedadagrad_two_steps_by_hand():
    w0, targets = torch.tensor([0.0, 1.0]), [torch.tensor([0.5, 0.0]), torch.tensor([1.0, 0.2])]
    for name in ("fedyogi", "fedadagrad"):
        server = OptimizedServer(ServerHalf(), name, buffers="optimize", eta=0.1, beta_1=0.5, tau=0.01,
                                 **({"beta_2": 0.9} if name == "fedyogi" else {}))
        w, m, v = w0.clone(), torch.zeros(2), torch.zeros(2)
        current = Message({"w": w0.clone()})
        for target in targets:
            current = server.aggregate(current, {1: Message({"w": target}, {NUM_EXAMPLES: 1.0})})
            d = target - w
            m = 0.5 * m + 0.5 * d
            v = v - 0.1 * d**2 * torch.sign(v - d**2) if name == "fedyogi" else v + d**2
            w = w + 0.1 * m / (v.sqrt() + 0.01)
            torch.testing.assert_close(current.tensors["w"], w, atol=1e-6, rtol=0)


@pytest.mark.parametrize("hyper", [{}, {"lr": 0.05, "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 0.1}],
                         ids=["torch-defaults", "custom"])
def test_adamw_is_torch_adamw_on_minus_delta(hyper):
    """The surgical thesis's server: torch.optim.AdamW stepping the global tensors with
    .grad = −Δ = current − average, three rounds, moments carried over."""
    _assert_torch_adamw(with_server_optimizer(fedavg(SETTINGS), "adamw", **hyper), hyper)


def _assert_torch_adamw(algorithm, hyper: dict, factor=lambda t: 1.0) -> list[dict]:
    """Runs the algorithm's server 3 rounds and torch.optim.AdamW(**hyper), its lr scaled by
    factor(t) at step t, with .grad = −Δ beside it; every tensor must agree each round."""
    model = weights_model()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rounds = client_results(initial)
    mine = run_ours(algorithm.server, model, rounds)

    params = {k: nn.Parameter(v.clone()) for k, v in initial.items()}
    opt = torch.optim.AdamW(list(params.values()), **hyper)
    base_lr = opt.param_groups[0]["lr"]
    inner = ServerHalf(weighting="examples")
    for r, results in enumerate(rounds):
        opt.param_groups[0]["lr"] = base_lr * factor(r + 1)
        current = Message({k: p.detach().clone() for k, p in params.items()})
        replies = {n: Message(t, {NUM_EXAMPLES: float(EXAMPLES[n])}) for n, (t, _) in results.items()}
        avg = inner.aggregate(current, replies).tensors
        opt.zero_grad()
        for k, p in params.items():
            p.grad = -(avg[k] - p.detach())
        opt.step()
        for k, p in params.items():
            diff = (mine[r][k] - p.detach()).abs().max().item()
            assert diff <= TOL, (r + 1, k, diff)
    return mine


def test_cosine_anneal_holds_then_falls_to_zero():
    anneal = CosineAnneal(hold=2, steps=6)
    assert [anneal(t) for t in (1, 2)] == [1.0, 1.0]
    assert anneal(4) == pytest.approx(0.5) and anneal(3) == pytest.approx((1 + math.cos(math.pi / 4)) / 2)
    assert anneal(6) == 0.0 and anneal(9) == 0.0


def test_adamw_with_a_rate_schedule_is_torch_adamw_with_that_rate_each_step():
    """`lr_factor` scales AdamW's lr (and so its decoupled decay) at each step, as a torch
    scheduler setting the param group's lr would; the moments are untouched by it."""
    anneal = CosineAnneal(hold=1, steps=3)  # factors 1, 0.5, 0
    hyper = {"lr": 0.05, "weight_decay": 0.1}
    mine = _assert_torch_adamw(with_server_optimizer(fedavg(SETTINGS), "adamw", lr_factor=anneal, **hyper), hyper,
                               anneal)
    assert all(torch.equal(mine[2][k], mine[1][k]) for k in mine[2])  # factor 0: the last step moves nothing


def test_with_server_optimizer_wraps_a_copy_and_names_it():
    base = fedavg(SETTINGS)
    wrapped = with_server_optimizer(base, "fedadam", eta=0.01)
    assert wrapped.name == "fedavg+fedadam" and wrapped.client is base.client
    assert isinstance(wrapped.server, OptimizedServer) and wrapped.server.inner is not base.server
    assert base.server.__class__ is ServerHalf
    assert wrapped.server.split == base.server.split and wrapped.server.weighting == base.server.weighting
    with pytest.raises(ValueError):
        with_server_optimizer(base, "fedsgdw")
    with pytest.raises(TypeError):
        with_server_optimizer(base, "fedadam", lr=0.1)  # FedAdam's step size is eta
    with pytest.raises(ValueError):
        with_server_optimizer(base, "fedadam", bias_correction="kingma")


def test_optimized_server_refuses_to_guess_buffers_and_skips_empty_rounds():
    server = OptimizedServer(ServerHalf(), "fedadam")
    current = Message({"w": torch.zeros(2)})
    with pytest.raises(RuntimeError, match="initial_message"):
        server.aggregate(current, {1: Message({"w": torch.ones(2)}, {NUM_EXAMPLES: 1.0})})
    server.initial_message(nn.Linear(2, 1))
    assert server.aggregate(current, {}) is current and server.step == 0


@pytest.mark.parametrize("make", [
    lambda: with_server_optimizer(fedavg(SETTINGS), "fedadam", eta=0.01),
    lambda: with_server_optimizer(fedavg(SETTINGS), "adamw"),
    lambda: qfedavg(SETTINGS),
], ids=["fedavg+fedadam", "fedavg+adamw", "qfedavg"])
def test_runs_in_the_simulator_deterministically(make):
    """Two rounds on the tiny BatchNorm net; the same seed gives the same tensors, and the
    optimizer state travels with the server's snapshot."""
    train = {c: tiny_data(c) for c in (1, 2, 3)}
    finals = []
    for _ in range(2):
        fed = Federation(tiny_model(), make(), seed=7)
        for rnd in (1, 2):
            info = fed.run_round("train", rnd, train)
            assert math.isfinite(info["train_loss"])
        finals.append(fed.global_message.tensors)
        snap = fed.snapshot()
        assert snap[1] is not fed.server and getattr(snap[1], "step", None) == getattr(fed.server, "step", None)
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])
    assert all(torch.isfinite(v.double()).all() for v in finals[0].values())
    assert (finals[0]["features.1.running_var"] > 0).all()

"""Robust aggregation (fedcare.algorithms.robust) against Flower 1.41's own FedMedian,
FedTrimmedAvg, Krum, MultiKrum and Bulyan (flwr.serverapp.strategy) as oracles, driven offline
(tests/support/flower_offline.py) on the same replies; the `[robustness]` table's checks; the
robust server through a study, both runtimes and a checkpoint. The simulated attackers:
tests/algorithms/test_attack.py."""

from __future__ import annotations

import pytest
import torch
from flwr.serverapp.strategy import Bulyan, FedMedian, FedTrimmedAvg, Krum, MultiKrum
from pydantic import ValidationError

from fedcare.algorithms import fedavg, feddyn
from fedcare.algorithms.base import NUM_EXAMPLES, TRAIN_LOSS
from fedcare.algorithms.messages import Message
from fedcare.algorithms.robust import RobustAggregationError, RobustServer, clients_problem, robust_algorithm
from fedcare.algorithms.server_optimizers import OptimizedServer, with_server_optimizer
from fedcare.algorithms.training import TrainSettings
from fedcare.config import Attack, ClientDP, Privacy, Robustness

from support.flower_offline import flower_round, task_identity


TOL = 1e-6  # Flower computes in float32, we in float64 cast to float32


SETTINGS = TrainSettings(lr=0.5, batch_size=8, local_epochs=1)


def replies_for(n: int, seed: int = 0) -> tuple[dict, dict]:
    """(global tensors, node id -> (tensors sent back, example count)): honest replies near the
    global model and two far off, so every rule gives another answer than the mean."""
    g = torch.Generator().manual_seed(seed)
    current = {"conv.weight": torch.randn(4, 2, 3, 3, generator=g), "conv.bias": torch.randn(4, generator=g),
               "fc.weight": torch.randn(5, 8, generator=g)}
    results = {}
    for i in range(n):
        shift = 5.0 if i in (1, 4) else 0.1  # nodes 1 and 4: the outliers
        results[10 + i] = ({k: v + shift * torch.randn(v.shape, generator=g) for k, v in current.items()},
                           int(torch.randint(5, 200, (1,), generator=g)))
    return current, results


def ours(server: RobustServer, current: dict, results: dict) -> dict:
    replies = {n: Message({k: v.clone() for k, v in t.items()}, {NUM_EXAMPLES: float(c), TRAIN_LOSS: 0.0})
               for n, (t, c) in results.items()}
    return server.aggregate(Message({k: v.clone() for k, v in current.items()}), replies).tensors


def theirs(strategy, current: dict, results: dict) -> dict:
    with task_identity():
        return flower_round(strategy, 1, current, {n: (t, {"num-examples": c}) for n, (t, c) in results.items()})


def robust(rule: str, **options) -> RobustServer:
    return RobustServer(fedavg(SETTINGS).server, rule, **options)


CASES = [  # (name, our server, Flower's strategy, replies)
    ("median-odd", lambda: robust("median"), lambda: FedMedian(), 9),
    ("median-even", lambda: robust("median"), lambda: FedMedian(), 8),
    ("trimmed-0.2", lambda: robust("trimmed_mean", trim_fraction=0.2), lambda: FedTrimmedAvg(beta=0.2), 9),
    ("trimmed-0.3", lambda: robust("trimmed_mean", trim_fraction=0.3), lambda: FedTrimmedAvg(beta=0.3), 8),
    ("krum", lambda: robust("krum", byzantine=2), lambda: Krum(num_malicious_nodes=2), 9),
    ("multi-krum", lambda: robust("multi_krum", byzantine=2, keep=4),
     lambda: MultiKrum(num_malicious_nodes=2, num_nodes_to_select=4), 9),
    ("bulyan", lambda: robust("bulyan", byzantine=1), lambda: Bulyan(num_malicious_nodes=1), 8),
    ("bulyan-2", lambda: robust("bulyan", byzantine=2), lambda: Bulyan(num_malicious_nodes=2), 11),
]


@pytest.mark.parametrize("name,server,strategy,n", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("seed", [0, 1])
def test_rule_equals_flowers_strategy(name, server, strategy, n, seed):
    current, results = replies_for(n, seed)
    mine, flower = ours(server(), current, results), theirs(strategy(), current, results)
    assert set(mine) == set(flower)
    for k in mine:
        diff = (mine[k].double() - flower[k].double()).abs().max().item()
        assert diff <= TOL, f"{name}, {k}: max |ours - flower| = {diff:.3g}"
    mean = fedavg(SETTINGS).server.aggregate(Message(current), {
        c: Message(t, {NUM_EXAMPLES: float(e)}) for c, (t, e) in results.items()}).tensors
    assert (mine["fc.weight"] - mean["fc.weight"]).abs().max() > 0.05  # the outliers moved the mean, not the rule


def test_multi_krum_weights_by_examples_as_flower_and_uniform_when_asked():
    current, results = replies_for(9)
    uniform = RobustServer(fedavg(SETTINGS, weighting="uniform").server, "multi_krum", byzantine=2, keep=4)
    weighted, flat = ours(robust("multi_krum", byzantine=2, keep=4), current, results), ours(uniform, current, results)
    assert (weighted["fc.weight"] - flat["fc.weight"]).abs().max() > 1e-4


def test_krum_returns_one_reply_exactly():
    current, results = replies_for(9)
    mine = ours(robust("krum", byzantine=2), current, results)
    assert any(all(torch.equal(mine[k], t[k]) for k in mine) for t, _ in results.values())


def test_integer_tensors_are_rounded_and_left_out_of_krum_distances():
    current = {"w": torch.zeros(3), "bn.num_batches_tracked": torch.tensor(0)}
    counters = {1: 4, 2: 10 ** 9, 3: 7, 4: 6, 5: 5}  # client 2's counter is far off; its weights are not
    replies = {c: Message({"w": torch.full((3,), float(c)), "bn.num_batches_tracked": torch.tensor(counters[c])},
                          {NUM_EXAMPLES: 1.0}) for c in range(1, 6)}
    out = robust("median").aggregate(Message(current), replies).tensors
    assert out["bn.num_batches_tracked"].dtype == torch.int64 and int(out["bn.num_batches_tracked"]) == 6
    krum = robust("krum", byzantine=1).aggregate(Message(current), replies).tensors
    # scores over the weights: 5, 2, 2, 2, 5: client 2 (the first of the ties), its counter with it
    assert torch.equal(krum["w"], torch.full((3,), 2.0)) and int(krum["bn.num_batches_tracked"]) == 10 ** 9


def test_too_few_replies_is_a_clear_error():
    current, results = replies_for(6)
    with pytest.raises(RobustAggregationError, match="bulyan.*at least 7 replies.*had 6"):
        ours(robust("bulyan", byzantine=1), current, results)


# -- which algorithms, and the [robustness] table -----------------------------------------
def test_default_keeps_the_algorithm_as_it_is():
    algorithm = fedavg(SETTINGS)
    assert robust_algorithm(algorithm, None) is algorithm
    assert robust_algorithm(algorithm, Robustness()) is algorithm


def test_wraps_the_mean_under_a_server_optimizer_and_refuses_own_rules():
    adam = robust_algorithm(with_server_optimizer(fedavg(SETTINGS), "adamw"), Robustness(rule="median"))
    assert isinstance(adam.server, OptimizedServer) and isinstance(adam.server.inner, RobustServer)
    with pytest.raises(RobustAggregationError, match="feddyn aggregates by its own rule"):
        robust_algorithm(feddyn(SETTINGS), Robustness(rule="median"))


@pytest.mark.parametrize("table,message", [
    ({"rule": "median", "trim_fraction": 0.1}, 'trim_fraction is for rule = "trimmed_mean"'),
    ({"rule": "trimmed_mean", "trim_fraction": 0.5}, "less than 0.5"),
    ({"rule": "median", "byzantine": 1}, "byzantine is for rule"),
    ({"rule": "multi_krum", "byzantine": 1}, "multi_krum_keep: give it"),
    ({"rule": "krum", "multi_krum_keep": 2}, "multi_krum_keep: give it"),
    ({"rule": "bulyan"}, "bulyan\" needs byzantine >= 1"),
    ({"rule": "geomedian"}, "Input should be"),
    ({"attack": {"clients": [1], "kind": "label_flip", "scale": 2.0}}, "label_flip\" attack has no scale"),
    ({"attack": {"clients": [], "kind": "sign_flip"}}, "at least 1 item"),
])
def test_table_checks(table, message):
    with pytest.raises(ValidationError, match=message):
        Robustness(**table)


def test_a_rule_and_client_dp_or_secure_aggregation_are_refused():
    from fedcare.config import Experiment, SecureAggregation

    base = dict(study="x", seeds=[0], methods=["fedavg"], robustness=Robustness(rule="median"))
    for privacy, what in [(Privacy(client_dp=ClientDP()), "client_dp"),
                          (Privacy(secure_aggregation=SecureAggregation()), "secure_aggregation")]:
        with pytest.raises(ValidationError, match=f"robustness.rule = 'median' and privacy.{what}"):
            Experiment(**base, privacy=privacy)


def test_clients_problem_names_unknown_attackers_and_too_few_clients():
    attack = Attack(clients=[3, 99], kind="sign_flip")
    assert "99 not among this experiment's clients" in clients_problem(Robustness(attack=attack), [1, 2, 3])
    assert "needs at least 11 replies" in clients_problem(Robustness(rule="bulyan", byzantine=2), list(range(10)))
    assert clients_problem(Robustness(rule="bulyan", byzantine=2, attack=Attack(clients=["3"], kind="sign_flip")),
                           list(range(11))) is None


# -- through a study: both runtimes build the same robust server; deployment refuses attackers --
def fedhealth2_demo(extra: str):
    from importlib.resources import files

    from fedcare.studies import registry
    from fedcare.studies.load import parse_config

    text = (files("fedcare") / "configs" / "fedhealth2" / "demo.toml").read_text() + extra
    config = parse_config(text, "demo.toml")
    return config, registry.study_for(config)


def test_the_flower_coordinator_aggregates_with_the_studys_robust_server():
    from fedcare.runtime.flower.runtime import FlowerRuntime
    from fedcare.studies.checks import check_methods

    config, study = fedhealth2_demo('\n[robustness]\nrule = "trimmed_mean"\ntrim_fraction = 0.1\n')
    federation = FlowerRuntime(link=object(), algorithm=study.composed.algorithm).federation(
        study.composed.new_model(), "fedavg", 0)
    assert isinstance(federation.server, RobustServer) and federation.server.trim_fraction == 0.1
    with pytest.raises(RobustAggregationError, match="fedap aggregates by its own rule"):
        check_methods(study)  # the demo's methods include FedAP: refused before any data are read


def test_deployment_refuses_simulated_attackers_and_the_report_notes_them():
    from fedcare.algorithms.robust import describe
    from fedcare.config import ConfigError
    from fedcare.deployment.app import check_experiment

    config, _ = fedhealth2_demo('\n[robustness]\nrule = "median"\n[robustness.attack]\nclients = [0, 5]\n'
                                'kind = "scaled_update"\n')
    with pytest.raises(ConfigError, match="robustness.attack simulates attackers in process"):
        check_experiment(config, "demo.toml")
    note = describe(config.robustness)
    assert "Aggregation: median" in note and "clients 0, 5 send scaled update updates (scale 10.0)" in note


def test_a_robust_server_goes_through_a_checkpoint():
    """A resumed run reads its server half back with torch's restricted unpickler
    (fedcare.studies.checkpoint): the robust server and its settings are allowed there."""
    import io

    from fedcare.studies.checkpoint import state_classes

    server = robust_algorithm(with_server_optimizer(fedavg(SETTINGS), "adamw"),
                              Robustness(rule="multi_krum", byzantine=1, multi_krum_keep=3)).server
    buffer = io.BytesIO()
    torch.save({"server": server}, buffer)
    buffer.seek(0)
    with torch.serialization.safe_globals(state_classes()):
        back = torch.load(buffer, weights_only=True)["server"]
    assert isinstance(back.inner, RobustServer) and (back.inner.rule, back.inner.keep) == ("multi_krum", 3)


def test_the_table_round_trips_through_a_runs_config_toml():
    """A resume reads the run's config.toml back: the table as written must validate again."""
    from fedcare.config import to_toml
    from fedcare.studies.load import parse_config

    for extra in ('\n[robustness]\nrule = "median"\n[robustness.attack]\nclients = [1]\nkind = "sign_flip"\n',
                  '\n[robustness]\nrule = "multi_krum"\nbyzantine = 2\nmulti_krum_keep = 5\n'):
        config, _ = fedhealth2_demo(extra)
        assert parse_config(to_toml(config), "config.toml").robustness == config.robustness

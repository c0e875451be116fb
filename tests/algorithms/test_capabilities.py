"""What an algorithm's halves declare (`needs`, `has_setup`, `batched_fit`, ...) and the rules
every protection reads from it (fedcare.algorithms.capabilities):

- a server that reads only the sum of the replies (a SCAFFOLD-like toy) runs under secure
  aggregation and gives the plain run's model; a robust rule and client-level DP refuse it;
- client-level DP and a robust rule go inside a server optimizer, on the mean it steps from;
- every library algorithm declares what docs/algorithms.md says, and every half with a rule
  or a fit of its own declares it (no capability is guessed from an override)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fedcare.algorithms.catalogue  # noqa: F401  (every algorithm's module)
from fedcare.algorithms import fedavg, fedap, feddg, feddyn, qfedavg
from fedcare.algorithms.base import Algorithm, ClientHalf, DelegatingServer, ServerHalf
from fedcare.algorithms.capabilities import declared, secure_aggregation_problem
from fedcare.algorithms.catalogue import ALGORITHMS, build
from fedcare.algorithms.messages import Message
from fedcare.algorithms.robust import RobustAggregationError, RobustServer, robust_algorithm
from fedcare.algorithms.server_optimizers import OptimizedServer, with_server_optimizer
from fedcare.algorithms.training import ClientData, TrainSettings
from fedcare.config import ClientDP, Privacy, Robustness, SecureAggregation
from fedcare.privacy import PrivacyError, private_algorithm
from fedcare.privacy.client_dp import ClientDPServer
from fedcare.runtime.federation import Federation
from fedcare.tasks import BINARY

SETTINGS = TrainSettings(lr=0.1, batch_size=8, local_epochs=1, task=BINARY)
SECURE = Privacy(secure_aggregation=SecureAggregation())


class SumOnlyServer(ServerHalf):
    """SCAFFOLD's server in miniature: a step of `eta` towards the replies' weighted mean and a
    running control term, both from that mean alone (so from their sum: `needs = "sum"`)."""

    needs = "sum"

    def __init__(self, eta: float = 0.5):
        super().__init__()
        self.eta = eta
        self.control: dict[str, torch.Tensor] = {}

    def aggregate(self, current: Message, replies) -> Message:
        mean = super().aggregate(current, replies)
        if mean is current:
            return current
        out = dict(mean.tensors)
        for name, old in current.tensors.items():
            if old.is_floating_point():
                delta = mean.tensors[name].double() - old.double()
                self.control[name] = self.control.get(name, torch.zeros_like(delta)) + delta
                out[name] = (old.double() + self.eta * delta).to(old.dtype)
        return Message(out)


def sum_only() -> Algorithm:
    return Algorithm("scaffold-like", ClientHalf(SETTINGS), SumOnlyServer())


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 1), nn.Flatten(0))


def cohort(clients: int = 4) -> dict[int, ClientData]:
    g = torch.Generator().manual_seed(1)
    return {c: ClientData(torch.randn(10 + 3 * c, 5, generator=g), (torch.rand(10 + 3 * c, generator=g) < .5).float())
            for c in range(clients)}


def run(algorithm: Algorithm, rounds: int = 3) -> Federation:
    federation = Federation(model(), algorithm, 0)
    for rnd in range(1, rounds + 1):
        federation.run_round("train", rnd, cohort())
    return federation


# -- the rules, on a server that reads only the sum ------------------------------------------
def test_a_sum_only_server_runs_under_secure_aggregation_as_without_it():
    plain, secure = run(sum_only()), run(private_algorithm(sum_only(), SECURE))
    assert secure.algorithm.secure is not None  # masked: the server saw one reply a round
    for name, value in plain.global_message.tensors.items():
        torch.testing.assert_close(secure.global_message.tensors[name], value, atol=1e-6, rtol=0)
        torch.testing.assert_close(secure.server.control[name], plain.server.control[name], atol=1e-6, rtol=0)
    assert plain.server.control["0.weight"].abs().sum() > 0  # the control term moved


def test_a_sum_only_server_has_no_mean_for_a_robust_rule_or_client_dp():
    with pytest.raises(RobustAggregationError, match=r"scaffold-like aggregates by its own rule \(SumOnlyServer"):
        robust_algorithm(sum_only(), Robustness(rule="median"))
    with pytest.raises(PrivacyError, match=r"privacy.client_dp: scaffold-like aggregates by its own rule"):
        private_algorithm(sum_only(), Privacy(client_dp=ClientDP()))


@pytest.mark.parametrize("algorithm, reason", [
    (lambda: fedap(SETTINGS), "setup exchange"), (lambda: feddg(SETTINGS), "setup exchange"),
    (lambda: feddyn(SETTINGS), "each client's reply"), (lambda: qfedavg(SETTINGS), "each client's reply"),
    (lambda: robust_algorithm(fedavg(SETTINGS), Robustness(rule="median")), "RobustServer"),
])
def test_secure_aggregation_refuses_what_needs_each_reply_or_a_setup(algorithm, reason):
    assert reason in secure_aggregation_problem(algorithm())


def test_secure_aggregation_accepts_means_sums_and_server_optimizers():
    for algorithm in (fedavg(SETTINGS), sum_only(), with_server_optimizer(fedavg(SETTINGS), "fedadam")):
        assert secure_aggregation_problem(algorithm) is None


# -- protections that replace or noise a mean go inside a server optimizer ---------------------
def test_a_robust_rule_and_client_dp_go_inside_a_server_optimizer():
    adam = with_server_optimizer(fedavg(SETTINGS), "fedadam")
    robust = robust_algorithm(adam, Robustness(rule="median")).server
    private = private_algorithm(adam, Privacy(client_dp=ClientDP())).server
    for server, inside in ((robust, RobustServer), (private, ClientDPServer)):
        assert isinstance(server, OptimizedServer) and isinstance(server.inner, inside)
        assert server.needs == "each"  # what it reads now: each reply, by the rule inside
    assert adam.server.inner.needs == "mean" and adam.server.needs == "sum"  # the original is left as it was


def test_client_dp_noises_the_mean_a_server_optimizer_steps_from():
    """FedAvgM without momentum at rate 0.5 moves halfway to what it is given: halfway to the
    noised mean (noise inside), not the mean's halfway point plus the whole noise (outside)."""
    privacy = Privacy(client_dp=ClientDP(noise_multiplier=1.0, clipping_norm=0.5))
    halfway = with_server_optimizer(fedavg(SETTINGS), "fedavgm", server_momentum=0.0, server_learning_rate=0.5)
    optimized, alone = run(private_algorithm(halfway, privacy), 1), run(private_algorithm(fedavg(SETTINGS), privacy), 1)
    start = Federation(model(), fedavg(SETTINGS), 0).global_message
    for name, w in start.tensors.items():
        expected = w + 0.5 * (alone.global_message.tensors[name] - w)
        torch.testing.assert_close(optimized.global_message.tensors[name], expected, atol=1e-6, rtol=0)
    assert optimized.global_message.scalars["client_dp_epsilon"] > 0  # the ledger's release comes through
    assert set(optimized.server.spent_per_client()) == {"0", "1", "2", "3"}  # the federation asks through the wrapper


# -- what the library declares ----------------------------------------------------------------
EXPECTED = {  # algorithm -> (needs, has_setup): docs/algorithms.md's capability table
    "fedavg": ("mean", False), "fedprox": ("mean", False), "fedbn": ("mean", False), "fedper": ("mean", False),
    "fedrep": ("mean", False), "pfdl": ("mean", False), "local": ("mean", False), "centralized": ("mean", False),
    "perfedavg": ("mean", False), "feddg": ("mean", True), "fedap": ("each", True), "feddyn": ("each", False),
    "qfedavg": ("each", False),
}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_library_algorithm_declares_what_the_docs_say(name):
    row = declared(build(name, SETTINGS, head_paths=("0",)))
    assert (row["needs"], row["has_setup"]) == EXPECTED[name]
    adam = declared(with_server_optimizer(build(name, SETTINGS, head_paths=("0",)), "adamw"))
    assert adam["needs"] == ("sum" if EXPECTED[name][0] == "mean" else EXPECTED[name][0])


def subclasses(base: type) -> set[type]:
    import fedcare.studies.facerec.methods  # noqa: F401  (the studies' own halves)
    import fedcare.studies.surgical.methods  # noqa: F401
    import fedcare.privacy  # noqa: F401

    found, todo = set(), [base]
    while todo:
        cls = todo.pop()
        found.add(cls)
        todo += cls.__subclasses__()
    return {c for c in found - {base} if c.__module__.startswith("fedcare.")}


def test_every_server_with_a_rule_or_a_setup_of_its_own_declares_it():
    for cls in subclasses(ServerHalf):
        if "aggregate" in vars(cls):
            assert "needs" in vars(cls), f"{cls.__qualname__} aggregates by its own rule but does not declare needs"
        if "setup" in vars(cls) and not issubclass(cls, DelegatingServer):  # a wrapper passes inner's on
            assert vars(cls).get("has_setup") is True, f"{cls.__qualname__} has a setup but does not declare it"


def test_every_client_with_a_fit_of_its_own_is_not_batched():
    for cls in subclasses(ClientHalf):
        if "fit" in vars(cls):
            assert cls.batched_fit is False, f"{cls.__qualname__} has its own fit but declares batched_fit"

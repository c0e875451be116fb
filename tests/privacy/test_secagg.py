"""Secure aggregation (fedcare.privacy.secagg): the protocol on plain vectors, and in runs.

- the server's sum equals the plain sum to fixed-point tolerance, and a round's aggregate
  equals the plain weighted mean (examples or uniform) to float tolerance;
- no single masked reply reveals its update, and nothing but the DP-SGD epsilon leaves a
  client in clear;
- a client dropping out after masking, or after the shares, still lets the round finish when
  at least the threshold are left, and not below it;
- algorithms whose server needs each reply are refused up front, saying why.
Flower's Simulation Engine gives the simulator's records bit for bit: tests/studies/test_run_privacy.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedcare.algorithms import centralized, fedap, fedavg, feddg, feddyn, qfedavg
from fedcare.algorithms.messages import Message
from fedcare.algorithms.server_optimizers import with_server_optimizer
from fedcare.algorithms.training import ClientData, TrainSettings
from fedcare.config import ClientDP, Privacy, SecureAggregation
from fedcare.privacy import PrivacyError, private_algorithm
from fedcare.privacy.secagg import KEYS, MOD, REVEAL, SHARES, SecAggError, decode, encode, secure_sum
from fedcare.runtime.clients import LocalClients
from fedcare.runtime.federation import Federation
from fedcare.tasks import BINARY

TOL = 6 * 2.0 ** -24  # one rounding per client
SETTINGS = TrainSettings(lr=0.1, batch_size=8, local_epochs=1, task=BINARY)
SECURE = Privacy(secure_aggregation=SecureAggregation())


# -- the protocol on plain vectors ---------------------------------------------------------
def updates(n_clients: int = 5, size: int = 1000) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(0)
    return {c: rng.normal(0, 0.1, size) for c in range(n_clients)}


def test_the_server_sum_is_the_plain_sum():
    x = updates()
    total, _ = secure_sum(x, threshold=3)
    np.testing.assert_allclose(total, sum(x.values()), atol=TOL, rtol=0)


def test_no_single_masked_reply_reveals_its_update():
    x = updates()
    _, received = secure_sum(x, threshold=3)
    for c, y in received.items():
        seen = decode(y)
        assert abs(np.corrcoef(seen, x[c])[0, 1]) < 0.1  # nothing of x left in what the server sees
        assert np.median(np.abs(seen - x[c])) > 1e3  # read as an update, it is nowhere near it
        # the masked integers spread over the whole ring, as uniform ones do
        assert abs(y.mean() / MOD - 0.5) < 0.05


def test_a_client_dropping_after_masking_still_lets_the_round_finish():
    x = updates()
    total, received = secure_sum(x, threshold=3, drop_after_masking={1, 4})
    assert sorted(received) == [0, 2, 3]
    np.testing.assert_allclose(total, x[0] + x[2] + x[3], atol=TOL, rtol=0)


def test_below_the_threshold_the_round_cannot_be_unmasked():
    with pytest.raises(SecAggError, match="fewer than the threshold 4"):
        secure_sum(updates(), threshold=4, drop_after_masking={0, 1})


def test_fixed_point_round_trip():
    v = np.array([-3.5, 0.0, 1e-6, 12345.678, -2.0 ** 36])
    np.testing.assert_allclose(decode(encode(v)), v, atol=2.0 ** -24)


# -- in runs -------------------------------------------------------------------------------
def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 1), nn.Flatten(0))


def cohort(clients: int = 4) -> dict[int, ClientData]:
    g = torch.Generator().manual_seed(1)
    return {c: ClientData(torch.randn(10 + 3 * c, 5, generator=g), (torch.rand(10 + 3 * c, generator=g) < .5).float())
            for c in range(clients)}


class Dropping(LocalClients):
    """In-process clients of which `client` vanishes at `stage` (an exchange's name, or "fit")
    of every round, as a site that loses its connection; `seen` keeps what the server received."""

    def __init__(self, model, half, seed, client=None, stage=None):
        super().__init__(model, half, seed)
        self.client, self.stage, self.seen = client, stage, []

    def fit(self, phase, rnd, work):
        replies = super().fit(phase, rnd, work)
        self.seen.append(replies)
        return {c: m for c, m in replies.items() if not (self.stage == "fit" and c == self.client)}

    def exchange(self, name, rnd, messages):
        replies = super().exchange(name, rnd, messages)
        return {c: m for c, m in replies.items() if not (self.stage == name and c == self.client)}


def federation(algorithm, privacy=None, **dropping) -> Federation:
    m = model()
    algorithm = private_algorithm(algorithm, privacy)
    return Federation(m, algorithm, 0, clients=Dropping(m, algorithm.client, 0, **dropping))


def rounds(fed: Federation, n: int = 3, data=None) -> list[dict]:
    return [fed.run_round("train", r, data or cohort()) for r in range(1, n + 1)]


def assert_same_model(a: Federation, b: Federation, atol: float = 1e-6):
    for name, value in a.global_message.tensors.items():
        torch.testing.assert_close(b.global_message.tensors[name].double(), value.double(), atol=atol, rtol=0)


@pytest.mark.parametrize("weighting", ["examples", "uniform"])
def test_a_secure_round_gives_the_plain_weighted_mean(weighting):
    plain, secure = federation(fedavg(SETTINGS, weighting)), federation(fedavg(SETTINGS, weighting), SECURE)
    plain_info, secure_info = rounds(plain), rounds(secure)
    assert_same_model(plain, secure)
    for p, s in zip(plain_info, secure_info):
        assert s["clients"] == p["clients"] == 4 and s["n_train"] == p["n_train"]
        assert s["train_loss"] == pytest.approx(p["train_loss"], abs=1e-6)


def test_a_server_optimizer_needs_only_the_sum():
    algorithm = lambda: with_server_optimizer(fedavg(SETTINGS), "adamw", lr=1e-3)  # noqa: E731
    plain, secure = federation(algorithm()), federation(algorithm(), SECURE)
    rounds(plain), rounds(secure)
    assert_same_model(plain, secure, atol=1e-5)  # Adam divides by a small second moment: rounding grows a little


def test_the_server_receives_only_masked_vectors():
    fed = federation(fedavg(SETTINGS), SECURE)
    rounds(fed, 1)
    (replies,) = fed.clients.seen
    assert sorted(replies) == [0, 1, 2, 3]
    for reply in replies.values():
        assert list(reply.tensors) == ["masked"] and reply.scalars == {}  # no examples, no loss in clear
        y = reply.tensors["masked"].numpy()
        assert y.dtype == np.int64 and abs(y.mean() / MOD - 0.5) < 0.15  # spread over the ring
        assert np.median(np.abs(decode(y))) > 1e3  # read as weights, nowhere near the model's (|w| < 10)
    assert not any(k.startswith("extra/secagg/") for state in fed.states.values() for k in state)  # secrets gone


@pytest.mark.parametrize("stage", ["fit", REVEAL])
def test_a_client_dropping_out_lets_the_round_finish(stage):
    """Client 2 drops after the shares (its masked vector never arrives: its mask key is rebuilt)
    or after masking (its vector arrived: its self-mask seed is rebuilt); the threshold is 3."""
    secure = federation(fedavg(SETTINGS), SECURE, client=2, stage=stage)
    infos = rounds(secure, 2)
    included = [0, 1, 3] if stage == "fit" else [0, 1, 2, 3]  # whose update is in the sum
    plain = federation(fedavg(SETTINGS), client=2, stage="fit" if stage == "fit" else None)
    rounds(plain, 2)
    assert_same_model(plain, secure)
    assert all(i["clients"] == len(included) for i in infos)


@pytest.mark.parametrize("stage", [KEYS, SHARES, "fit", REVEAL])
def test_below_the_threshold_a_round_stops_saying_so(stage):
    fed = federation(fedavg(SETTINGS), Privacy(secure_aggregation=SecureAggregation(threshold=1.0)), client=1,
                     stage=stage)
    with pytest.raises(SecAggError, match="3 clients left .*fewer than the threshold 4"):
        rounds(fed, 1)


def test_a_round_of_one_client_is_refused():
    with pytest.raises(SecAggError, match="at least 2 clients in a round; round 1 has 1"):
        rounds(federation(fedavg(SETTINGS), SECURE), 1, {0: cohort()[0]})


@pytest.mark.parametrize("algorithm, reason", [
    (lambda: fedap(SETTINGS), "setup exchange"),
    (lambda: feddg(SETTINGS), "setup exchange"),
    (lambda: qfedavg(SETTINGS), "aggregates by its own rule"),
    (lambda: feddyn(SETTINGS), "aggregates by its own rule"),
])
def test_algorithms_needing_individual_replies_are_refused(algorithm, reason):
    with pytest.raises(PrivacyError, match=f"privacy.secure_aggregation: .* cannot run under secure aggregation: .*{reason}"):
        private_algorithm(algorithm(), SECURE)


def test_centralized_training_runs_as_it_is():
    """Pooled data in one process: no update leaves a client, so there is nothing to mask."""
    algorithm = private_algorithm(centralized(SETTINGS), SECURE)
    assert algorithm.secure is None and type(algorithm.client).__name__ == "ClientHalf"


def test_client_level_dp_and_secure_aggregation_are_refused_together():
    both = Privacy(client_dp=ClientDP(), secure_aggregation=SecureAggregation())
    with pytest.raises(PrivacyError, match="clips each client's update at the server"):
        private_algorithm(fedavg(SETTINGS), both)


def test_the_surgical_study_refuses_secure_aggregation_in_its_config(tmp_path):
    from fedcare.config import ConfigError
    from fedcare.studies.load import load_config

    path = tmp_path / "surgical.toml"
    path.write_text('study = "surgical"\nmethods = ["fedavg"]\n[data.synthetic]\n[privacy.secure_aggregation]\n')
    with pytest.raises(ConfigError, match="surgical study measures each client's update"):
        load_config(path)


def test_a_refused_method_stops_the_run_before_any_data_are_read(tmp_path):
    from typer.testing import CliRunner

    from fedcare.cli import app
    from fedcare.studies import registry

    config = registry.get("fedhealth2").demo_config()
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(config), "--out", str(out),
                                      "--set", "privacy.secure_aggregation.threshold=0.75"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "fedap cannot run under secure aggregation: its setup exchange" in result.output
    assert "generating synthetic" not in result.output and not out.exists()


def test_observers_of_each_update_are_refused_under_secure_aggregation():
    fed = federation(fedavg(SETTINGS), SECURE)
    fed.observers.append(lambda before, replies, after: None)
    with pytest.raises(RuntimeError, match="observers need each client's update"):
        rounds(fed, 1)


class Hostile(Dropping):
    """Client 2 replies to the fit with a forged masked vector."""

    def __init__(self, model, half, seed, forge):
        super().__init__(model, half, seed)
        self.forge = forge

    def fit(self, phase, rnd, work):
        replies = super().fit(phase, rnd, work)
        honest = replies[2].tensors["masked"]
        replies[2] = Message({"masked": self.forge(honest)}, replies[2].scalars)
        return replies


@pytest.mark.parametrize("forge, why", [
    (lambda v: v[:1], "a masked vector of length 1, not"),
    (lambda v: torch.full_like(v, 2**63 - 1), "masked values outside [0, 2^62)"),
    (lambda v: v[:-5], "a masked vector of length"),
    (lambda v: v.double().fill_(float("nan")), "a masked vector of torch.float64, not torch.int64"),
    (lambda v: torch.stack([v, v]), "a 2-D masked vector"),
], ids=["length-1", "2^63-1", "wrong-length", "nan", "2-D"])
def test_a_forged_masked_reply_is_dropped_as_a_dropout_with_the_reason(forge, why):
    """A length-1 vector gave a garbage mean and -59,773,726,050 examples; 2^63-1 was accepted;
    a wrong length, NaN or a 2-D vector raised an unhandled ValueError."""
    m = model()
    algorithm = private_algorithm(fedavg(SETTINGS), SECURE)
    hostile = Federation(m, algorithm, 0, clients=Hostile(m, algorithm.client, 0, forge))
    infos = rounds(hostile, 2)
    plain = federation(fedavg(SETTINGS), client=2, stage="fit")  # client 2 as a plain dropout
    rounds(plain, 2)
    assert_same_model(plain, hostile)
    for info in infos:
        assert info["clients"] == 3 and info["n_train"] > 0 and list(info["rejected"]) == ["2"]
        assert info["rejected"]["2"].startswith(why)

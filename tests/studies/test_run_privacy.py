"""The privacy layer on whole studies: DP-SGD on the pain study (its CNN's BatchNorm becomes
GroupNorm), client-level DP on the toy study of tests/support/toy_study (registered from outside
fedcare) through `fedcare run` and on Flower's Simulation Engine with the same records, bit
for bit, as the simulator. The toy's margin head enters the loss by its weight, not by a
layer call, so Opacus has no per-example gradient for it: DP-SGD refuses it by name."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.config import DPSGD, Privacy
from fedcare.studies.load import load_config
from fedcare.studies.run import run_study

from support import records
from support.lineage import check_lineage, site_comparisons
from support.toy import toy_both_ways, write_experiment


PRIVACY = "[privacy.client_dp]\nnoise_multiplier = 0.5\nclipping_norm = 2.0\n"


def private_experiment(path, **data):
    write_experiment(path, **data)
    path.write_text(path.read_text() + PRIVACY)
    return path


def test_dp_sgd_on_the_pain_study_reports_epsilon(tmp_path):
    from support.pain import small_config

    config = small_config().model_copy(update={"methods": ["FP(N)"], "privacy": Privacy(dp_sgd=DPSGD())})
    out = run_study(config, tmp_path / "pain")
    rounds = [r for r in records(out, "round") if r["method"] == "FP(N)"]
    eps = [r["dp_epsilon"] for r in rounds]
    assert eps and all(0 < e < float("inf") for e in eps) and eps == sorted(eps)
    assert "DP-SGD (sample-level): epsilon spent at delta = 1e-05" in (out / "report.html").read_text()
    # the budget table: each client's whole-run epsilon, the last round's, per method and phase
    budget = (out / "tables" / "privacy_budget.csv").read_text().splitlines()[1:]
    last = {}
    for r in rounds:
        for client, e in r["dp_epsilon_clients"].items():
            last[(r["phase"], client)] = e
    assert sorted(float(line.split(",")[4]) for line in budget) == sorted(last.values())


def test_client_dp_runs_in_any_study_and_its_report_shows_epsilon(toy, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(private_experiment(tmp_path / "toy.toml")), "--out", str(out)])
    assert result.exit_code == 0, result.output
    rounds = [r for r in records(out, "round") if r["method"] == "fedavg"]
    central = [r["client_dp_epsilon"] for r in rounds]
    assert len(central) == 3 and 0 < central[0] < central[1] < central[2] < float("inf")
    assert all(r["client_dp_clipping_norm"] == 2.0 for r in rounds)
    assert "client-level DP: epsilon spent at delta = 1e-05" in (out / "report.html").read_text()


def test_dp_sgd_refuses_a_loss_that_bypasses_the_layers(toy, tmp_path):
    path = private_experiment(tmp_path / "toy.toml")
    path.write_text(path.read_text() + "[privacy.dp_sgd]\n")
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "run")])
    assert result.exit_code != 0
    assert "privacy.dp_sgd: no per-example gradient for ['head.weight']" in result.output
    assert "Traceback" not in result.output


def test_a_bad_privacy_key_names_it(toy, tmp_path):
    path = private_experiment(tmp_path / "toy.toml")
    path.write_text(path.read_text() + "noise = 3\n")
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "run")])
    assert result.exit_code != 0
    assert "privacy.client_dp.noise" in result.output and "Traceback" not in result.output


@pytest.mark.timeout(300)
def test_privacy_on_flowers_simulation_engine_equals_the_simulator(toy, tmp_path):
    got, expected = toy_both_ways(tmp_path, PRIVACY)
    assert any("client_dp_epsilon" in r for r in expected) and got == expected  # noise and epsilon alike, bit for bit


@pytest.mark.timeout(300)
def test_the_one_run_audits_on_flowers_simulation_engine_equal_the_simulator(toy, tmp_path):
    """Gradient canaries at the sites (their scores in each site's privacy report) and canary
    clients at the server: the same epsilon-hat, bit for bit, in both runtimes."""
    got, expected = toy_both_ways(tmp_path, PRIVACY + "[privacy.audit]\ncanaries = 20\ncanary_clients = 30\n")
    fedavg = [r for r in expected if r["type"] == "round" and r["method"] == "fedavg"]
    assert fedavg and all("dp_audit" in r and "client_dp_audit_epsilon_hat" in r for r in fedavg)
    assert got == expected


@pytest.mark.timeout(300)
def test_dp_sgd_on_flower_equals_the_simulator(tmp_path):
    """DP-SGD at the sites: the GroupNorm model, the noise and each client's ledger (in
    Flower's Context.state) give the simulator's records, epsilon included, bit for bit."""
    from fedcare.data.unbc.synthetic import generate_pain_cohort
    from support.pain import FLOWER_SUBJECTS, flower_config, on_flower

    root = tmp_path / "unbc"
    generate_pain_cohort(root, subjects=[42, *FLOWER_SUBJECTS], frame_scale=0.02, image_size=32)
    config = flower_config(root).model_copy(update={"methods": ["FP(N)"], "privacy": Privacy(dp_sgd=DPSGD())})
    on_flower(config, tmp_path / "flower")
    local = run_study(config, tmp_path / "local")
    got, expected = (records(run, "client_eval", "round") for run in (tmp_path / "flower", local))
    assert any(r.get("dp_epsilon", 0) > 0 for r in expected) and got == expected


@pytest.mark.timeout(300)
def test_secure_aggregation_on_flowers_simulation_engine_equals_the_simulator(toy, tmp_path):
    """The four exchanges of a SecAgg+ round travel as fedcare operations through Flower; the
    masks cancel exactly, so the sites' random keys leave the records equal, bit for bit. The
    report says what the server saw."""
    got, expected = toy_both_ways(tmp_path, "[privacy.secure_aggregation]\n")
    assert got == expected and len([r for r in expected if r["type"] == "round"]) == 6
    plain = run_study(load_config(write_experiment(tmp_path / "plain.toml", root=tmp_path / "data")), tmp_path / "plain")
    fedavg = [r for r in records(plain, "round") if r["method"] == "fedavg"]
    secure = [r for r in expected if r["type"] == "round" and r["method"] == "fedavg"]
    assert [r["train_loss"] for r in secure] == pytest.approx([r["train_loss"] for r in fedavg], abs=1e-6)
    assert [r["train_loss"] for r in secure] != [r["train_loss"] for r in fedavg]  # fixed point: the protocol ran
    assert "received only the weighted sum" in (tmp_path / "flower" / "report.html").read_text()
    # the lineage lists who is in each sum, not their updates; each site's record agrees, its updates hidden
    fedavg_sums = [r for r in check_lineage(tmp_path / "flower").records
                   if r["type"] == "aggregate" and r["algorithm"] == "fedavg"]
    assert len(fedavg_sums) == 3 and all(r["clients"] == {"0": {}, "1": {}, "2": {}} for r in fedavg_sums)
    sites = site_comparisons(tmp_path / "state", tmp_path / "flower")
    assert all(s.agrees and len(s.hidden) == 6 and not s.used for s in sites.values()) and len(sites) == 3

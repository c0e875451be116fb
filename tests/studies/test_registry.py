"""A study added from outside fedcare through the registry alone: its own folder (a copy of
tests/support/toy_study in a temporary folder: the `toy` fixture, tests/studies/conftest.py) and
one FEDCARE_STUDIES entry, no edit anywhere else. It runs through `fedcare run`, the in-process
simulator and Flower's Simulation Engine, with equal numbers; it trains an embedding with a loss
that needs the labels and verifies at each client (TAR@FAR from the embeddings)."""

import json
import sys

import pytest
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.config import ConfigError
from fedcare.studies.load import load_config
from fedcare.runfiles import read_lineage
from fedcare.runtime.digest import package_digest
from fedcare.studies import registry

from support import records
from support.lineage import check_lineage, site_comparisons
from support.toy import CLIENTS, toy_both_ways, write_experiment


def test_a_registered_study_runs_through_fedcare_run(toy, tmp_path):
    config = write_experiment(tmp_path / "toy.toml")
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(config), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "| fedavg |" in result.output and "| local |" in result.output and "Report:" in result.output
    info = json.loads((out / "run.json").read_text())
    assert info["study"] == "toy" and info["synthetic"] is True
    evals = records(out, "client_eval")
    assert sorted({(r["method"], r["round"], r["client"]) for r in evals}) == sorted(
        (m, rnd, c) for m in ("fedavg", "local") for rnd in (1, 2, 3) for c in range(CLIENTS))
    # verification at each client, from its own test half: 4 identities x 6 examples each
    assert all(r["genuine_pairs"] == 4 * 15 and r["impostor_pairs"] == 6 * 6 * 6 for r in evals)
    fedavg = [r["train_loss"] for r in records(out, "round") if r["method"] == "fedavg"]
    assert fedavg[-1] < fedavg[0]  # the margin loss (with the labels) trains
    assert (out / "report.html").is_file() and (out / "plots" / "tar.png").is_file()
    # `fedcare report` finds the study through run.json and the registry
    (out / "report.html").unlink()
    assert CliRunner().invoke(app, ["report", str(out)]).exit_code == 0 and (out / "report.html").is_file()


@pytest.mark.timeout(300)
def test_a_registered_study_on_flowers_simulation_engine_equals_the_simulator(toy, tmp_path):
    got, expected = toy_both_ways(tmp_path)
    assert len(expected) == 2 * 3 * (CLIENTS + 1) and got == expected  # every loss and TAR, bit for bit
    assert json.loads((tmp_path / "flower" / "run.json").read_text())["sites"] == {"0": 0, "1": 1, "2": 2}
    # the same models, so the same lineage; and each site's own record of them agrees with it
    check_lineage(tmp_path / "flower")
    assert {r["study_code_sha256"] for r in read_lineage(tmp_path / "flower")} == {package_digest(toy / "fedcare_toy")}
    assert [r["digest"] for r in read_lineage(tmp_path / "flower")] == [r["digest"] for r in read_lineage(tmp_path / "local")]
    sites = site_comparisons(tmp_path / "state", tmp_path / "flower")
    assert sorted(sites) == ["0", "1", "2"]
    assert all(s.agrees and s.fits == len(s.used) == 6 and len(s.models) == 2 for s in sites.values())


def test_an_unknown_study_is_an_error_naming_the_registered_ones(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text('study = "nope"\nmethods = ["a"]\n')
    registered = ", ".join(registry.names())  # the built-in studies, then any installed as entry points
    with pytest.raises(ConfigError, match=rf"x.toml: study: unknown study 'nope': registered studies are {registered}$"):
        load_config(path)


def test_a_registry_entry_without_a_study_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(registry.ENVIRONMENT, raising=False)
    before = registry.names()  # the built-in studies first, then entry points (an installed example's too)
    (tmp_path / "not_a_study").mkdir()
    (tmp_path / "not_a_study" / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(registry.ENVIRONMENT, "broken=not_a_study, bad-entry")
    with pytest.raises(registry.UnknownStudy, match="bad-entry"):
        registry.names()
    monkeypatch.setenv(registry.ENVIRONMENT, "broken=not_a_study")
    assert registry.names() == [*before, "broken"] and before[:len(registry.BUILT_IN)] == list(registry.BUILT_IN)
    with pytest.raises(registry.UnknownStudy, match="defines no STUDY"):
        registry.get("broken")
    sys.modules.pop("not_a_study", None)

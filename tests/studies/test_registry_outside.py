"""Studies from outside fedcare (studies/registry.py): an installed package's entry point or
FEDCARE_STUDIES registers one with no edit to fedcare; `fedcare studies` says where each comes
from; a name claimed twice is an error naming both; run.json records the source, so `fedcare
resume` and `fedcare report` need nothing more."""

import json
import os
import sys

import pytest
from support.distributions import fake_distribution
from support.interrupt import interrupted_at_round
from support.scaffolded import experiment, forget, scaffold
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.config import ConfigError
from fedcare.plugins import STUDIES
from fedcare.studies import registry
from fedcare.studies.load import load_config
from fedcare.studies.run import run_study

@pytest.fixture
def sepsis(tmp_path, monkeypatch):
    """The scaffolded study `sepsis`, its package on sys.path, registered by nobody yet."""
    src = scaffold(tmp_path / "pkg")
    monkeypatch.syspath_prepend(str(src))
    yield src
    forget("fedcare_sepsis")


def test_an_installed_packages_entry_point_registers_its_study(sepsis, tmp_path, monkeypatch):
    before = registry.names()
    monkeypatch.syspath_prepend(str(fake_distribution(tmp_path / "site", "fedcare-sepsis", "0.1.0",
                                                      {STUDIES: {"sepsis": "fedcare_sepsis"}})))
    assert "sepsis" not in before and registry.names() == [*before, "sepsis"]
    assert registry.source_of("sepsis") == registry.Source("entry-point", "fedcare_sepsis", "fedcare-sepsis 0.1.0")
    assert registry.get("sepsis").name == "sepsis"
    shown = CliRunner().invoke(app, ["studies"], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    row = next(line for line in shown.output.splitlines() if line.startswith("sepsis"))
    assert "entry point of fedcare-sepsis 0.1.0 (fedcare_sepsis)" in row and row.rstrip().endswith("yes")
    assert next(line for line in shown.output.splitlines() if line.startswith("pain")).split()[1] == "built-in"
    # the same package named by the variable too is no conflict: the entry point is its source
    monkeypatch.setenv(registry.ENVIRONMENT, "sepsis=fedcare_sepsis")
    assert registry.source_of("sepsis").kind == "entry-point"


def test_a_name_claimed_for_two_packages_is_an_error_naming_both(sepsis, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(fake_distribution(tmp_path / "site", "fedcare-sepsis", "0.1.0",
                                                      {STUDIES: {"sepsis": "fedcare_sepsis"}})))
    monkeypatch.setenv(registry.ENVIRONMENT, "sepsis=my_sepsis,pain=fedcare_sepsis")
    both = (r"study 'sepsis' is registered twice, as fedcare_sepsis \(entry point of fedcare-sepsis 0.1.0\) and "
            r"my_sepsis \(FEDCARE_STUDIES\)")
    with pytest.raises(registry.UnknownStudy, match=both):
        registry.get("sepsis")
    with pytest.raises(registry.UnknownStudy, match=r"'pain' is registered twice, as fedcare.studies.pain "
                                                    r"\(built-in\) and fedcare_sepsis \(FEDCARE_STUDIES\)"):
        registry.get("pain")
    assert registry.get("fedhealth2").name == "fedhealth2"  # the other studies are unaffected
    shown = CliRunner().invoke(app, ["studies"], env={"COLUMNS": "250"})
    assert shown.exit_code == 1 and "problem: study 'sepsis' is registered twice" in shown.output
    with pytest.raises(ConfigError, match="study: study 'sepsis' is registered twice"):
        load_config(experiment(tmp_path / "x.toml"))


def test_run_json_records_the_source_and_resume_and_report_need_no_variable(sepsis, tmp_path, monkeypatch):
    monkeypatch.setenv(registry.ENVIRONMENT, "sepsis=fedcare_sepsis")
    path = experiment(tmp_path / "sepsis.toml", methods=("fedavg", "local"))
    whole = run_study(load_config(path), tmp_path / "whole")
    assert json.loads((whole / "run.json").read_text())["study_source"] == {"kind": "environment",
                                                                            "module": "fedcare_sepsis"}
    # Ctrl-C in round 2; the patches undone with it: a new shell, where only run.json says where the study is
    interrupted_at_round(monkeypatch, 2, lambda: run_study(load_config(path), tmp_path / "cut"))
    assert registry.ENVIRONMENT not in os.environ and "sepsis" not in registry.names()
    resumed = CliRunner().invoke(app, ["resume", str(tmp_path / "cut.partial")])
    assert resumed.exit_code == 0, resumed.output
    assert (tmp_path / "cut" / "metrics.jsonl").read_bytes() == (whole / "metrics.jsonl").read_bytes()
    (tmp_path / "cut" / "report.html").unlink()
    reported = CliRunner().invoke(app, ["report", str(tmp_path / "cut")])
    assert reported.exit_code == 0 and (tmp_path / "cut" / "report.html").is_file(), reported.output


@pytest.mark.parametrize("record", [
    {"kind": "environment", "module": "os"},  # the standard library is no study
    {"kind": "environment", "module": "fedcare_sepsis; import os"},
    {"kind": "plugin", "module": "fedcare_sepsis"},
    "fedcare_sepsis",
])
def test_a_recorded_source_is_used_only_when_well_formed(sepsis, record):
    assert registry.recorded_source(record) is None
    with pytest.raises(registry.UnknownStudy, match="unknown study 'sepsis': registered studies are pain"):
        registry.get("sepsis", record)


def test_a_recorded_package_that_is_not_installed_here_is_named(tmp_path):
    record = {"kind": "entry-point", "module": "fedcare_gone", "distribution": "fedcare-gone 1.0"}
    with pytest.raises(registry.UnknownStudy, match=r"unknown study 'gone' \(the run was made with fedcare_gone, "
                                                    r"entry point of fedcare-gone 1.0, which is not installed here\)"):
        registry.get("gone", record)
    assert "fedcare_gone" not in sys.modules

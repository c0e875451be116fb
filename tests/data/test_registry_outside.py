"""A dataset from another installed package (an entry point in `fedcare.datasets`): found by
name beside the built-in ones, its commands under `fedcare data`; a broken or clashing one is
named, and fedcare's own commands keep working."""

import os
import subprocess
import sys

import pytest
from support.distributions import fake_distribution, write_package

from fedcare.data import registry
from fedcare.plugins import DATASETS, PluginError

COMMANDS = '''
import typer


def summary_ecg(path: str) -> None:
    """Check an ECG copy."""
    print("ecg summary of", path)


def synth_ecg(out: str) -> None:
    """A synthetic ECG copy."""
    print("ecg synth into", out)


SUMMARY = {"ecg": summary_ecg}
SYNTH = {"ecg": synth_ecg}
'''


@pytest.fixture
def ecg(tmp_path, monkeypatch):
    write_package(tmp_path, "fedcare_ecg", {"__init__": "", "reader": "def read_ecg(path): ...\n",
                                            "synthetic": "def generate_ecg(out): ...\n", "commands": COMMANDS})
    fake_distribution(tmp_path, "fedcare-ecg", "0.2", {DATASETS: {"ecg": "fedcare_ecg"}})
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def fedcare(folder, *args):
    env = {**os.environ, "PYTHONPATH": str(folder), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "fedcare.cli", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_an_outside_dataset_is_registered_with_its_three_modules_and_its_commands(ecg):
    assert registry.names()[: len(registry.BUILT_IN)] == list(registry.BUILT_IN) and registry.names()[-1] == "ecg"
    assert hasattr(registry.part("ecg", "reader"), "read_ecg") and registry.part("ecg", "commands").SYNTH
    shown = fedcare(ecg, "data", "synth", "--help")
    assert shown.returncode == 0 and " ecg " in shown.stdout and " pain " in shown.stdout, shown.stderr
    ran = fedcare(ecg, "data", "summary", "ecg", "/somewhere")
    assert ran.returncode == 0 and "ecg summary of /somewhere" in ran.stdout, ran.stderr


def test_a_name_fedcare_has_is_refused_naming_both_and_the_cli_still_works(ecg):
    fake_distribution(ecg / "b", "fedcare-unbc2", "1.0", {DATASETS: {"unbc": "fedcare_ecg"}})
    sys.path.insert(0, str(ecg / "b"))
    try:
        with pytest.raises(PluginError, match=r"dataset 'unbc' is registered twice: fedcare.data.unbc \(fedcare\) and "
                                           r"fedcare_ecg \(entry point of fedcare-unbc2 1.0\)"):
            registry.names()
        assert registry.part("unbc", "commands").SUMMARY  # a built-in dataset whatever others declare
    finally:
        sys.path.remove(str(ecg / "b"))
    shown = subprocess.run([sys.executable, "-m", "fedcare.cli", "data", "synth", "--help"], capture_output=True,
                           text=True, timeout=120, env={**os.environ, "PYTHONPATH": f"{ecg}:{ecg / 'b'}"})
    assert shown.returncode == 0 and " pain " in shown.stdout
    assert "outside datasets left out: dataset 'unbc' is registered twice" in shown.stderr


def test_an_outside_dataset_whose_commands_cannot_be_imported_is_left_out_with_a_line(tmp_path):
    write_package(tmp_path, "fedcare_broken", {"__init__": "", "commands": "import not_a_module_anywhere\n"})
    fake_distribution(tmp_path, "fedcare-broken", "0.1", {DATASETS: {"broken": "fedcare_broken"}})
    shown = fedcare(tmp_path, "data", "summary", "--help")
    assert shown.returncode == 0 and " unbc " in shown.stdout and " broken " not in shown.stdout
    assert "dataset 'broken' left out: its commands cannot be imported" in shown.stderr

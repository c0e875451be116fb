"""What a user can fix is one line and exit 2; a bug is a traceback naming its file and line,
exit 1 (fedcare.errors; the command line as a user runs it, in a process of its own)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedcare.errors import InputError, UserError
from support.planted_study import plant, toy_experiment

BUGGY = '''\
from support.toy_study import ToyStudy
from support.toy_study.protocol import ToyProtocol


class Buggy(ToyProtocol):
    def run(self):
        raise ValueError("Target size (torch.Size([9])) must be the same as input size (torch.Size([9, 1]))")


class Planted(ToyStudy):
    protocol_class = Buggy


STUDY = Planted
'''
BUG_LINE = 7


def fedcare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedcare.cli", *args], capture_output=True, text=True, timeout=300)


def test_a_bug_in_a_study_is_a_traceback_naming_its_file_and_line(tmp_path, monkeypatch):
    source = plant(tmp_path, monkeypatch, BUGGY)
    result = fedcare("run", str(toy_experiment(tmp_path / "toy.toml")), "--out", str(tmp_path / "run"))
    assert result.returncode == 1
    assert "Traceback" in result.stderr and f'File "{source}", line {BUG_LINE}, in run' in result.stderr
    assert "ValueError: Target size" in result.stderr


def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, "from support.toy_study import ToyStudy as STUDY\n")
    missing = tmp_path / "nowhere"
    config = toy_experiment(tmp_path / "toy.toml", data=f'root = "{missing}"\n')
    result = fedcare("run", str(config), "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"error: {missing / 'client-0.npz'}: no such file", "nothing was finished; nothing kept"]
    # the switch shows where it was raised, and keeps the exit code
    result = fedcare("--traceback", "run", str(config), "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and "Traceback" in result.stderr and "DataError" in result.stderr
    assert f"error: {missing / 'client-0.npz'}: no such file" in result.stderr


def test_every_user_error_keeps_its_builtin_base():
    from fedcare.algorithms.attack import AttackError
    from fedcare.algorithms.robust import RobustAggregationError
    from fedcare.config import ConfigError
    from fedcare.data.common import DataError
    from fedcare.privacy import PrivacyError
    from fedcare.runtime.sites import SiteError
    from fedcare.studies.rundir import RunDirectoryExists

    for cls, builtin in [(ConfigError, ValueError), (DataError, ValueError), (PrivacyError, ValueError),
                         (RobustAggregationError, ValueError), (AttackError, ValueError), (InputError, ValueError),
                         (SiteError, RuntimeError), (RunDirectoryExists, FileExistsError)]:
        assert issubclass(cls, UserError) and issubclass(cls, builtin)
    assert not issubclass(ValueError, UserError)


@pytest.mark.parametrize("value, wanted", [("", False), ("0", False), ("1", True), ("yes", True)])
def test_the_traceback_switch(monkeypatch, value, wanted):
    from fedcare.errors import tracebacks_wanted

    monkeypatch.setenv("FEDCARE_TRACEBACK", value)
    assert tracebacks_wanted() is wanted

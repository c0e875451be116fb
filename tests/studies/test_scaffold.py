"""`fedcare new study NAME DIR` (studies/scaffold.py): a package that passes its own test and runs
`fedcare demo NAME` at once (here from its source folder, registered by FEDCARE_STUDIES; its
entry point does the same once installed); bad names and existing folders refused; nothing
half-written."""

import json
import os
import subprocess
import sys
import tomllib

import pytest
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.studies import scaffold

NAME = "icu_los"


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    out = tmp_path_factory.mktemp("new") / "icu"
    result = CliRunner().invoke(app, ["new", "study", NAME, str(out)])
    assert result.exit_code == 0, result.output
    assert f"pip install -e {out}" in result.output and f"fedcare demo {NAME}" in result.output
    return out


def test_the_package_declares_its_study_and_ships_its_demo(package):
    meta = tomllib.loads((package / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "fedcare-icu-los"
    assert meta["project"]["entry-points"]["fedcare.studies"] == {NAME: "fedcare_icu_los"}
    assert meta["tool"]["setuptools"]["package-data"] == {"fedcare_icu_los": ["demo.toml"]}
    source = package / "src" / "fedcare_icu_los"
    assert sorted(p.name for p in source.iterdir()) == ["__init__.py", "config.py", "data.py", "demo.toml", "study.py"]
    assert "class IcuLosStudy(RoundsStudy)" in (source / "study.py").read_text()
    assert not [p for p in package.rglob("*") if p.is_file() and "$" in p.read_text()]  # every placeholder filled
    imports = [line for p in source.glob("*.py") for line in p.read_text().splitlines()
               if line.startswith(("from fedcare", "import fedcare"))]
    assert imports and all(line.startswith(("from fedcare.api import", "from fedcare_icu_los")) for line in imports)


@pytest.mark.timeout(600)
def test_its_own_test_passes_and_fedcare_demo_runs_it(package, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(package / "src"), "FEDCARE_STUDIES": f"{NAME}=fedcare_icu_los"}
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(package / "tests")],
                           capture_output=True, text=True, cwd=package, timeout=540)
    assert tests.returncode == 0 and "1 passed" in tests.stdout, tests.stdout + tests.stderr
    demo = subprocess.run([sys.executable, "-m", "fedcare.cli", "demo", NAME, "--out", str(tmp_path / "demo"),
                           "--set", "seeds=[0]", "--set", "train.rounds=2"],
                          capture_output=True, text=True, env=env, timeout=540)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "| fedavg |" in demo.stdout and "| single-site (site" in demo.stdout
    info = json.loads((tmp_path / "demo" / "run.json").read_text())
    assert info["study"] == NAME and info["synthetic"] is True


@pytest.mark.parametrize("name, problem", [("Sepsis", "lower-case"), ("9lives", "lower-case"), ("a-b", "lower-case"),
                                           ("pain", "fedcare has a study of that name")])
def test_a_name_that_is_no_package_name_or_is_taken_is_refused(tmp_path, name, problem):
    result = CliRunner().invoke(app, ["new", "study", name, str(tmp_path / "x")])
    assert result.exit_code == 2 and problem in result.output and not (tmp_path / "x").exists()


def test_an_existing_folder_is_refused_and_left_as_it_was(tmp_path):
    (tmp_path / "mine").mkdir()
    result = CliRunner().invoke(app, ["new", "study", "sepsis", str(tmp_path / "mine")])
    assert result.exit_code == 2 and "already exists" in result.output and list((tmp_path / "mine").iterdir()) == []


def test_a_failure_midway_leaves_nothing(tmp_path, monkeypatch):
    real, written = scaffold.Template.substitute, []

    def fail_on_the_fourth(self, *args, **kwargs):
        written.append(1)
        if len(written) == 4:
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(scaffold.Template, "substitute", fail_on_the_fourth)
    result = CliRunner().invoke(app, ["new", "study", "sepsis", str(tmp_path / "s")])
    assert result.exit_code == 2 and "No space left on device" in result.output
    assert list(tmp_path.iterdir()) == []  # neither the folder nor a temporary sibling

"""The dataset registry (`fedcare.data.registry`): every dataset is a package with a reader, a
synthetic generator and its `fedcare data` commands, found by name."""

import ast
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.data import registry

from support import ROOT


DATA = ROOT / "src" / "fedcare" / "data"


def test_the_registry_lists_the_five_datasets_each_a_package_under_data():
    assert registry.names() == ["unbc", "pamap2", "xray", "surgical", "celeba"]
    for name, package in registry.BUILT_IN.items():
        assert package == f"fedcare.data.{name}" and (DATA / name / "__init__.py").is_file()


@pytest.mark.parametrize("name", registry.names())
def test_each_dataset_provides_a_reader_a_generator_and_its_commands(name):
    modules = {part: registry.part(name, part) for part in registry.PARTS}
    assert any(n.startswith(("load", "read_")) for n in vars(modules["reader"])), name
    assert any(n.startswith("generate_") for n in vars(modules["synthetic"])), name
    commands = modules["commands"]
    for group in ("summary", "synth"):
        table = getattr(commands, group.upper())
        assert table, f"{name} has no {group} command"
        shown = CliRunner().invoke(app, ["data", group, "--help"], env={"COLUMNS": "200"}).output
        for command, function in table.items():
            assert function.__doc__ and f" {command} " in shown, (name, group, command)


def test_an_unknown_dataset_or_part_names_the_registered_ones():
    with pytest.raises(KeyError, match="registered datasets are unbc, pamap2"):
        registry.part("mnist", "reader")
    with pytest.raises(KeyError, match="parts: reader, synthetic, commands"):
        registry.part("unbc", "writer")


def test_building_the_data_commands_loads_no_numeric_library():
    """`fedcare --help` stays fast: a dataset's `__init__` and `commands` import only typer and rich."""
    code = ("import sys, fedcare.cli\n"
            "print(sorted(m for m in ('numpy', 'cv2', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_datasets_do_not_import_each_other():
    """What two datasets share lives in data/ itself (faces, video cache, output helpers)."""
    for name in registry.names():
        others = tuple(f"fedcare.data.{o}" for o in registry.names() if o != name)
        for path in sorted((DATA / name).rglob("*.py")):
            tree = ast.parse(path.read_text())
            imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
            assert not [m for m in imported if m.startswith(others)], path


def test_synth_and_summary_of_xray(tmp_path):
    out = tmp_path / "xray"
    result = CliRunner().invoke(app, ["data", "synth", "xray", str(out), "--scale", "0.001", "--image-size", "16"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["data", "summary", "xray", str(out), "--json"])
    summary = json.loads(result.stdout)
    assert summary["synthetic"] and summary["images"] == 16 and set(summary["classes"].values()) == {4}
    result = CliRunner().invoke(app, ["data", "summary", "xray", str(tmp_path / "absent")])
    assert result.exit_code == 2 and "absent: no such folder" in result.output


def test_synth_and_summary_of_pamap2(tmp_path):
    out = tmp_path / "pamap2"
    result = CliRunner().invoke(app, ["data", "synth", "pamap2", str(out), "--subjects", "2",
                                      "--seconds-per-activity", "1"])
    assert result.exit_code == 0, result.output
    summary = json.loads(CliRunner().invoke(app, ["data", "summary", "pamap2", str(out), "--json"]).stdout)
    assert summary["synthetic"] and summary["subjects"] == [101, 102]
    assert summary["rows"] == sum(s["rows"] for s in summary["per_subject"]) > 0
    assert all(n > 0 for s in summary["per_subject"] for n in s["paper_activity_rows"].values())
    result = CliRunner().invoke(app, ["data", "synth", "pamap2", str(out)])
    assert result.exit_code == 2 and str(out) in result.output

"""A generator's output folder (`fedcare.data.synthetic.output`): `--overwrite` replaces only a
synthetic copy the same generator wrote (its marker), never another folder (issue 35, item 9:
`data synth ... --overwrite` deleted any directory), and a copy being replaced is never lost:
a generator killed between its two renames leaves the old copy, which the next one puts back."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.data.common import SYNTHETIC_MARKER
from fedcare.data.pamap2.synthetic import generate_pamap2
from fedcare.data.synthetic.output import MARKER, OWNER, atomic_directory

SYNTH = ["data", "synth", "pamap2"]
SMALL = ["--subjects", "2", "--seconds-per-activity", "2"]


def test_overwrite_refuses_a_folder_that_is_not_a_synthetic_copy(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    result = CliRunner().invoke(app, [*SYNTH, str(home), *SMALL, "--overwrite"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert f"no {SYNTHETIC_MARKER} in it" in result.output and "never another folder" in result.output
    assert [p.name for p in home.iterdir()] == ["thesis.tex"] and (home / "thesis.tex").read_text() == "years of work"
    assert [p.name for p in tmp_path.iterdir()] == ["home"]  # no sibling left either


def test_overwrite_refuses_another_generators_copy_and_replaces_its_own(tmp_path):
    out = tmp_path / "copy"
    out.mkdir()
    (out / SYNTHETIC_MARKER).write_text(json.dumps({"generator": "fedcare.data.synthetic.xray"}))
    with pytest.raises(FileExistsError, match=r"another generator \(fedcare\.data\.synthetic\.xray\)"):
        generate_pamap2(out, subjects=2, seconds_per_activity=2, overwrite=True)
    (out / SYNTHETIC_MARKER).write_text("{not json")
    with pytest.raises(FileExistsError, match="cannot be read"):
        generate_pamap2(out, subjects=2, seconds_per_activity=2, overwrite=True)
    (out / SYNTHETIC_MARKER).unlink()
    generate_pamap2(tmp_path / "mine", subjects=2, seconds_per_activity=2)
    generate_pamap2(tmp_path / "mine", subjects=3, seconds_per_activity=2, overwrite=True)
    assert len(list((tmp_path / "mine" / "PAMAP2_Dataset" / "Protocol").iterdir())) == 3


def test_a_copy_being_replaced_when_its_generator_died_is_put_back(tmp_path):
    """Killed between moving the old copy aside and moving the new one in: the next generator
    finds `out` missing and the old copy in a dead process's `.old` sibling, and restores it."""
    generate_pamap2(tmp_path / "copy", subjects=2, seconds_per_activity=2)
    before = sorted(p.relative_to(tmp_path / "copy") for p in (tmp_path / "copy").rglob("*"))
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    aside = tmp_path / ".copy.k1ll.old"
    aside.mkdir()
    (aside / OWNER).write_text(json.dumps({"made_by": MARKER, "pid": dead, "host": socket.gethostname()}))
    os.replace(tmp_path / "copy", aside / "old")
    with pytest.raises(FileExistsError, match="exists and is not empty"):  # put back, so not written over
        with atomic_directory(tmp_path / "copy"):
            pass
    assert sorted(p.relative_to(tmp_path / "copy") for p in (tmp_path / "copy").rglob("*")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]

"""`fedcare flower run` when the coordinator crashes under a started run: it says so and prints
the command that continues the run (`--resume`, with the same `--site-keys`), instead of
fedcare 0.2's "flwr run did not start the run". Flower's `flwr` is a stand-in here that
starts run 42 and then loses the SuperLink, as the real one does when the SuperLink is killed
(reproduced on a deployment: "Connection to the SuperLink is unavailable")."""

import os
import sysconfig

import pytest
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.runtime.flower.certs import make_site_key

from support import ROOT

FLWR_LOSING_THE_SUPERLINK = """#!/bin/sh
case "$1" in
  run) echo "Successfully started run 42"; echo "Connection to the SuperLink is unavailable."; exit 1;;
  *) echo "Connection to the SuperLink is unavailable." >&2; exit 1;;
esac
"""


@pytest.fixture
def crashing_coordinator(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "flwr").write_text(FLWR_LOSING_THE_SUPERLINK)
    (bin_dir / "flwr").chmod(0o755)
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), sysconfig.get_path("scripts"), os.environ["PATH"]]))
    for site in ("hospital-a", "hospital-b", "hospital-c"):
        make_site_key(tmp_path / "certs", site)
    return tmp_path


def _run(root):
    return CliRunner().invoke(app, ["flower", "run", str(ROOT / "configs/pain/sites.toml"), "--federation", "hospitals",
                                    "--out", str(root / "runs" / "pfdl"), "--site-keys", str(root / "certs" / "keys")])


def test_a_crashed_coordinator_is_named_with_the_resume_command(crashing_coordinator):
    root = crashing_coordinator
    partial = root / "runs" / "pfdl.partial"
    partial.mkdir(parents=True)  # the ServerApp had finished a unit (the coordinator is this machine)
    (partial / "checkpoint.pt").write_bytes(b"")
    result = _run(root)
    assert result.exit_code == 2
    message = " ".join(result.output.split())  # rich wraps the line
    assert ("error: run 42 started, then the SuperLink stopped answering (flwr run exited with 1): the coordinator "
            f"crashed or was stopped. Its finished units are kept in {partial}; once the SuperLink is back (restarted "
            f"with the same --database), continue with: fedcare flower run --resume {partial} --federation hospitals "
            f"--site-keys {root / 'certs' / 'keys'}") in message
    assert "did not start the run" not in message


def test_without_a_visible_checkpoint_the_command_is_given_for_the_coordinators_machine(crashing_coordinator):
    root = crashing_coordinator
    message = " ".join(_run(root).output.split())
    assert (f"If {root / 'runs' / 'pfdl.partial' / 'checkpoint.pt'} exists on the coordinator's machine, its finished "
            f"units are kept: once the SuperLink is back") in message
    assert f"fedcare flower run --resume {root / 'runs' / 'pfdl.partial'} --federation hospitals --site-keys" in message

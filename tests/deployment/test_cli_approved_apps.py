"""`fedcare flower app-digest` and `fedcare flower supernode --approved-apps`: the digest a
coordinator publishes and a site approves is the one of the app `fedcare flower run` sends; a
SuperNode with an allow-list hands it to its warm launcher, and refuses one it cannot use."""

import shutil

from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.deployment.cli import app_dir
from fedcare.runtime.flower.approval import app_digest, read_approved


def test_app_digest_prints_the_digest_of_the_app_flower_run_sends_and_approves_it(tmp_path):
    shutil.copytree(app_dir(), tmp_path / "app")  # what `fedcare flower run` hands `flwr run`
    result = CliRunner().invoke(app, ["flower", "app-digest"])
    assert result.exit_code == 0 and result.stdout.strip() == app_digest(tmp_path / "app")
    allow = tmp_path / "site" / "approved.txt"
    allow.parent.mkdir()
    approved = CliRunner().invoke(app, ["flower", "app-digest", "--approve", str(allow)])
    assert approved.exit_code == 0 and "approved it" in approved.stderr
    assert read_approved(allow) == {app_digest(tmp_path / "app")}
    again = CliRunner().invoke(app, ["flower", "app-digest", "--approve", str(allow)])
    assert "approves it already" in again.stderr and len(allow.read_text().splitlines()) == 1
    allow.write_text("not a digest\n")
    bad = CliRunner().invoke(app, ["flower", "app-digest", "--approve", str(allow)])
    assert bad.exit_code == 2 and "line 1: 'not' is not an app digest" in bad.stderr


def _supernode(tmp_path, *extra):
    return CliRunner().invoke(app, ["flower", "supernode", "--site", "a", "--data-dir", str(tmp_path),
                                    "--state-dir", str(tmp_path / "state"), "--insecure", "--port", "9555",
                                    "--dry-run", *extra])


def test_supernode_hands_its_allow_list_to_the_warm_launcher_or_refuses_it(tmp_path):
    allow = tmp_path / "approved.txt"
    allow.write_text("0" * 64 + "\n")
    result = _supernode(tmp_path, "--approved-apps", str(allow))
    assert result.exit_code == 0, result.output
    launcher = result.stdout.splitlines()[0]
    assert launcher.endswith(f"--approved-apps {allow.resolve()} &")
    no_warm = _supernode(tmp_path, "--approved-apps", str(allow), "--no-warm")
    assert no_warm.exit_code == 2 and "cannot with --no-warm" in no_warm.stderr
    allow.write_text("")
    empty = _supernode(tmp_path, "--approved-apps", str(allow))
    assert empty.exit_code == 2 and "approves no app" in empty.stderr
    missing = CliRunner().invoke(app, ["flower", "clientapps", "--approved-apps", str(tmp_path / "nope.txt")])
    assert missing.exit_code == 2 and "nope.txt: cannot be read" in missing.stderr

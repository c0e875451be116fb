"""Sites that run only approved apps (`fedcare.runtime.flower.approval`): an app's digest is
its FAB's, as Flower builds and names it; a FAB one byte away from an approved one is refused
before Flower installs it; the allow-list's mistakes are named by line. (Deployed: a SuperNode
with an allow-list is refused by the coordinator in tests/deployment/test_cli_deployed_pain.py.)"""

import hashlib
import json
import os
import shutil

import pytest

from fedcare.deployment.cli import app_dir
from fedcare.runtime.flower import warm
from fedcare.runtime.flower.approval import (
    ApprovalError, AppNotApproved, app_digest, approve_only, build_fab, check_app, read_approved,
)


@pytest.fixture
def fabs(tmp_path):
    """(fedcare's app as `flwr run` builds it, the same app with one byte changed)."""
    shutil.copytree(app_dir(), tmp_path / "app")
    shutil.copytree(app_dir(), tmp_path / "changed")
    toml = tmp_path / "changed" / "pyproject.toml"
    text = toml.read_text()
    toml.write_text(text.replace('version = "0.1.0"', 'version = "0.1.1"', 1))
    assert sum(a != b for a, b in zip(text, toml.read_text())) == 1
    return build_fab(tmp_path / "app"), build_fab(tmp_path / "changed")


def test_an_apps_digest_is_its_fabs_as_flower_names_it(fabs, tmp_path):
    fab, changed = fabs
    assert app_digest(tmp_path / "app") == hashlib.sha256(fab).hexdigest() == app_digest(tmp_path / "app")
    assert app_digest(tmp_path / "changed") != app_digest(tmp_path / "app")


def test_an_app_one_byte_away_from_the_approved_one_is_refused(fabs, tmp_path):
    fab, changed = fabs
    approved = frozenset({hashlib.sha256(fab).hexdigest()})
    check_app(fab, approved, "approved.txt")
    with pytest.raises(AppNotApproved, match=rf"the app it was sent \(sha256 {hashlib.sha256(changed).hexdigest()}\) "
                                             r"is not in approved.txt; nothing of it was installed or run"):
        check_app(changed, approved, "approved.txt")


def test_the_allow_list_reads_digests_and_names_a_bad_line(tmp_path):
    path = tmp_path / "approved.txt"
    path.write_text(f"# the apps this site runs\n\n{'A' * 64}  fedcare 0.2.0 app, approved 2026-11-30\n{'b' * 64}\n")
    assert read_approved(path) == {"a" * 64, "b" * 64}
    path.write_text(f"{'a' * 64}\nsha256:{'b' * 64}\n")
    with pytest.raises(ApprovalError, match=r"approved.txt line 2: 'sha256:bbbb.*' is not an app digest"):
        read_approved(path)
    path.write_text("# nothing yet\n")
    with pytest.raises(ApprovalError, match="approves no app"):
        read_approved(path)
    with pytest.raises(ApprovalError, match="cannot be read"):
        read_approved(tmp_path / "missing.txt")


def test_flowers_install_step_checks_the_fab_first(fabs, monkeypatch, capsys):
    from flwr.supernode.runtime import run_clientapp

    fab, changed = fabs
    installed = []
    monkeypatch.setattr(run_clientapp, "install_from_fab", lambda content, **kw: installed.append(content))
    approve_only(frozenset({hashlib.sha256(fab).hexdigest()}), "approved.txt")
    run_clientapp.install_from_fab(fab, skip_prompt=True)
    with pytest.raises(AppNotApproved):
        run_clientapp.install_from_fab(changed, skip_prompt=True)
    assert installed == [fab]  # the refused one never reached Flower's installer
    assert "fedcare: refused an app: this site runs only approved apps" in capsys.readouterr().err


def test_the_warm_launchers_children_check_each_app_when_the_site_keeps_an_allow_list(fabs, tmp_path, monkeypatch):
    from flwr.proto.runtime_pb2 import AcquireTaskResponse
    from flwr.proto.task_pb2 import Task
    from flwr.supercore.runtime import RuntimeHttpClient

    class Api:  # the SuperNode's Runtime API: one task
        responses = [AcquireTaskResponse(task=Task(task_id=1), token="t")]

        def AcquireTask(self, request):
            return self.responses.pop(0) if self.responses else AcquireTaskResponse()

        def close(self):
            pass

    monkeypatch.setattr(RuntimeHttpClient, "from_server_address", classmethod(lambda cls, **kw: Api()))

    def fake_run_task(address, token, parent_pid):  # in the forked child: is Flower's installer the checking one?
        from flwr.supernode.runtime import run_clientapp

        try:
            run_clientapp.install_from_fab(fabs[1])
            outcome = "installed"
        except AppNotApproved:
            outcome = "refused"
        (tmp_path / "child.json").write_text(json.dumps({"outcome": outcome, "pid": os.getpid()}))
        return 0

    monkeypatch.setattr(warm, "run_task", fake_run_task)
    allow = tmp_path / "approved.txt"
    allow.write_text(hashlib.sha256(fabs[0]).hexdigest() + "\n")
    warm.serve("127.0.0.1:1", modules=[], poll_interval=0.01, max_tasks=1, approved_apps=allow)
    child = json.loads((tmp_path / "child.json").read_text())
    assert child == {"outcome": "refused", "pid": child["pid"]} and child["pid"] != os.getpid()

"""The warm ClientApp launcher (`fedcare.runtime.flower.warm`, `fedcare flower clientapps`) and
how `fedcare flower supernode` starts it. That a deployment answers through it, with the
simulator's numbers, is tested end to end in tests/deployment/test_cli_deployed_pain.py."""

import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from flwr.proto.runtime_pb2 import AcquireTaskResponse
from flwr.proto.task_pb2 import Task
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.runtime.flower import warm
from fedcare.runtime.flower.processes import free_port

from support.site_processes import alive_in_group, describe, fake_supernode, wait_until


def _supernode(tmp_path, *extra):
    result = CliRunner().invoke(app, ["flower", "supernode", "--site", "a", "--data-dir", str(tmp_path),
                                      "--state-dir", str(tmp_path / "state"), "--insecure", "--port", "9555",
                                      "--dry-run", *extra])
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def test_supernode_starts_the_warm_launcher_next_to_a_process_isolated_supernode(tmp_path):
    launcher, supernode = _supernode(tmp_path, "--preload", "my_app")
    assert "flower clientapps --runtime-api 127.0.0.1:9555 --parent-pid" in launcher
    assert launcher.endswith("--preload my_app &")
    assert supernode.startswith("flower-supernode ") and supernode.endswith("--isolation process")


def test_supernode_no_warm_is_flowers_own_clientapp_process_per_message(tmp_path, monkeypatch):
    monkeypatch.delenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", raising=False)
    (supernode,) = _supernode(tmp_path, "--no-warm")
    # Flower's SuperExec, told to look for work every 0.1 s instead of every second
    assert supernode.startswith("FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.1 flower-supernode ")
    assert "--isolation" not in supernode
    monkeypatch.setenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "2")  # the site's own setting wins
    (supernode,) = _supernode(tmp_path, "--no-warm")
    assert supernode.startswith("flower-supernode ")


def test_clientapps_refuses_a_poll_interval_flower_would_not_take():
    result = CliRunner().invoke(app, ["flower", "clientapps", "--poll-interval", "0"])
    assert result.exit_code == 2 and "--poll-interval" in result.output


class _FakeRuntimeApi:
    """The SuperNode's Runtime API as the launcher sees it: two tasks, then nothing."""

    def __init__(self):
        self.responses = [AcquireTaskResponse(task=Task(task_id=1), token="token-1"), AcquireTaskResponse(),
                          AcquireTaskResponse(task=Task(task_id=2), token="token-2")]
        self.closed = False

    def AcquireTask(self, request):  # Flower's method name
        assert list(request.supported_task_types) == ["flwr-clientapp"]
        return self.responses.pop(0) if self.responses else AcquireTaskResponse()

    def close(self):
        self.closed = True


def test_every_task_runs_in_its_own_forked_process_with_its_token(tmp_path, monkeypatch):
    from flwr.supercore.runtime import RuntimeHttpClient

    api = _FakeRuntimeApi()
    monkeypatch.setattr(RuntimeHttpClient, "from_server_address", classmethod(lambda cls, **kw: api))

    def fake_run_task(address, token, parent_pid):  # in the child
        (tmp_path / f"{token}.json").write_text(json.dumps({"address": address, "pid": os.getpid(),
                                                            "parent": parent_pid}))
        return 0

    monkeypatch.setattr(warm, "run_task", fake_run_task)
    warm.serve("127.0.0.1:1", modules=[], poll_interval=0.01, max_tasks=2)
    runs = [json.loads((tmp_path / f"token-{i}.json").read_text()) for i in (1, 2)]  # serve waited for both
    assert [r["address"] for r in runs] == ["127.0.0.1:1"] * 2
    assert {r["parent"] for r in runs} == {os.getpid()}
    assert len({r["pid"] for r in runs} | {os.getpid()}) == 3  # two children, neither is this process
    assert api.closed


@pytest.mark.parametrize("exit_code, expected", [(0, 0), (None, 0), (3, 3), ("failed", 1)])
def test_run_task_returns_flowers_exit_code_instead_of_exiting(monkeypatch, exit_code, expected):
    import flwr.supernode.runtime.run_clientapp as flower_clientapp

    def fake_run_clientapp(**kwargs):
        assert kwargs["token"] == "t" and kwargs["insecure"] and not kwargs["runtime_dependency_install"]
        raise SystemExit(exit_code)

    monkeypatch.setattr(flower_clientapp, "run_clientapp", fake_run_clientapp)
    assert warm.run_task("127.0.0.1:1", "t") == expected


# -- the launcher dies with its SuperNode, and its ClientApps with it -------------------------


def _start_site(tmp_path, behaviour: str) -> subprocess.Popen:
    """`fedcare flower supernode` (the real command, its own process group) with a fake
    `flower-supernode` first on PATH, so only the launcher is fedcare's and Flower's."""
    fake = fake_supernode(tmp_path / "bin", behaviour)
    scripts = sysconfig.get_path("scripts")
    env = {**os.environ, "PATH": os.pathsep.join([str(fake), scripts, os.environ.get("PATH", "")])}
    log = (tmp_path / "site.log").open("w")
    return subprocess.Popen([sys.executable, "-m", "fedcare.cli", "flower", "supernode", "--site", "a", "--data-dir",
                             str(tmp_path), "--state-dir", str(tmp_path / "state"), "--insecure", "--port",
                             str(free_port())], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("end", ["SIGTERM", "SIGKILL", "refused"])
def test_nothing_of_the_site_outlives_its_supernode_even_unreaped(tmp_path, end):
    """The SuperNode is SIGTERMed or SIGKILLed once the launcher serves it, or exits at once (as one
    refused at activation or failing TLS does), and nobody reaps it (a supervisor that reaps late):
    its launcher ends all the same, so a SuperNode restarted on its port is never served by it
    (fedcare 0.2's launcher watched the pid, which a zombie keeps)."""
    site = _start_site(tmp_path, "refused" if end == "refused" else "runs")
    try:
        if end != "refused":
            assert wait_until(lambda: "fedcare ClientApp launcher" in (tmp_path / "site.log").read_text(), 120)
            assert len(alive_in_group(site.pid)) == 2  # the SuperNode and its launcher
            os.kill(site.pid, getattr(signal, end))  # the SuperNode only, as `kill PID` does
        assert wait_until(lambda: alive_in_group(site.pid) == [], 30), (
            f"left after the SuperNode ended: {describe(alive_in_group(site.pid))}\n{(tmp_path / 'site.log').read_text()}")
        assert Path(f"/proc/{site.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"  # still unreaped
    finally:
        try:
            os.killpg(site.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        site.wait()


@pytest.mark.timeout(180)
def test_a_forked_clientapp_ends_with_the_supernode(tmp_path):
    """A ClientApp still running (say, waiting for a message's content that a crashed coordinator
    never sends) when the SuperNode ends: the launcher and the ClientApp both end."""
    end_of_supernode, supernode_alive = os.pipe()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    launcher = subprocess.Popen([sys.executable, "-m", "support.site_processes", str(end_of_supernode), str(tmp_path)],
                                pass_fds=(end_of_supernode,), env=env)
    os.close(end_of_supernode)
    try:
        assert wait_until(lambda: (tmp_path / "clientapp.pid").is_file(), 120), "the ClientApp never started"
        clientapp = int((tmp_path / "clientapp.pid").read_text())
        time.sleep(1)
        assert launcher.poll() is None and Path(f"/proc/{clientapp}").exists()
        os.close(supernode_alive)  # the SuperNode ends
        launcher.wait(30)
        assert wait_until(lambda: not Path(f"/proc/{clientapp}").exists(), 10), "the forked ClientApp outlived it"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_clientapps_refuses_a_parent_pipe_that_is_not_open():
    result = CliRunner().invoke(app, ["flower", "clientapps", "--parent-pipe", "987"])
    assert result.exit_code == 2 and "--parent-pipe 987: not an open file descriptor" in result.output

"""The warm ClientApp launcher (`fedcare.runtime.flower.warm`, `fedcare flower clientapps`) and
how `fedcare flower supernode` starts it. That a deployment answers through it, with the
simulator's numbers, is tested end to end in tests/deployment/test_cli_deployed_pain.py."""

import json
import os

import pytest
from flwr.proto.runtime_pb2 import AcquireTaskResponse
from flwr.proto.task_pb2 import Task
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.runtime.flower import warm


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

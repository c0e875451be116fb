"""A site's processes on this machine, for the tests of the warm launcher's life: the processes
of a process group that have not ended, a fake `flower-supernode` to put first on PATH, and a
launcher whose SuperNode is a pipe the test holds (`python -m support.site_processes PIPE DIR`:
it serves one task, whose ClientApp writes its pid to DIR/clientapp.pid and then waits forever)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def alive_in_group(pgid: int) -> list[int]:
    """The pids of process group `pgid` that have not ended (zombies count as ended)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            alive.append(int(stat.parent.name))
    return alive


def describe(pids: list[int]) -> str:
    """Each process's pid, state and command line (for a failure's message)."""
    lines = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            lines.append(f"{pid} {state} {Path(f'/proc/{pid}/cmdline').read_text().replace(chr(0), ' ')}")
        except OSError:
            lines.append(f"{pid} ended")
    return "\n".join(lines)


def fake_supernode(folder: Path, behaviour: str) -> Path:
    """A folder holding a `flower-supernode` that waits ("runs", until it is killed) or exits
    with 1 at once ("refused", as a SuperNode refused at activation or failing TLS does)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "flower-supernode"
    script.write_text("#!/bin/sh\n" + ("exec sleep 600\n" if behaviour == "runs" else "exit 1\n"))
    script.chmod(0o755)
    return folder


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _serve_one_hanging_task(pipe: int, folder: Path) -> None:
    from flwr.proto.runtime_pb2 import AcquireTaskResponse
    from flwr.proto.task_pb2 import Task
    from flwr.supercore.runtime import RuntimeHttpClient

    from fedcare.runtime.flower import warm

    class OneTask:
        responses = [AcquireTaskResponse(task=Task(task_id=1), token="t")]

        def AcquireTask(self, request):  # Flower's method name
            return self.responses.pop(0) if self.responses else AcquireTaskResponse()

        def close(self):
            pass

    def hang(address, token, parent_pid):  # a ClientApp that never ends by itself
        (folder / "clientapp.pid").write_text(str(os.getpid()))
        time.sleep(600)
        return 0

    RuntimeHttpClient.from_server_address = classmethod(lambda cls, **kw: OneTask())
    warm.run_task = hang
    warm.serve("127.0.0.1:1", modules=[], poll_interval=0.05, parent_pipe=pipe)


if __name__ == "__main__":
    _serve_one_hanging_task(int(sys.argv[1]), Path(sys.argv[2]))

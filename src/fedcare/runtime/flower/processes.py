"""For harnesses that start Flower processes on this machine (tests, benchmarks): free ports,
and stopping what they started. Each process is started in its own process group
(`start_new_session=True`), so its children (SuperExec, ClientApp and ServerApp processes) go
with it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable


def stop_groups(processes: Iterable[subprocess.Popen], grace: float = 15.0) -> None:
    """SIGTERM every group, wait up to `grace` seconds in all, then SIGKILL what is left."""
    processes = list(processes)
    for proc in processes:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for proc in processes:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group
        except ProcessLookupError:
            pass


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0

"""For harnesses that start Flower processes on this machine (tests, benchmarks): free ports,
and stopping what they started. Each process is started in its own process group
(`start_new_session=True`), so its children (SuperExec, ClientApp and ServerApp processes) go
with it."""

from __future__ import annotations

import os
import random
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


def free_port(low: int = 20000, high: int = 32767) -> int:
    """A TCP port in [low, high] that can be bound on 127.0.0.1 now.

    The default range lies below Linux's ephemeral ports (32768-60999): a port from bind(0)
    comes from that range, which every outgoing connection also draws from, so on a busy
    machine a connection could take it in the seconds before the process meant to serve on it
    binds it (a SuperNode then fails with "address already in use")."""
    draw = random.SystemRandom()
    for _ in range(500):
        port = draw.randint(low, high)
        if port_is_free(port):
            return port
    raise RuntimeError(f"no free TCP port between {low} and {high} on 127.0.0.1")


def port_is_free(port: int) -> bool:
    """Whether a server could bind 127.0.0.1:port now, binding it as a SuperNode's Runtime API
    (uvicorn) does: with SO_REUSEADDR, so that a connection of a SuperNode that just ended,
    waiting out TIME-WAIT (a minute on Linux), does not keep the port taken; a listening socket does."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0

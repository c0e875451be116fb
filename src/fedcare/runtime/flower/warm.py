"""A warm ClientApp launcher for a SuperNode started with `--isolation process`.

Flower 1.41 runs every message a site receives in a new `flwr-clientapp` process, started by
the SuperNode's SuperExec: each message pays Python, Flower, torch and the app's imports
again (seconds), and the SuperExec looks for work once a second. With `--isolation process`
the SuperNode starts no SuperExec and waits for an outside process to take its tasks from
its local Runtime API. This module is that process: it imports Flower's ClientApp runtime,
torch (with `torch._dynamo`, which torch.optim imports on first use) and the app's modules
ONCE, then, for every task the SuperNode offers, forks a child that runs Flower's own
`run_clientapp` with the task's token (pull the message, the context and the app; run the
ClientApp; push the reply and the context). The parent never runs a torch operation, so
every child starts from the same clean, imported state, as a new process would; each
message still runs in its own process, which ends when the message is answered.

What Flower does is unchanged: the same Runtime API calls (`AcquireTask` as Flower's
SuperExec does, then `run_clientapp`), the same token per execution, the same app loading
(a module already imported is taken from `sys.modules`, as Flower's `load_app` does).
The Runtime API is the SuperNode's local port on 127.0.0.1 without TLS, as in Flower's own
`subprocess` mode.

With an allow-list of approved apps (`fedcare flower supernode --approved-apps FILE`), each
child checks the app bundle (FAB) it pulls before Flower installs or loads anything of it, and
refuses one whose digest is not listed (`fedcare.runtime.flower.approval`).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterable
from pathlib import Path

DEFAULT_PRELOAD = ("fedcare.deployment.app",)  # the ClientApp of `fedcare flower run`
WARM_MODULES = ("torch", "torch._dynamo", "flwr.supernode.runtime.run_clientapp")


def preload(modules: Iterable[str]) -> float:
    """Import Flower's ClientApp runtime, torch and `modules`; seconds taken."""
    t0 = time.perf_counter()
    for name in (*WARM_MODULES, *modules):
        importlib.import_module(name)
    return time.perf_counter() - t0


def run_task(runtime_api_address: str, token: str, parent_pid: int | None = None) -> int:
    """Flower's ClientApp process for one token (what `flwr-clientapp --insecure --token ...`
    runs); returns its exit code instead of exiting."""
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    try:
        run_clientapp(runtime_api_address=runtime_api_address, token=token, insecure=True, certificates=None,
                      parent_pid=parent_pid, runtime_dependency_install=False)
    except SystemExit as e:  # Flower's flwr_exit ends every ClientApp run with sys.exit
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def _child(runtime_api_address: str, token: str, parent_pid: int, approved: frozenset[str] | None = None,
           approved_file: Path | None = None) -> None:
    """In the forked child: run the task (an app not in `approved` refused), then leave without
    running the parent's finalizers (its HTTP client's socket is the parent's)."""
    code = 1
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        if approved is not None:
            from fedcare.runtime.flower.approval import approve_only

            approve_only(approved, approved_file)
        code = run_task(runtime_api_address, token, parent_pid)
    except BaseException:  # noqa: BLE001 - a child must never return into the parent's loop
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(runtime_api_address: str, modules: Iterable[str] = DEFAULT_PRELOAD, parent_pid: int | None = None,
          poll_interval: float = 0.1, max_tasks: int | None = None, approved_apps: Path | None = None) -> None:
    """Take the SuperNode's ClientApp tasks until the SuperNode (`parent_pid`) ends, SIGTERM
    or SIGINT, or `max_tasks` tasks were started (tests). `approved_apps`: the site's
    allow-list of app digests, read once here (a malformed one stops the launcher at start)."""
    approved = None
    if approved_apps is not None:
        from fedcare.runtime.flower.approval import read_approved

        approved = read_approved(approved_apps)
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.app_utils import start_parent_process_monitor
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient

    took = preload(modules)
    from fedcare.runtime.digest import code_digest

    code_digest()  # of the code as imported now: every child's site record names it, not what is on disk later
    only = f"; only the {len(approved)} app(s) approved in {approved_apps}" if approved is not None else ""
    print(f"fedcare ClientApp launcher: imported {', '.join([*WARM_MODULES, *modules])} in {took:.1f} s; "
          f"serving the SuperNode at {runtime_api_address}{only}", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if parent_pid is not None:
        start_parent_process_monitor(parent_pid)  # SIGINT when the SuperNode is gone
    client = RuntimeHttpClient.from_server_address(
        server_address=runtime_api_address, insecure=True, root_certificates=None,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
        retry_invoker=make_simple_http_retry_invoker())
    children: set[int] = set()
    started = 0
    try:
        while max_tasks is None or started < max_tasks:
            _reap(children)
            res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
            if not (res.HasField("task") and res.token):
                time.sleep(poll_interval)
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(runtime_api_address, res.token, os.getppid(), approved, approved_apps)
            children.add(pid)
            started += 1
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
        deadline = time.monotonic() + 10
        while children and time.monotonic() < deadline:  # let running ClientApps push their replies
            _reap(children)
            time.sleep(0.05)


def _reap(children: set[int]) -> None:
    for pid in list(children):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            children.discard(pid)

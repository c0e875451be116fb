"""A warm ClientApp launcher for a SuperNode started with `--isolation process`.

Flower 1.42 runs every message a site receives in a new `flwr-clientapp` process, started by
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

The launcher dies with its SuperNode, however the SuperNode ends (SIGTERM, SIGKILL, refused at
activation, a TLS failure), so a SuperNode restarted on the same port is never served by an old
launcher, and a forked ClientApp dies with its launcher. Flower's own watch (does the parent's
pid still exist?) is not enough: a SuperNode that ended keeps its pid as a zombie until whoever
started it reaps it, which a supervisor or a script may do late or never, and a launcher that
ended stays the SuperNode's zombie while the SuperNode runs. So `fedcare flower supernode`
hands the launcher a pipe that only the SuperNode holds open (`on_exit_of`), and each forked
ClientApp watches for its launcher's end itself (`die_with_launcher`).
"""

from __future__ import annotations

import ctypes
import importlib
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
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


PR_SET_PDEATHSIG = 1  # Linux's prctl option: a signal for this process when its parent ends


def on_exit_of(on_gone: Callable[[], None], *, pipe: int | None = None, pid: int | None = None,
               interval: float = 0.2) -> None:
    """Call `on_gone` in a thread once the SuperNode has ended: the end of `pipe` (the read end of
    a pipe whose write end only the SuperNode holds: it closes when the SuperNode ends, zombie or
    not, on every platform), else once the process `pid` no longer exists (a launcher started by
    hand next to a SuperNode; a zombie counts as alive until it is reaped)."""
    def watch() -> None:
        if pipe is not None:
            while os.read(pipe, 1):  # b"" once every write end is closed
                pass
        else:
            while _exists(pid):
                time.sleep(interval)
        on_gone()

    threading.Thread(target=watch, name="supernode-watch", daemon=True).start()


def _exists(pid: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def die_with_launcher(launcher: int) -> None:
    """In a forked ClientApp: end (SIGKILL) as soon as the launcher `launcher` ends, even while the
    launcher is its SuperNode's unreaped zombie: Linux signals it at once (PR_SET_PDEATHSIG), and
    everywhere a thread sees it handed to another parent."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def _stop(gone: threading.Event, patience: float = 5.0) -> None:
    """The SuperNode has ended: SIGTERM to the main thread itself (it wakes from a sleep or a
    retry's wait at once, where a signal the kernel hands to another thread would wait for the
    main thread's next bytecode), which ends the ClientApps and returns; should it not have
    within `patience` seconds, leave anyway (the ClientApps end with this process)."""
    gone.set()
    signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
    time.sleep(patience)
    os._exit(0)


def _child(runtime_api_address: str, token: str, parent_pid: int, approved: frozenset[str] | None = None,
           approved_file: Path | None = None) -> None:
    """In the forked child: run the task (an app not in `approved` refused), then leave without
    running the parent's finalizers (its HTTP client's socket is the parent's). It dies with the
    launcher."""
    code = 1
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        die_with_launcher(parent_pid)
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
          poll_interval: float = 0.1, max_tasks: int | None = None, parent_pipe: int | None = None,
          approved_apps: Path | None = None) -> None:
    """Take the SuperNode's ClientApp tasks until the SuperNode ends (`parent_pipe` closes, or
    the process `parent_pid` is gone: `on_exit_of`), SIGTERM or SIGINT, or `max_tasks` tasks
    were started (tests). When the SuperNode has ended, the
    running ClientApps are ended too (their replies have nowhere to go); otherwise they get
    up to 10 s to push their replies. `approved_apps`: the site's allow-list of app digests,
    read once here (a malformed one stops the launcher at start)."""
    approved = None
    if approved_apps is not None:
        from fedcare.runtime.flower.approval import read_approved

        approved = read_approved(approved_apps)
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient

    parent_gone = threading.Event()
    on_sigterm = signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if parent_pipe is not None or parent_pid is not None:  # before the imports: a SuperNode refused at once, too
        on_exit_of(lambda: _stop(parent_gone), pipe=parent_pipe, pid=parent_pid)

    took = preload(modules)
    from fedcare.runtime.digest import code_digest

    code_digest()  # of the code as imported now: every child's site record names it, not what is on disk later
    only = f"; only the {len(approved)} app(s) approved in {approved_apps}" if approved is not None else ""
    print(f"fedcare ClientApp launcher: imported {', '.join([*WARM_MODULES, *modules])} in {took:.1f} s; "
          f"serving the SuperNode at {runtime_api_address}{only}", file=sys.stderr, flush=True)
    client = RuntimeHttpClient.from_server_address(
        server_address=runtime_api_address, insecure=True, root_certificates=None,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
        retry_invoker=make_simple_http_retry_invoker())
    children: set[int] = set()
    started = 0
    try:
        while (max_tasks is None or started < max_tasks) and not parent_gone.is_set():
            _reap(children)
            res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
            if not (res.HasField("task") and res.token):
                time.sleep(poll_interval)
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            launcher = os.getpid()
            pid = os.fork()
            if pid == 0:
                _child(runtime_api_address, res.token, launcher, approved, approved_apps)
            children.add(pid)
            started += 1
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stopping already; the watch tells if the SuperNode ends
        client.close()
        _end(children, 10.0, parent_gone)
        signal.signal(signal.SIGTERM, on_sigterm)


def _end(children: set[int], grace: float, cut: threading.Event) -> None:
    """Wait up to `grace` seconds for running ClientApps to push their replies, unless `cut` is
    set (the SuperNode has ended: there is nowhere to push them), then kill the rest."""
    deadline = time.monotonic() + grace
    while children and time.monotonic() < deadline and not cut.is_set():
        _reap(children)
        time.sleep(0.05)
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    while children:
        _reap(children)
        time.sleep(0.01)


def _reap(children: set[int]) -> None:
    for pid in list(children):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            children.discard(pid)

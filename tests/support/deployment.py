"""A Flower deployment on 127.0.0.1 for tests: a SuperLink with TLS and SuperNode
authentication, SuperNodes for named sites, the researcher's `flwr` connection, all started
through `fedcare flower ...` with their own FLWR_HOME and ports. Every process is started in
its own process group and stopped by `close()` (SIGTERM, then SIGKILL), also when a test fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fedcare.runtime.flower.processes import free_port, listening, stop_groups

FEDERATION = "test"


def port() -> int:
    """A free port in this pytest worker's own range (xdist's gw0, gw1, ... get disjoint ranges
    below the ephemeral ports): two workers' deployments never draw the same port, and no
    outgoing connection takes one before its server binds it."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    low = 20000 + 1500 * (worker % 8)
    return free_port(low, low + 1499)
# Puts sitecustomize.py on the SuperNodes' path: a 10 s heartbeat instead of Flower's 30 s, so
# a killed site is marked offline after ~20 s instead of ~60 s (see that file).
SHORT_HEARTBEAT = Path(__file__).parent / "supernode_heartbeat"
TESTS = Path(__file__).parents[1]  # the folder of the support package


class Deployment:
    def __init__(self, root: Path, sites: list[str]):
        self.root = root
        self.certs = root / "certs"
        self.port = port()
        self.processes: dict[str, subprocess.Popen] = {}
        self.researcher_home = root / "home" / "researcher"
        self.researcher_home.mkdir(parents=True)
        made = self.fedcare(["flower", "certs", str(self.certs), *[a for s in sites for a in ("--site", s)]])
        if made.returncode != 0:
            raise RuntimeError(f"fedcare flower certs: {made.stdout}{made.stderr}")
        (self.researcher_home / "config.toml").write_text(
            f'[superlink]\ndefault = "{FEDERATION}"\n\n[superlink.{FEDERATION}]\n'
            f'address = "127.0.0.1:{self.port}"\nroot-certificates = "{self.certs / "ca.crt"}"\n')

    def env(self, home: Path) -> dict:
        home.mkdir(parents=True, exist_ok=True)
        return {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}

    def fedcare(self, args: list[str], home: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "fedcare.cli", *args], env=self.env(home or self.researcher_home),
                              capture_output=True, text=True, timeout=timeout, cwd=self.root)

    def flwr(self, args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["flwr", *args], env=self.env(self.researcher_home), capture_output=True, text=True,
                              timeout=timeout, cwd=self.root)

    def start(self, name: str, args: list[str], env: dict | None = None) -> subprocess.Popen:
        log = (self.root / f"{name}.log").open("w")
        proc = subprocess.Popen([sys.executable, "-m", "fedcare.cli", *args],
                                env={**self.env(self.root / "home" / name), **(env or {})},
                                stdout=log, stderr=subprocess.STDOUT, cwd=self.root, start_new_session=True)
        self.processes[name] = proc
        return proc

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text() if path.exists() else ""

    def start_superlink(self) -> None:
        self.start("superlink", ["flower", "superlink", "--certs", str(self.certs),
                                 "--address", f"127.0.0.1:{self.port}", "--database", str(self.root / "superlink.db")])
        deadline = time.monotonic() + 60
        while not listening(self.port):
            if self.processes["superlink"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the SuperLink did not start:\n" + self.log("superlink"))
            time.sleep(0.2)

    def register(self, *sites: str) -> None:
        """`flwr supernode register` for each site, all at once (each is a `flwr` start-up)."""
        registering = {site: subprocess.Popen(
            ["flwr", "supernode", "register", str(self.certs / "keys" / f"{site}.pub"), FEDERATION],
            env=self.env(self.researcher_home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            cwd=self.root) for site in sites}
        for site, proc in registering.items():
            output, _ = proc.communicate(timeout=180)  # six `flwr` start-ups at once on a loaded machine
            if proc.returncode != 0:
                raise RuntimeError(f"flwr supernode register {site}: {output}")

    def start_site(self, site: str, data_dir: Path, *extra: str, name: str | None = None,
                   root_certificates: Path | None = None, auth_key: Path | None = None,
                   path: tuple[Path, ...] = (), env: dict | None = None) -> subprocess.Popen:
        """A SuperNode for `site` (process name `name`, default the site), trusting
        `root_certificates` (default the federation's CA), authenticated with `auth_key`
        (default the site's own key), with a 10 s heartbeat; `path`: folders its processes
        import from (e.g. TESTS, for a module of tests/support its launcher preloads); `env`:
        more of its environment (the chaos test's FEDCARE_TEST_FAULTS)."""
        pythonpath = os.pathsep.join(p for p in (str(SHORT_HEARTBEAT), *map(str, path), os.environ.get("PYTHONPATH"))
                                     if p)
        return self.start(name or site, [
            "flower", "supernode", "--site", site, "--data-dir", str(data_dir),
            "--state-dir", str(self.root / "state" / (name or site)), "--superlink", f"127.0.0.1:{self.port}",
            "--root-certificates", str(root_certificates or self.certs / "ca.crt"),
            "--auth-key", str(auth_key or self.certs / "keys" / site), "--port", str(port()), *extra],
            env={"PYTHONPATH": pythonpath, **(env or {})})

    def kill(self, name: str) -> None:
        """SIGKILL a process group: a site that crashes, not one that says goodbye."""
        proc = self.processes.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def kill_coordinator(self) -> None:
        """SIGKILL the coordinator's host: the ServerApp (in the group of the SuperExec that the SuperLink
        started in a session of its own, which names the SuperLink's pid), the SuperLink, `flwr run`
        (the process named "researcher")."""
        superlink = self.processes["superlink"].pid
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if f"--parent-pid\0{superlink}\0" in cmdline.read_text() + "\0":
                    os.killpg(os.getpgid(int(cmdline.parent.name)), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass  # a process that ended meanwhile
        for name in ("superlink", "researcher"):
            if name in self.processes and self.processes[name].poll() is None:
                self.kill(name)
            self.processes.pop(name, None)  # one that already ended

    def close(self) -> None:
        stop_groups(self.processes.values())
        self.processes.clear()


def wait_for(predicate, timeout: float, what: str) -> None:
    """Poll `predicate` every 0.5 s until it holds; TimeoutError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.5)

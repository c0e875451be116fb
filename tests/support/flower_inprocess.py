"""Flower's Simulation Engine without Ray, for fast tests.

The Simulation Engine's only use of Ray is `RayBackend`, the pool that runs a ClientApp on a
(message, context); `simulation_backend()` puts an in-process backend in its place
(`InProcessBackend`, same `Backend` interface), which answers in reverse client order and
starts in well under a second (Ray takes 10 s or more here), and keeps everything else of
Flower's: `run_simulation`, the SuperLink's in-memory LinkState, the Grid, message routing,
node/partition ids and per-node `Context.state`. Ray itself runs in the `flwr run` test.
"""

from __future__ import annotations

import sys
import threading
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

from flwr.app import Context, Message
from flwr.server.superlink.fleet.vce.backend import Backend, BackendConfig


class InProcessBackend(Backend):
    """Runs each ClientApp call in one of the engine's worker threads: what a Ray actor does,
    minus Ray. One worker per node, and a node with a lower partition id answers later, so
    replies reach the ServerApp in reverse client order: aggregation must not depend on it."""

    finished: ClassVar[list[int]] = []  # partition ids in the order their replies were produced
    lock = threading.Lock()

    workers: ClassVar[int] = 3  # nodes of the simulation: set before run_simulation
    state_dir: ClassVar[str] = ""  # each node's --state-dir is <state_dir>/<partition id> (none if "")

    def __init__(self, backend_config: BackendConfig) -> None:
        self.app_fn = None

    def build(self, app_fn) -> None:
        self.app_fn = app_fn

    @property
    def num_workers(self) -> int:
        return InProcessBackend.workers

    def is_worker_idle(self) -> bool:
        return True

    def terminate(self) -> None:
        pass

    def process_message(self, message: Message, context: Context) -> tuple[Message, Context]:
        if self.state_dir:
            context.node_config["state-dir"] = f"{self.state_dir}/{context.node_config['partition-id']}"
        with self.lock:  # `tiny_model` seeds torch's global generator: not thread-safe
            reply = self.app_fn()(message=message, context=context)
        pid = int(context.node_config["partition-id"])
        time.sleep(0.1 * (self.workers - 1 - pid))
        self.finished.append(pid)
        return reply, context


@contextmanager
def simulation_backend() -> Iterator[str]:
    name = "flwr.server.superlink.fleet.vce.backend.raybackend"
    module = types.ModuleType(name)
    module.RayBackend = InProcessBackend
    saved = sys.modules.get(name)
    sys.modules[name] = module
    try:
        yield "in-process"  # any name but "ray" skips run_simulation's Ray check
    finally:
        if saved is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = saved


def run_experiment_on_flower(config, out, sites: int, name: str = "experiment.toml", *, state_dir=None,
                             resume=None, **run_config) -> None:
    """`config` on Flower's Simulation Engine (in process), `sites` SuperNodes, into `out`: the
    same ServerApp and ClientApp `fedcare flower` deploys. `state_dir`: where the sites keep
    their state; `resume`: continue that interrupted run's partial directory instead;
    `run_config`: more of its run config."""
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    from fedcare.config import to_toml
    from fedcare.deployment.app import client_app, run_experiment

    server = ServerApp()

    @server.main()
    def main(grid, context):
        run_experiment(grid, {"experiment": to_toml(config), "experiment-name": name, "out": str(out),
                              "resume": str(resume or ""), **run_config})

    InProcessBackend.workers = sites
    InProcessBackend.state_dir = str(state_dir or "")
    with simulation_backend() as backend:
        run_simulation(server, client_app, num_supernodes=sites, backend_name=backend)

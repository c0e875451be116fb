"""The experiment of benchmarks/flower_runtimes.py, the same in every runtime, and the Flower
App its deployment runs (components `flower_bench_app:server_app` and `:client_app`).

Everything is deterministic and built in the process that needs it: the model's initial
weights come from a derived generator, each client's data from a generator seeded by its
site name ("site-0", "site-1", ...), so the simulator, Ray's actors, the ServerApp process
and every ClientApp process see the same model and data without sending any.

The deployment's ServerApp and ClientApp read the experiment from the run config (see
`RUN_CONFIG`). The ServerApp writes `server.json` (when its main began, when each round
ended) and `final.pt` (the last global tensors) into the run config's `out` folder; every
ClientApp call appends a line to `out/clients.jsonl` (process start, handler start and end).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

LOADED = time.time()  # this module's import began: the process has started Python and Flower

import torch  # noqa: E402
from flwr.app import Context, Message  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from torch import nn  # noqa: E402

from fedcare.algorithms import fedavg  # noqa: E402
from fedcare.algorithms.base import Algorithm  # noqa: E402
from fedcare.algorithms.training import ClientData, TrainSettings  # noqa: E402
from fedcare.models.pain_cnn import PainCNN, glorot_init  # noqa: E402
from fedcare.runtime.flower import make_client_app, make_server_app  # noqa: E402
from fedcare.seeding import torch_generator  # noqa: E402

IMPORTED = time.time()  # torch, Flower and fedcare are imported

IMAGE_SIZE = {"tiny": 16, "pain": 32}


class TinyMLP(nn.Module):
    """16x16 image -> 160 -> 64 -> 1 logit: 51,489 parameters."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(256, 160), nn.ReLU(), nn.Linear(160, 64), nn.ReLU(),
                                 nn.Linear(64, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(1)


@dataclass(frozen=True)
class Bench:
    """One FedAvg experiment: `clients` sites of `examples` images each, `rounds` rounds of
    `epochs` local epochs (SGD, lr 0.01, batch 32), every client on one thread."""

    model: str = "tiny"
    rounds: int = 3
    clients: int = 3
    examples: int = 200
    epochs: int = 1
    seed: int = 0

    @property
    def sites(self) -> list[str]:
        return [f"site-{i}" for i in range(self.clients)]

    def algorithm(self) -> Algorithm:
        return fedavg(TrainSettings(lr=0.01, batch_size=32, local_epochs=self.epochs))

    def new_model(self) -> nn.Module:
        model = TinyMLP() if self.model == "tiny" else PainCNN(IMAGE_SIZE["pain"])
        glorot_init(model, torch_generator(self.seed, "init", self.model))
        return model

    def data(self, site: str) -> ClientData:
        return client_data(self.model, site, self.examples)

    @classmethod
    def from_run_config(cls, rc) -> Bench:
        return cls(**{k: type(v)(rc[k]) for k, v in asdict(cls()).items()})


@lru_cache(maxsize=None)
def client_data(model: str, site: str, n: int) -> ClientData:
    """`n` uint8 images with binary labels and a learnable signal (brighter top rows when y = 1)."""
    size = IMAGE_SIZE[model]
    g = torch.Generator().manual_seed(1000 + int(site.rsplit("-", 1)[1]))  # node config values are strings
    y = (torch.rand(n, generator=g) < 0.5).float()
    x = torch.randint(0, 200, (n, 1, size, size), generator=g, dtype=torch.uint8)
    x[y == 1, :, : size // 4] += 50
    return ClientData(x, y)


def timed_server_app(bench: Bench, log: dict) -> ServerApp:
    """`make_server_app`'s ServerApp, timed: log["started"] when its main begins,
    log["rounds"] when each round ends (after the clients' evaluation), log["final"] the
    global tensors after the last round. Wall-clock times (time.time()): comparable across
    processes."""
    log.update(started=None, rounds=[], final=None)

    def on_metrics(info: dict) -> None:
        log["rounds"].append(time.time())
        log["final"] = info["global_message"].tensors

    inner = make_server_app(bench.algorithm, bench.new_model, bench.rounds, bench.seed, bench.sites, on_metrics)
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        log["started"] = time.time()
        inner(grid, context)

    return app


def bench_client_app(bench: Bench) -> ClientApp:
    return make_client_app(bench.algorithm, bench.new_model, bench.data, bench.seed, client_ids=bench.sites)


# ------------------------------------------------------------ the deployment's Flower App

# every key `flwr run` may set: written into the app's [tool.flwr.app.config]
RUN_CONFIG = {**asdict(Bench()), "out": ""}


def _process_started() -> float | None:
    """When this process was created (Linux /proc), as time.time()."""
    try:
        after_paren = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        since_boot = int(after_paren[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - since_boot)
    except (OSError, ValueError, IndexError):
        return None


server_app = ServerApp()


@server_app.main()
def _server_main(grid: Grid, context: Context) -> None:
    torch.set_num_threads(1)
    bench, out = Bench.from_run_config(context.run_config), Path(str(context.run_config["out"]))
    log: dict = {}
    timed_server_app(bench, log)(grid, context)
    torch.save(log.pop("final"), out / "final.pt")
    (out / "server.json").write_text(json.dumps({**log, "process": _process_started(), "loaded": LOADED,
                                                 "imported": IMPORTED}))


client_app = ClientApp()
_apps: dict[Bench, ClientApp] = {}


def _client_call(msg: Message, context: Context) -> Message:
    start = time.time()
    torch.set_num_threads(1)
    bench = Bench.from_run_config(context.run_config)
    if bench not in _apps:
        _apps[bench] = bench_client_app(bench)
    reply = _apps[bench](msg, context)
    line = {"site": str(context.node_config.get("site")), "type": msg.metadata.message_type, "pid": os.getpid(),
            "process": _process_started(), "loaded": LOADED, "imported": IMPORTED, "start": start, "end": time.time()}
    with open(Path(str(context.run_config["out"])) / "clients.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")
    return reply


for _register in (client_app.query, client_app.train, client_app.evaluate):
    _register()(_client_call)

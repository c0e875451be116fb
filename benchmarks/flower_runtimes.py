"""The same FedAvg experiment in three runtimes, timed in one run:

1. fedcare's in-process simulator (`Federation.run_round` + `Federation.evaluate`);
2. Flower's Simulation Engine with Ray (`run_simulation`, one CPU per client actor), the
   whole run including Ray's start-up and shutdown;
3. Flower's Deployment Engine on 127.0.0.1: a SuperLink and one SuperNode per client started
   with `fedcare flower superlink/supernode --insecure`, the run started with `flwr run`
   (its wall time; the SuperLink and SuperNodes are started once beforehand, not counted),
   twice: "cold", Flower's own new `flwr-clientapp` process per message (`supernode
   --no-warm`), and "warm", each message in a process forked from one warm launcher per
   SuperNode (`supernode --preload flower_bench_app`, fedcare's default).

Flower runs `make_server_app` / `make_client_app`; the experiment (model, data, settings)
is in benchmarks/flower_bench_app.py, which is also the deployment's Flower App. A round
is one FedAvg round plus every client's evaluation of the new global model; every client
trains on one thread (so all runtimes give the same bits); the simulator runs the clients
one after another, Flower may run two at once on two cores. Prints, per model, whole-run
and per-round seconds with ratios to the simulator, whether the final global weights agree,
and where the deployment's time goes.

    python benchmarks/flower_runtimes.py [--rounds 3] [--clients 3] [--examples 200] [--models tiny,pain]
                                         [--deployments cold,warm]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: Ray's actors and the deployment inherit it

import torch  # noqa: E402
from flower_bench_app import RUN_CONFIG, Bench, bench_client_app, timed_server_app  # noqa: E402

from fedcare.runtime.flower.processes import free_port, listening, stop_groups  # noqa: E402
from fedcare.runtime.federation import Federation  # noqa: E402

HERE = Path(__file__).resolve().parent
FEDERATION = "bench"
FINISHED_OK = "finished:completed"


@dataclass
class Result:
    runtime: str
    whole: float  # seconds, the whole run
    rounds: list[float]  # seconds per round; round 1 from the start of the server's main
    final: dict[str, torch.Tensor]
    notes: dict = field(default_factory=dict)


def warm_up() -> float:
    """Pay this process's one-time costs before timing anything (torch.optim's first use
    imports torch._dynamo, several seconds): the simulator and Ray's driver are timed warm;
    Ray's actors and the deployment's processes pay their own."""
    t0 = time.time()
    model = torch.nn.Linear(2, 1)
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    return time.time() - t0


def per_round(started: float, ends: list[float]) -> list[float]:
    return [b - a for a, b in zip([started, *ends], ends)]


# ------------------------------------------------------------------------------ runtimes


def run_simulator(bench: Bench) -> Result:
    t0 = time.time()
    federation = Federation(bench.new_model(), bench.algorithm(), bench.seed)
    train = {site: bench.data(site) for site in bench.sites}
    ends = []
    for rnd in range(1, bench.rounds + 1):
        federation.run_round("train", rnd, train)
        federation.evaluate(train, "loss")
        ends.append(time.time())
    return Result("fedcare simulator", time.time() - t0, per_round(t0, ends), federation.global_message.tensors)


def run_ray(bench: Bench) -> Result:
    import ray
    from flwr.simulation import run_simulation

    log: dict = {}
    t0 = time.time()
    try:
        run_simulation(timed_server_app(bench, log), bench_client_app(bench), num_supernodes=bench.clients,
                       backend_name="ray", backend_config={"client_resources": {"num_cpus": 1}})
        whole = time.time() - t0
    finally:
        if ray.is_initialized():  # Flower shuts Ray down itself; this is for a failed run
            ray.shutdown()
    if len(log["rounds"]) != bench.rounds:
        raise RuntimeError(f"Flower simulation ended after {len(log['rounds'])} of {bench.rounds} rounds (see its log)")
    return Result("Flower simulation (Ray)", whole, per_round(log["started"], log["rounds"]), log["final"],
                  {"before main": log["started"] - t0})


APP_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedcare-runtime-bench"
version = "0.1.0"
description = "benchmarks/flower_runtimes.py: the deployment's app"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedcare"

# flower_bench_app is on PYTHONPATH in the SuperLink, the SuperNodes and flwr
[tool.flwr.app.components]
serverapp = "flower_bench_app:server_app"
clientapp = "flower_bench_app:client_app"

[tool.flwr.app.config]
"""


class Deployment:
    """A SuperLink and one SuperNode per site on 127.0.0.1 (insecure: a local benchmark),
    each in its own process group with its own FLWR_HOME; `close()` stops them all."""

    def __init__(self, root: Path, sites: list[str], mode: str):
        self.root = root
        warm = mode != "cold"
        self.fast_poll = mode == "warm-fastpoll"
        self.name = {"cold": "Flower deployment, cold", "warm": "Flower deployment, warm",
                     "warm-fastpoll": "deployment, warm, 0.05s poll"}[mode]
        self.port = free_port()
        self.processes: dict[str, subprocess.Popen] = {}
        self.app = root / "app"
        self.app.mkdir()
        (self.app / "pyproject.toml").write_text(
            APP_PYPROJECT + "".join(f"{k} = {json.dumps(v)}\n" for k, v in RUN_CONFIG.items()))
        (self.home("flwr") / "config.toml").write_text(
            f'[superlink]\ndefault = "{FEDERATION}"\n\n[superlink.{FEDERATION}]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n')
        t0 = time.time()
        try:
            self.start("superlink", ["superlink", "--insecure", "--address", f"127.0.0.1:{self.port}",
                                     "--database", str(root / "superlink.db")])
            self.wait(lambda: listening(self.port), "superlink", "the SuperLink did not start")
            for site in sites:
                data = root / "data" / site
                data.mkdir(parents=True)  # unused: a factory site generates its data
                self.start(site, ["supernode", "--insecure", "--site", site, "--data-dir", str(data),
                                  "--state-dir", str(root / "state" / site), "--superlink", f"127.0.0.1:{self.port}",
                                  "--port", str(free_port()),
                                  *(["--preload", "flower_bench_app"] if warm else ["--no-warm"])])
            ready = "fedcare ClientApp launcher" if warm else "SuperNode ID"  # warm: its imports are done
            for site in sites:
                self.wait(lambda: "SuperNode ID" in self.log(site) and ready in self.log(site), site,
                          f"SuperNode {site} did not connect")
        except BaseException:
            self.close()
            raise
        self.startup = time.time() - t0

    def home(self, name: str) -> Path:
        home = self.root / "home" / name
        home.mkdir(parents=True, exist_ok=True)
        return home

    def env(self, name: str) -> dict:
        what_if = [str(HERE / "supernode_poll")] if self.fast_poll else []
        path = os.pathsep.join([*what_if, str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
        return {**os.environ, "FLWR_HOME": str(self.home(name)), "PYTHONPATH": path, "OMP_NUM_THREADS": "1",
                "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}

    def start(self, name: str, args: list[str]) -> None:
        with (self.root / f"{name}.log").open("w") as log:
            self.processes[name] = subprocess.Popen(
                [sys.executable, "-m", "fedcare.cli", "flower", *args], env=self.env(name), cwd=self.root,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait(self, ready, name: str, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.processes[name].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what}:\n{self.log(name)[-3000:]}")
            time.sleep(0.2)

    def flwr(self, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(["flwr", *args], env=self.env("flwr"), cwd=self.root, capture_output=True, text=True,
                              timeout=timeout)

    def status(self, run_id: int) -> dict:
        out = self.flwr(["ls", FEDERATION, "--run-id", str(run_id), "--format", "json"], 60)
        try:
            return json.loads(out.stdout)["runs"][0]
        except (json.JSONDecodeError, KeyError, IndexError):
            raise RuntimeError(f"flwr ls gave no status for run {run_id}: {out.stdout}{out.stderr}") from None

    def run(self, bench: Bench) -> Result:
        out = self.root / f"run-{bench.model}"
        out.mkdir()
        run_config = self.root / f"run-{bench.model}.toml"
        run_config.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in {**vars(bench), "out": str(out)}.items()))
        t0 = time.time()
        proc = self.flwr(["run", str(self.app), FEDERATION, "--run-config", str(run_config), "--stream"], 3600)
        whole = time.time() - t0
        (self.root / f"flwr-run-{bench.model}.log").write_text(proc.stdout + proc.stderr)
        match = re.search(r"Successfully started run (\d+)", proc.stdout)
        if proc.returncode != 0 or match is None:
            raise RuntimeError(f"flwr run did not start the run:\n{proc.stdout}{proc.stderr}")
        run_id = int(match.group(1))
        status = self.status(run_id)
        while not str(status.get("status", "")).startswith("finished"):  # --stream may return a bit early
            time.sleep(0.5)
            status = self.status(run_id)
        whole_final = time.time() - t0
        if status["status"] != FINISHED_OK:
            raise RuntimeError(f"run {run_id} ended {status['status']}: {status.get('status-details', '')}\n"
                               f"{proc.stdout[-3000:]}\n{self.log('superlink')[-3000:]}")
        server = json.loads((out / "server.json").read_text())
        clients = [json.loads(line) for line in (out / "clients.jsonl").read_text().splitlines()]
        final = torch.load(out / "final.pt", weights_only=True)
        notes = {"t0": t0, "returned": t0 + whole, "status after": whole_final - whole, "server": server,
                 "clients": clients, "exchanges": 1 + 2 * bench.rounds}
        return Result(self.name, whole, per_round(server["started"], server["rounds"]), final,
                      notes)

    def close(self) -> None:
        stop_groups(self.processes.values())
        self.processes.clear()


# ------------------------------------------------------------------------------ report


def compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[bool, float]:
    """(bit-identical?, max |a - b| over all tensors)"""
    if list(a) != list(b):
        return False, float("inf")
    same = all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
    return same, max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def ratio(x: float) -> str:
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def table(bench: Bench, results: list[Result], warm: float) -> list[str]:
    model = bench.new_model()
    sim = results[0]
    lines = [f"== {bench.model}: {type(model).__name__}, {sum(p.numel() for p in model.parameters()):,} parameters; "
             f"{bench.clients} clients x {bench.examples} examples, {bench.rounds} rounds x {bench.epochs} epoch(s) ==",
             f"{'runtime':<30}{'whole s':>9}{'x sim':>8}{'round s':>9}{'x sim':>8}"
             f"{'round 1 s':>11}{'later s':>9}{'outside s':>11}"]
    for r in results:
        mean = statistics.mean(r.rounds)
        later = statistics.mean(r.rounds[1:]) if len(r.rounds) > 1 else float("nan")
        lines.append(f"{r.runtime:<30}{r.whole:>9.2f}{ratio(r.whole / sim.whole):>8}{mean:>9.3f}"
                     f"{ratio(mean / statistics.mean(sim.rounds)):>8}{r.rounds[0]:>11.3f}{later:>9.3f}"
                     f"{r.whole - sum(r.rounds):>11.2f}")
    lines.append("(round s: mean over all rounds; round 1 includes Flower's greeting of the sites; later s: mean "
                 "of rounds 2+; outside s: whole minus the rounds, i.e. start-up and shutdown)")
    for r in results[1:]:
        same, diff = compare(sim.final, r.final)
        lines.append(f"final global weights, {r.runtime} vs simulator: "
                     + ("bit-identical" if same else f"DIFFERENT, max |diff| = {diff:.3g}"))
    for r in results:
        if "clients" in r.notes:
            lines += deployment_breakdown(r, warm)
        elif "before main" in r.notes:
            lines.append(f"{r.runtime}: round 1 includes Ray's start-up and its {bench.clients} actors' imports "
                         f"(the ServerApp's main begins {r.notes['before main']:.2f} s after run_simulation, "
                         f"alongside Ray); after the last round (Ray's shutdown) "
                         f"{r.whole - r.notes['before main'] - sum(r.rounds):.2f} s")
    return lines


def deployment_breakdown(r: Result, warm: float) -> list[str]:
    n, s, clients = r.notes, r.notes["server"], r.notes["clients"]
    mean = lambda xs: statistics.mean(xs) if xs else float("nan")  # noqa: E731
    spawn = mean([c["start"] - c["process"] for c in clients if c["process"]])
    python_flwr = mean([c["loaded"] - c["process"] for c in clients if c["process"]])
    imports = mean([c["imported"] - c["loaded"] for c in clients])
    handler = mean([c["end"] - c["start"] for c in clients])
    kinds: dict[str, list[float]] = {}  # exchange 0 greets, then fit and evaluate alternate
    for k, group in enumerate(_exchanges(clients)):
        kinds.setdefault("greeting" if k == 0 else ("fit", "evaluate")[(k - 1) % 2], []).extend(
            c["end"] - c["start"] for c in group)
    by_kind = ", ".join(f"{kind} {mean(times):.2f} s" for kind, times in kinds.items())
    exchange = (s["rounds"][-1] - s["started"]) / n["exchanges"]
    per_exchange_handler = mean([max(c["end"] - c["start"] for c in group) for group in _exchanges(clients)])
    lines = [f"{r.runtime}, where the time goes:"]
    if s.get("process"):
        lines.append(f"  flwr run -> ServerApp process created          {s['process'] - n['t0']:6.2f} s  "
                     "(flwr CLI, app upload, run queued, SuperExec picks it up)")
        lines.append(f"  ServerApp process -> its main begins           {s['started'] - s['process']:6.2f} s  "
                     f"(of which imports of torch + fedcare {s['imported'] - s['loaded']:.2f} s)")
    lines += [
        f"  main begins -> last round done                 {s['rounds'][-1] - s['started']:6.2f} s  "
        f"({n['exchanges']} exchanges: greeting, then fit + evaluate per round; {exchange:.2f} s each)",
        f"  last round -> flwr run returned                {n['returned'] - s['rounds'][-1]:6.2f} s  "
        f"(+ {n['status after']:.2f} s until flwr ls showed the final status)",
    ]
    forked = all(c["process"] and c["loaded"] < c["process"] for c in clients)  # imported before the process began
    if forked:
        lines.append(
            f"  per ClientApp message ({len(clients)}, each in a process forked from the warm launcher, "
            f"{len({c['pid'] for c in clients})} pids): fork -> handler {spawn:.2f} s (Flower's run_clientapp pulling "
            f"the message and loading the app; imports were done once, when the SuperNode started), handler "
            f"{handler:.2f} s ({by_kind})")
    else:
        lines.append(
            f"  per ClientApp message ({len(clients)}, each in a new process, {len({c['pid'] for c in clients})} pids): "
            f"process start -> handler {spawn:.2f} s (Python + Flower + pulling the message {python_flwr:.2f} s, "
            f"torch + fedcare imports "
            f"{imports:.2f} s), handler {handler:.2f} s ({by_kind}; in a new process, training includes torch.optim's "
            f"first use, which imports torch._dynamo: {warm:.1f} s in this process)")
    lines.append(
        f"  per exchange {exchange:.2f} s ~ slowest handler {per_exchange_handler:.3f} s + ClientApp process start "
        f"{spawn:.2f} s + {exchange - per_exchange_handler - spawn:.2f} s other (Flower's polling: an idle SuperNode "
        + ("pulls every 0.05 s (what-if)" if "0.05s poll" in r.runtime else "pulls every 3 s") + ", "
        + ("the launcher looks for work every 0.1 s" if forked else "its SuperExec looks for work every 0.1 s")
        + (", replies are pushed in 0.05 s steps)" if "0.05s poll" in r.runtime else ", replies are pushed in 0.5 s "
           "steps; a ClientApp or SuperNode that asks for a message's content before it is uploaded retries after "
           "1 s, then 2 s)"))
    return lines


def _exchanges(clients: list[dict]) -> list[list[dict]]:
    """The ClientApp calls grouped by exchange: each site's k-th call belongs to exchange k."""
    by_site: dict[str, list[dict]] = {}
    for c in sorted(clients, key=lambda c: c["start"]):
        by_site.setdefault(c["site"], []).append(c)
    return [list(group) for group in zip(*by_site.values())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="FedAvg rounds per runtime")
    parser.add_argument("--clients", type=int, default=3, help="clients (sites when deployed)")
    parser.add_argument("--examples", type=int, default=200, help="training examples per client")
    parser.add_argument("--epochs", type=int, default=1, help="local epochs per round")
    parser.add_argument("--models", default="tiny,pain", help="comma-separated: tiny (a 51k-parameter MLP on 16x16), "
                                                                "pain (PainCNN(32))")
    parser.add_argument("--deployments", default="cold,warm",
                        help="comma-separated: cold (Flower's new ClientApp process per message), warm (fedcare's "
                             "warm launcher per SuperNode), warm-fastpoll (warm, and the SuperNodes' fixed 3 s and "
                             "0.5 s sleeps cut to 0.05 s by supernode_poll/sitecustomize.py: a what-if, not a "
                             "setting Flower offers); empty for none")
    parser.add_argument("--no-ray", action="store_true", help="skip Flower's Simulation Engine")
    args = parser.parse_args()
    models = args.models.split(",")
    modes = [m for m in args.deployments.split(",") if m]
    if not set(models) <= {"tiny", "pain"} or not set(modes) <= {"cold", "warm", "warm-fastpoll"} or args.rounds < 1 \
            or args.clients < 1:
        parser.error("--models takes tiny and/or pain, --deployments cold, warm and/or warm-fastpoll; --rounds and "
                     "--clients at least 1")
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    torch.set_num_threads(1)
    warm = warm_up()
    benches = [Bench(m, args.rounds, args.clients, args.examples, args.epochs) for m in models]
    reports: list[str] = []
    with tempfile.TemporaryDirectory(prefix="flower-runtimes-") as tmp:
        results = {bench: [run_simulator(bench), *([] if args.no_ray else [run_ray(bench)])] for bench in benches}
        started = []
        for mode in modes:  # one deployment at a time: an idle one still polls (the what-if one every 0.05 s)
            (Path(tmp) / mode).mkdir()
            deployment = Deployment(Path(tmp) / mode, benches[0].sites, mode)
            started.append(f"{deployment.name}: SuperLink + {args.clients} SuperNodes started in "
                           f"{deployment.startup:.1f} s")
            try:
                for bench in benches:
                    results[bench].append(deployment.run(bench))
            finally:
                deployment.close()
        for bench in benches:
            reports += ["", *table(bench, results[bench], warm)]
    print(f"\nsetup: {os.cpu_count()} CPU cores, torch {torch.__version__}, one thread per client; "
          f"{'; '.join(started)} (not counted); this process warmed up in {warm:.1f} s (not counted); "
          f"load average before: {load_before}, after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\n".join(reports))
    if any("DIFFERENT" in line for line in reports):
        sys.exit("the runtimes did not end with the same global weights")


if __name__ == "__main__":
    main()

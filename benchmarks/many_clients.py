"""Many per-patient clients: how time per round and memory grow from 10 to 100 to 1,000
clients, for FedAvg, PFDL and FedBN on FedHealth 2's HAR CNN (synthetic windows, every client
in every round), in three runtimes: fedcare's simulator with clients trained one after another
(`LocalClients`), its vectorised clients (many at a time, `VectorisedClients`), and Flower's
Simulation Engine (Ray, one CPU per client actor) running the same algorithm through fedcare's
ServerApp and ClientApp (`make_server_app`, `make_client_app`).

A round is a training round plus every client's evaluation of the new model (what
`make_server_app` does each round). Time: the second round (the first pays one-off costs:
Ray's start, the sites' greeting), as rounds per second and as a ratio to the simulator's.
Memory: "state MB" is what the clients keep between rounds, measured (the simulator's), next to
clients x private part as the model defines it; "peak RSS MB" is the most the case's processes
held at once, summed over the case's process tree (each case runs in a fresh process; Ray's
processes are its children), data included: for Flower this counts Ray's raylet, GCS and
actors, and memory they share (torch's libraries) once per process.

    python benchmarks/many_clients.py [--clients 10 100 1000] [--methods fedavg pfdl fedbn]
                                      [--runtimes sequential vectorised flower] [--examples 16]
                                      [--threads 2] [--out DIR]

Writes many_clients.csv and many_clients.png into --out (default: the current folder), and
prints the load average before and after.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

METHODS = ("fedavg", "pfdl", "fedbn")
RUNTIMES = ("sequential", "vectorised", "flower")


def algorithm(method: str):
    from fedcare.algorithms import fedavg, fedbn, pfdl
    from fedcare.algorithms.training import TrainSettings
    from fedcare.tasks import MULTICLASS

    settings = TrainSettings(lr=0.01, batch_size=16, local_epochs=1, task=MULTICLASS)
    return {"fedavg": fedavg, "pfdl": lambda s: pfdl(s, finetune_epochs=1), "fedbn": fedbn}[method](settings)


def new_model():
    import torch

    from fedcare.models.har_cnn import HarCNN

    torch.manual_seed(0)
    return HarCNN(window=100)


def client_data(client: int, examples: int):
    """Client `client`'s windows, the same in every process (Ray's actors build their own)."""
    import torch

    from fedcare.algorithms.training import ClientData

    g = torch.Generator().manual_seed(client)
    return ClientData(torch.randn(examples, 27, 100, generator=g), torch.randint(0, 10, (examples,), generator=g))


class TreeMemory:
    """The most memory this process and its descendants held at once (VmRSS summed, /proc),
    sampled every `interval` seconds in a thread."""

    def __init__(self, interval: float = 0.25):
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(interval,), daemon=True)
        self._thread.start()

    def _sample(self, interval: float) -> None:
        while not self._stop.is_set():
            self.peak_kb = max(self.peak_kb, _tree_rss_kb(os.getpid()))
            self._stop.wait(interval)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak_kb, _tree_rss_kb(os.getpid())) / 1024


def _tree_rss_kb(root: int) -> int:
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:  # ended meanwhile
            continue
        pid = int(status.parent.name)
        children.setdefault(int(fields["PPid"]), []).append(pid)
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0])
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def case(method: str, clients: int, examples: int, runtime: str, threads: int) -> dict:
    """One (method, clients, runtime): two rounds in this process (and, for Flower, Ray's); the measurements."""
    import torch

    torch.set_num_threads(threads)
    memory = TreeMemory()
    model = new_model()
    alg = algorithm(method)
    if runtime == "flower":
        seconds, state_bytes = flower_rounds(method, clients, examples), float("nan")
    else:
        seconds, state_bytes = simulator_rounds(model, alg, clients, examples, runtime)
    private = alg.client.split.private_tensors(model)
    return {"method": method, "clients": clients, "runtime": runtime, "round_s": seconds[1], "first_round_s": seconds[0],
            "rounds_per_s": 1 / seconds[1], "state_mb": state_bytes / 2**20,
            "private_mb_per_client": sum(t.numel() * t.element_size() for t in private.values()) / 2**20,
            "model_mb": sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 2**20,
            "peak_rss_mb": memory.stop()}


def simulator_rounds(model, alg, clients: int, examples: int, runtime: str) -> tuple[list[float], int]:
    """Seconds of rounds 1 and 2 (training, then every client's evaluation), and the clients' state in bytes."""
    from fedcare.runtime.clients import LocalClients
    from fedcare.runtime.federation import Federation
    from fedcare.runtime.vectorised import VectorisedClients

    data = {c: client_data(c, examples) for c in range(clients)}
    kind = VectorisedClients if runtime == "vectorised" else LocalClients
    fed = Federation(model, alg, 0, clients=kind(model, alg.client, 0))
    seconds = []
    for rnd in (1, 2):
        start = time.perf_counter()
        fed.run_round("train", rnd, data)
        fed.evaluate(data, "loss")
        seconds.append(time.perf_counter() - start)
    return seconds, sum(t.numel() * t.element_size() for s in fed.states.values() for t in s.values())


def flower_rounds(method: str, clients: int, examples: int) -> list[float]:
    """Seconds of rounds 1 and 2 on Flower's Simulation Engine (Ray, one CPU per actor): round 1
    from run_simulation's call (Ray's start and the sites' greeting included), round 2 alone."""
    from functools import partial

    from flwr.simulation import run_simulation

    from fedcare.runtime.flower import make_client_app, make_server_app

    ends: list[float] = []
    alg = partial(algorithm, method)
    server = make_server_app(alg, new_model, 2, 0, list(range(clients)), lambda info: ends.append(time.perf_counter()))
    client = make_client_app(alg, new_model, partial(client_data, examples=examples), 0, client_ids=list(range(clients)))
    start = time.perf_counter()
    run_simulation(server, client, num_supernodes=clients, backend_name="ray",
                   backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"log_to_driver": False}})
    if len(ends) != 2:
        raise RuntimeError(f"Flower's Simulation Engine ended after {len(ends)} of 2 rounds (see its log)")
    return [ends[0] - start, ends[1] - ends[0]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000], help="federation sizes")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS, help="algorithms")
    parser.add_argument("--runtimes", nargs="+", default=list(RUNTIMES), choices=RUNTIMES,
                        help="sequential and vectorised: fedcare's simulator; flower: Flower's Simulation Engine (Ray)")
    parser.add_argument("--examples", type=int, default=16, help="examples (windows) per client")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (CI machines have 2 cores)")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for many_clients.csv and .png")
    parser.add_argument("--timeout", type=float, default=1200,
                        help="seconds a case (one method, size and runtime, in its own process) may take; "
                             "one that takes longer is stopped and reported as not finished")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case, print it as JSON
    args = parser.parse_args()
    if args.case:
        method, clients, runtime = args.case.split(",")
        print(json.dumps(case(method, int(clients), args.examples, runtime, args.threads)))
        return
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    rows = []
    runtimes = [r for r in RUNTIMES if r in args.runtimes]
    print(f"| method | clients | " + " | ".join(f"{r}: rounds/s" for r in runtimes)
          + f" | round time / {runtimes[0]}'s | state MB | clients x private MB | peak RSS MB ("
          + " / ".join(runtimes) + ") |")
    print("|---|---:|" + "---:|" * (len(runtimes) + 4))
    for method in [m for m in METHODS if m in args.methods]:
        for clients in args.clients:
            got = {runtime: run_case(method, clients, runtime, args) for runtime in runtimes}
            rows += [row for row in got.values() if "round_s" in row]
            first = got[runtimes[0]]  # the simulator's, for the ratios and the clients' state
            print(f"| {method} | {clients} | " + " | ".join(cell(got[r], "rounds_per_s", "{:.3g}") for r in runtimes)
                  + " | " + " / ".join(f"{got[r]['round_s'] / first['round_s']:.2f}" if "round_s" in got[r]
                                       and "round_s" in first else "-" for r in runtimes)
                  + f" | {cell(first, 'state_mb', '{:.2f}')} | "
                  + cell(first, "private_mb_per_client", "{:.2f}", clients)
                  + " | " + " / ".join(cell(got[r], "peak_rss_mb", "{:.0f}") for r in runtimes) + " |", flush=True)
    print(f"each case given {args.timeout:.0f} s; {os.cpu_count()} CPU cores; load average before {load_before}, "
          f"after {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if rows:  # the finished cases
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "many_clients.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        plot(rows, args.out / "many_clients.png")
        print(f"model {rows[0]['model_mb']:.2f} MB; wrote {args.out / 'many_clients.csv'} and {args.out / 'many_clients.png'}")


def run_case(method: str, clients: int, runtime: str, args) -> dict:
    """One case in a fresh process (peak RSS is the case's own) and its own process group
    (Ray's processes included), stopped after `args.timeout` seconds: its row, or
    {"failed": why} for one that did not finish."""
    from fedcare.runtime.flower.processes import stop_groups

    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([sys.executable, __file__, "--case", f"{method},{clients},{runtime}",
                                 "--examples", str(args.examples), "--threads", str(args.threads)],
                                stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            proc.wait(args.timeout)
        except subprocess.TimeoutExpired:
            return {"failed": f"not finished in {args.timeout:.0f} s"}
        finally:
            stop_groups([proc])
        log.seek(0)
        lines = log.read().strip().splitlines()
    if proc.returncode != 0:
        print(f"{method}, {clients} clients, {runtime} failed:", *lines[-20:], sep="\n", file=sys.stderr)
        return {"failed": f"failed (exit {proc.returncode})"}
    return json.loads(next(line for line in reversed(lines) if line.startswith('{"method"')))


def cell(row: dict, key: str, form: str, times: int = 1) -> str:
    return form.format(row[key] * times) if key in row else row["failed"]


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for method in METHODS:
        for runtime, style in zip(RUNTIMES, ("-o", "--s", ":^")):
            mine = [r for r in rows if r["method"] == method and r["runtime"] == runtime]
            if mine:
                left.plot([r["clients"] for r in mine], [r["round_s"] for r in mine], style, label=f"{method}, {runtime}")
                right.plot([r["clients"] for r in mine], [r["peak_rss_mb"] for r in mine], style,
                           label=f"{method}, {runtime}: peak RSS")
    for ax, title, unit in ((left, "time per round", "seconds"), (right, "memory", "MB")):
        ax.set_xscale("log"), ax.set_yscale("symlog"), ax.set_xlabel("clients"), ax.set_ylabel(unit)
        ax.set_title(title), ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()

"""Many per-patient clients in the simulator: how time per round and memory grow from 10 to
100 to 1,000 clients, for FedAvg, PFDL and FedBN on FedHealth 2's HAR CNN (synthetic windows,
every client in every round), with clients trained one after another (`LocalClients`) and
many at a time (`VectorisedClients`).

Memory: what the clients keep between rounds is their private state only (FedAvg: nothing;
FedBN: the BatchNorm tensors; PFDL: the dense layers), one working model for all, never a
model per client: "state MB" is those tensors, measured, next to clients x private part as
the model defines it; "peak RSS MB" is the process's (each case runs in a fresh process),
data included. Time: the second round (the first pays one-off costs), and its ratio to the
same round one client after another.

    python benchmarks/many_clients.py [--clients 10 100 1000] [--examples 16] [--threads 2] [--out DIR]

Writes many_clients.csv and many_clients.png into --out (default: the current folder).
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

METHODS = ("fedavg", "pfdl", "fedbn")
RUNTIMES = ("sequential", "vectorised")


def case(method: str, clients: int, examples: int, runtime: str, threads: int) -> dict:
    """One (method, clients, runtime): two rounds in this process; the measurements."""
    import torch

    from fedcare.algorithms import fedavg, fedbn, pfdl
    from fedcare.algorithms.training import ClientData, TrainSettings
    from fedcare.models.har_cnn import HarCNN
    from fedcare.runtime.clients import LocalClients
    from fedcare.runtime.federation import Federation
    from fedcare.runtime.vectorised import VectorisedClients
    from fedcare.tasks import MULTICLASS

    torch.set_num_threads(threads)
    settings = TrainSettings(lr=0.01, batch_size=16, local_epochs=1, task=MULTICLASS)
    algorithm = {"fedavg": fedavg(settings), "pfdl": pfdl(settings, finetune_epochs=1), "fedbn": fedbn(settings)}[method]
    g = torch.Generator().manual_seed(0)
    data = {c: ClientData(torch.randn(examples, 27, 100, generator=g), torch.randint(0, 10, (examples,), generator=g))
            for c in range(clients)}
    torch.manual_seed(0)
    model = HarCNN(window=100)
    kind = VectorisedClients if runtime == "vectorised" else LocalClients
    fed = Federation(model, algorithm, 0, clients=kind(model, algorithm.client, 0))
    seconds = []
    for rnd in (1, 2):
        start = time.perf_counter()
        fed.run_round("train", rnd, data)
        seconds.append(time.perf_counter() - start)
    state_bytes = sum(t.numel() * t.element_size() for s in fed.states.values() for t in s.values())
    private = algorithm.client.split.private_tensors(model)
    return {"method": method, "clients": clients, "runtime": runtime, "round_s": seconds[1], "first_round_s": seconds[0],
            "state_mb": state_bytes / 2**20,
            "private_mb_per_client": sum(t.numel() * t.element_size() for t in private.values()) / 2**20,
            "model_mb": sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 2**20,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000], help="federation sizes")
    parser.add_argument("--examples", type=int, default=16, help="examples (windows) per client")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (CI machines have 2 cores)")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for many_clients.csv and .png")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case, print it as JSON
    args = parser.parse_args()
    if args.case:
        method, clients, runtime = args.case.split(",")
        print(json.dumps(case(method, int(clients), args.examples, runtime, args.threads)))
        return
    rows = []
    print("| method | clients | round s (one after another) | round s (vectorised) | speed-up | state MB | "
          "clients x private MB | peak RSS MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for method in METHODS:
        for clients in args.clients:
            got = {}
            for runtime in RUNTIMES:  # a fresh process each: peak RSS is the case's own
                out = subprocess.run([sys.executable, __file__, "--case", f"{method},{clients},{runtime}",
                                      "--examples", str(args.examples), "--threads", str(args.threads)],
                                     check=True, capture_output=True, text=True).stdout
                got[runtime] = json.loads(out.strip().splitlines()[-1])
                rows.append(got[runtime])
            s, v = got["sequential"], got["vectorised"]
            print(f"| {method} | {clients} | {s['round_s']:.2f} | {v['round_s']:.2f} | {s['round_s'] / v['round_s']:.2f} "
                  f"| {s['state_mb']:.2f} | {clients * s['private_mb_per_client']:.2f} "
                  f"| {s['peak_rss_mb']:.0f} / {v['peak_rss_mb']:.0f} |", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "many_clients.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, args.out / "many_clients.png")
    print(f"model {rows[0]['model_mb']:.2f} MB; wrote {args.out / 'many_clients.csv'} and {args.out / 'many_clients.png'}")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for method in METHODS:
        for runtime, style in zip(RUNTIMES, ("-o", "--s")):
            mine = [r for r in rows if r["method"] == method and r["runtime"] == runtime]
            left.plot([r["clients"] for r in mine], [r["round_s"] for r in mine], style, label=f"{method}, {runtime}")
        seq = [r for r in rows if r["method"] == method and r["runtime"] == "sequential"]
        right.plot([r["clients"] for r in seq], [r["peak_rss_mb"] for r in seq], "-o", label=f"{method}: peak RSS")
        right.plot([r["clients"] for r in seq], [r["state_mb"] for r in seq], ":", label=f"{method}: client state")
    for ax, title, unit in ((left, "time per round", "seconds"), (right, "memory", "MB")):
        ax.set_xscale("log"), ax.set_yscale("symlog"), ax.set_xlabel("clients"), ax.set_ylabel(unit)
        ax.set_title(title), ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()

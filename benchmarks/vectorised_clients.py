"""Clients trained one after another (`LocalClients`) against many at a time
(`VectorisedClients`, torch.func vmap), timed alternately in one process; prints the ratio
of medians (sequential time / vectorised time: above 1, vectorised is faster) and the largest
difference between the two runs' global models. For the whole-model workloads it also times
the ceiling of any batching of the clients: one model taking the same steps on all clients'
batches concatenated (`one_model_for_all`), plus the rest of the round (the same round with
no local epochs, one after another: loading each client's model, its reply, the aggregation,
which every runtime does), as a ratio against the same sequential time.

Workloads of the 1,000-client regime (issue 13's targets: at least 3x on 2 cores):
- "har": FedAvg rounds of FedHealth 2's HAR CNN (BatchNorm included) on synthetic windows;
- "pfdl-heads": PFDL's fine-tuning of each client's private dense layers after aggregation
  (the shared conv blocks frozen), on the pain CNN at small images: the per-patient heads;
  many at a time, each client's frozen features are computed once (PainCNN.forward_head);
- "pfdl-heads-every-batch": the same, many at a time without that (the frozen conv blocks run
  forward for every batch of every epoch, as one after another does);
- "dense-heads": the same dense layers (the pain CNN's classifier: 512 -> 128, BatchNorm,
  -> 1) trained locally on features computed once, i.e. per-patient heads without the conv.

    python benchmarks/vectorised_clients.py [--clients 100] [--examples 16] [--epochs 5] [--repeats 3] [--threads 2] [--chunk 100]
        [--workloads har pfdl-heads ...]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedcare.algorithms import fedavg, local, pfdl
from fedcare.algorithms.training import ClientData, TrainSettings
from fedcare.models.har_cnn import HarCNN
from fedcare.models.pain_cnn import PainCNN
from fedcare.runtime.clients import LocalClients
from fedcare.runtime.federation import Federation
from fedcare.runtime.vectorised import VectorisedClients
from fedcare.tasks import BINARY, MULTICLASS


def har_clients(k: int, n: int) -> dict[int, ClientData]:
    g = torch.Generator().manual_seed(0)
    return {c: ClientData(torch.randn(n, 27, 100, generator=g), torch.randint(0, 10, (n,), generator=g))
            for c in range(k)}


def pain_clients(k: int, n: int, size: int = 32) -> dict[int, ClientData]:
    g = torch.Generator().manual_seed(0)
    return {c: ClientData(torch.randint(0, 256, (n, 1, size, size), generator=g, dtype=torch.uint8),
                          (torch.rand(n, generator=g) < 0.5).float()) for c in range(k)}


def feature_clients(k: int, n: int) -> dict[int, ClientData]:
    g = torch.Generator().manual_seed(0)
    return {c: ClientData(torch.randn(n, 512, generator=g), (torch.rand(n, generator=g) < 0.5).float())
            for c in range(k)}


class DenseHead(torch.nn.Module):
    """The pain CNN's dense layers at 32 px (its `classifier`), on precomputed conv features."""

    def __init__(self):
        super().__init__()
        self.classifier = PainCNN(image_size=32).classifier

    def forward(self, x):
        return self.classifier(x).squeeze(1)


def workloads(k: int, n: int, epochs: int):
    """name -> (model factory, algorithm, data, what one timed unit does)"""
    har = TrainSettings(lr=0.01, batch_size=16, local_epochs=epochs, task=MULTICLASS)
    heads = TrainSettings(lr=0.01, batch_size=16, local_epochs=epochs, task=BINARY)
    return {
        "har": (lambda: HarCNN(window=100), fedavg(har), har_clients(k, n), "one FedAvg round"),
        "pfdl-heads": (lambda: PainCNN(image_size=32), pfdl(heads, finetune_epochs=epochs), pain_clients(k, n),
                       "PFDL's head fine-tuning after one aggregation"),
        "pfdl-heads-every-batch": (lambda: PainCNN(image_size=32), pfdl(heads, finetune_epochs=epochs),
                                   pain_clients(k, n), "PFDL's head fine-tuning after one aggregation"),
        "dense-heads": (DenseHead, local(heads), feature_clients(k, n), "one round of local training"),
    }


def timed(name, make_model, algorithm, data, runtime, chunk) -> tuple[float, Federation]:
    torch.manual_seed(0)
    model = make_model()
    kw = {"chunk": chunk} if runtime is VectorisedClients else {}
    fed = Federation(model, algorithm, 0, clients=runtime(model, algorithm.client, 0, **kw))
    if name == "pfdl-heads-every-batch" and runtime is VectorisedClients:
        fed.clients.head = None  # the whole model under vmap, its frozen blocks run for every batch
    work = fed.work(data)
    start = time.perf_counter()
    if name.startswith("pfdl-heads"):  # only the private heads' fine-tuning
        fed.clients.after_aggregation("train", 1, work)
    else:
        fed.run_round("train", 1, data)
    return time.perf_counter() - start, fed


def one_model_for_all(make_model, algorithm, data, chunk) -> float:
    """The ceiling of any batching of the clients: ONE model takes the same steps as the
    vectorised round, each step on the chunk's batches concatenated into one plain batch (no
    per-client parameters, no vmap). K models cost at least one model's arithmetic on K times
    the batch, so sequential time / (this time + the rest of the round) bounds what
    many-at-a-time can reach here."""
    settings = algorithm.client.settings
    torch.manual_seed(0)
    model = make_model().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=settings.lr)
    clients = [data[c] for c in sorted(data)]
    start = time.perf_counter()
    for i in range(0, len(clients), chunk):
        x = torch.stack([d.x for d in clients[i:i + chunk]])  # [K, n, ...]
        y = torch.stack([d.y for d in clients[i:i + chunk]])
        k, n = x.shape[:2]
        rows = torch.arange(k)[:, None]
        for _ in range(settings.local_epochs):
            order = torch.stack([torch.randperm(n) for _ in range(k)])
            for s in range(0, n - 1, settings.batch_size):
                idx = order[:, s:s + settings.batch_size]
                loss = settings.task.loss(model(x[rows, idx].flatten(0, 1)), y[rows, idx].flatten(0, 1))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=100, help="clients per round")
    parser.add_argument("--examples", type=int, default=16, help="examples per client")
    parser.add_argument("--epochs", type=int, default=5, help="local epochs (the PFDL paper's E = 5)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating timings per runtime")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (CI machines have 2 cores)")
    parser.add_argument("--chunk", type=int, default=100, help="clients per batched step")
    parser.add_argument("--workloads", nargs="+", default=None, help="which workloads (default all)",
                        choices=["har", "pfdl-heads", "pfdl-heads-every-batch", "dense-heads"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.clients} clients x {args.examples} examples, {args.epochs} epochs of batches of 16, "
          f"{args.threads} threads, chunk {args.chunk}")
    print("| workload | unit | sequential s | vectorised s | ratio | max difference "
          "| one model, all clients' batches as one s | rest of the round s | ceiling ratio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, (make_model, algorithm, data, unit) in workloads(args.clients, args.examples, args.epochs).items():
        if args.workloads and name not in args.workloads:
            continue
        times = {LocalClients: [], VectorisedClients: [], "one model": [], "no training": []}
        timed(name, make_model, algorithm, data, VectorisedClients, args.chunk)  # warm-up: torch.func's first call
        feds = {}
        whole_model = not name.startswith("pfdl-heads")  # the ceiling is of a whole round's training
        # the same round without local epochs: what is left of it when training costs nothing
        untrained = workloads(args.clients, args.examples, 0)[name][1]
        if whole_model:
            timed(name, make_model, untrained, data, LocalClients, args.chunk)  # warm-up
        for _ in range(args.repeats):
            for runtime in (LocalClients, VectorisedClients):
                seconds, feds[runtime] = timed(name, make_model, algorithm, data, runtime, args.chunk)
                times[runtime].append(seconds)
            if whole_model:
                times["one model"].append(one_model_for_all(make_model, algorithm, data, args.chunk))
                times["no training"].append(timed(name, make_model, untrained, data, LocalClients, args.chunk)[0])
        seq, vec = statistics.median(times[LocalClients]), statistics.median(times[VectorisedClients])
        if whole_model:
            one, rest = statistics.median(times["one model"]), statistics.median(times["no training"])
            ceiling = f"{one:.2f} | {rest:.2f} | {seq / (one + rest):.2f}"
        else:
            ceiling = "– | – | –"
        a, b = feds[LocalClients], feds[VectorisedClients]
        if whole_model and a.global_message.tensors:
            diff = max(float((a.global_message.tensors[k].double() - b.global_message.tensors[k].double()).abs().max())
                       for k in a.global_message.tensors)
        else:
            diff = max(float((a.state_of(c)[k] - b.state_of(c)[k]).abs().max()) for c in data for k in a.state_of(c))
        print(f"| {name} | {unit} | {seq:.2f} | {vec:.2f} | {seq / vec:.2f} | {diff:.1e} | {ceiling} |")


if __name__ == "__main__":
    main()

"""fedcare's simulator against a plain PyTorch loop doing exactly the same local steps.

Both run FedAvg rounds of the pain CNN over the same clients: for each client, load the
global weights into one model, run E epochs of SGD over the same shuffled batches, and
average the results. The plain loop is the least code that can do this; the difference is
what the engine costs (messages, state records, sorted aggregation, derived generators).
The two are timed alternately in one process, several times, and the ratio of medians is
printed. Target: at most 1.05.

    python benchmarks/engine_overhead.py [--clients 12] [--examples 400] [--image-size 32] [--rounds 3] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.nn import functional as F

from fedcare.algorithms import fedavg
from fedcare.algorithms.training import ClientData, Randomness, TrainSettings, as_float
from fedcare.models.pain_cnn import PainCNN, glorot_init
from fedcare.runtime.federation import Federation
from fedcare.seeding import torch_generator


def make_clients(n_clients: int, n: int, size: int) -> dict[int, ClientData]:
    g = torch.Generator().manual_seed(0)
    return {
        c: ClientData(torch.randint(0, 256, (n, 1, size, size), generator=g, dtype=torch.uint8),
                      (torch.rand(n, generator=g) < 0.5).float())
        for c in range(n_clients)
    }


def plain_loop(model, clients, rounds, settings, seed) -> dict[str, torch.Tensor]:
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    for rnd in range(1, rounds + 1):
        results = []
        for cid in sorted(clients):
            model.load_state_dict(global_state)
            model.train()
            data = clients[cid]
            opt = torch.optim.SGD(model.parameters(), lr=settings.lr)
            gen = Randomness(seed, "bench", cid, rnd).torch("fit-order")  # the engine's batch order
            for _ in range(settings.local_epochs):
                order = torch.randperm(len(data), generator=gen)
                for start in range(0, len(data), settings.batch_size):
                    idx = order[start : start + settings.batch_size]
                    if len(idx) < 2:
                        continue
                    opt.zero_grad(set_to_none=True)
                    loss = F.binary_cross_entropy_with_logits(model(as_float(data.x[idx])), data.y[idx])
                    loss.backward()
                    opt.step()
                    loss.item()
            results.append(({k: v.clone() for k, v in model.state_dict().items()}, len(data)))
        total = sum(n for _, n in results)
        global_state = {
            k: sum(s[k].double() * (n / total) for s, n in results).to(v.dtype) if v.is_floating_point()
            else sum(s[k].double() * (n / total) for s, n in results).round().to(v.dtype)
            for k, v in global_state.items()
        }
    return global_state


def engine(model, clients, rounds, settings, seed) -> dict[str, torch.Tensor]:
    federation = Federation(model, fedavg(settings), seed)
    for rnd in range(1, rounds + 1):
        federation.run_round("bench", rnd, clients)
    return federation.global_message.tensors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--examples", type=int, default=400, help="training examples per client (thesis: 400)")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = TrainSettings(lr=1e-3, batch_size=32, local_epochs=args.epochs)
    clients = make_clients(args.clients, args.examples, args.image_size)
    init = PainCNN(args.image_size)
    glorot_init(init, torch_generator(0, "init"))
    times: dict[str, list[float]] = {"plain": [], "engine": []}
    finals = {}
    runners = {"plain": plain_loop, "engine": engine}
    for repeat in range(args.repeats):
        for name in (("plain", "engine") if repeat % 2 == 0 else ("engine", "plain")):
            model = PainCNN(args.image_size)
            model.load_state_dict(init.state_dict())
            t0 = time.perf_counter()
            finals[name] = runners[name](model, clients, args.rounds, settings, 0)
            times[name].append(time.perf_counter() - t0)
    same = all(torch.allclose(finals["plain"][k].float(), finals["engine"][k].float(), atol=1e-6) for k in finals["plain"])
    plain, eng = statistics.median(times["plain"]), statistics.median(times["engine"])
    print(f"setup: {args.clients} clients x {args.examples} examples, {args.image_size}px pain CNN, "
          f"{args.rounds} FedAvg rounds x {args.epochs} epochs, {args.threads} threads, {args.repeats} repeats")
    print(f"plain PyTorch loop: median {plain:.3f} s  (min {min(times['plain']):.3f}, max {max(times['plain']):.3f})")
    print(f"fedcare simulator:  median {eng:.3f} s  (min {min(times['engine']):.3f}, max {max(times['engine']):.3f})")
    print(f"ratio engine / plain: {eng / plain:.3f}  (target <= 1.05)   same final weights: {same}")


if __name__ == "__main__":
    main()

"""The demo's training step on a shared machine: OpenMP's active vs passive waiting, on an
idle machine and under load, side by side in one run.

The step is the pain demo's (PainCNN at 32 px, a batch of 32, SGD and the binary
cross-entropy on random tensors). Each case runs in a fresh process, because libgomp reads
OMP_WAIT_POLICY once, when torch loads it. "loaded" starts `--burners` CPU-burning processes
(busy loops, ended after the case, and in any case after `--seconds` + 60 s) before the case
runs; the 1-minute load average (`os.getloadavg`, which the other users of a shared machine
also move) is printed next to every number.

    python benchmarks/threads.py [--threads 1 2] [--steps 60] [--burners 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

BURN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"


def worker(threads: int, steps: int) -> dict:
    """In the case's process: ms per training step, median of `steps` after 5 of warm-up."""
    import torch

    from fedcare.models.pain_cnn import PainCNN

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = PainCNN(32)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.rand(32, 1, 32, 32), torch.randint(0, 2, (32,)).float()
    times = []
    for i in range(steps + 5):
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
        optimizer.step()
        if i >= 5:
            times.append(time.perf_counter() - t0)
    times.sort()
    return {"ms": 1000 * times[len(times) // 2], "policy_seen": os.environ.get("OMP_WAIT_POLICY")}


def case(policy: str, threads: int, steps: int) -> dict:
    env = {**os.environ, "OMP_WAIT_POLICY": policy}
    out = subprocess.run([sys.executable, __file__, "--worker", "--threads", str(threads), "--steps", str(steps)],
                         env=env, capture_output=True, text=True, check=True, timeout=1800).stdout
    return json.loads(out.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--burners", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=900, help="the burners' time limit")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.threads[0], args.steps)))
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{cores} cores; PainCNN(32), batch 32; median ms per training step of {args.steps}")
    print(f"{'machine':>8} {'policy':>8} {'threads':>7} {'ms/step':>8} {'vs 1 thread':>11} {'load 1-min':>10}")
    for loaded in (False, True):
        burners = [subprocess.Popen([sys.executable, "-c", BURN.format(seconds=args.seconds + 60)])
                   for _ in range(args.burners if loaded else 0)]
        try:
            if loaded:
                time.sleep(5)  # the burners are running
            for policy in ("ACTIVE", "PASSIVE"):
                one = None
                for threads in args.threads:
                    result = case(policy, threads, args.steps)
                    assert result["policy_seen"] == policy
                    one = result["ms"] if threads == 1 else one
                    ratio = f"{result['ms'] / one:.2f}x" if one else ""
                    print(f"{'loaded' if loaded else 'idle':>8} {policy:>8} {threads:>7} {result['ms']:>8.2f} "
                          f"{ratio:>11} {os.getloadavg()[0]:>10.2f}", flush=True)
        finally:
            for p in burners:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()

"""bf16 against fp32, and channels_last, per training image-step for the studies' conv nets
at the papers' input sizes, side by side in one process; and each step's FLOPs.

Models and inputs: the pain study's PainCNN at 215 px (1 channel), the surgical study's
AlexNet at its frame size (3 x 135 x 240, 6 labels), the face study's ResNet-18 at 112 and
128 px. A step is forward, loss, backward and an SGD step on random tensors already in
memory (the training loop's arithmetic, not its data path); bf16 is `torch.autocast` to
bfloat16 as `[runtime] precision = "bf16"` runs it. Each variant takes the median of
`--steps` steps after one of warm-up; the variants of one model alternate, so a change in the
machine's load hits all of them alike. The 1-minute load average is printed with each model.

FLOPs per step (forward and backward) are counted by torch.utils.flop_counter: the input of
the GPU estimate in docs/running-at-scale.md.

    python benchmarks/precision.py [--steps 5] [--threads 2] [--models pain alexnet resnet112 resnet128]
    python benchmarks/precision.py --memory   # no timing: each model's training memory at the papers' batches

`--memory` prints, for the papers' batch sizes (pain 32, AlexNet 128, ResNet-18 64), the
parameters (weights, gradients and an optimizer's two moments: 4 copies), and the
activations a training step keeps for backward (counted exactly with autograd's
saved-tensor hooks), in fp32 and under bf16 autocast.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

import torch
from torch import nn


def models(batch: dict[str, int]) -> dict[str, tuple[nn.Module, tuple[int, ...], int]]:
    """name -> (model, input shape of one batch, outputs per example)."""
    from fedcare.models.face_resnet import FaceResNet
    from fedcare.models.pain_cnn import PainCNN
    from fedcare.studies.surgical.models import build_model

    return {
        "pain": (PainCNN(215), (batch["pain"], 1, 215, 215), 1),
        "alexnet": (build_model("alexnet", hidden=4096), (batch["alexnet"], 3, 135, 240), 6),
        "resnet112": (FaceResNet(0), (batch["resnet112"], 3, 112, 112), 256),
        "resnet128": (FaceResNet(0), (batch["resnet128"], 3, 128, 128), 256),
    }


def step_fn(model: nn.Module, x: torch.Tensor, precision: str):
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    target = None

    def step() -> None:
        nonlocal target
        optimizer.zero_grad(set_to_none=True)
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
        with ctx:
            out = model(x)
        out = out.float().reshape(len(x), -1)
        if target is None:
            target = torch.rand_like(out)
        nn.functional.binary_cross_entropy_with_logits(out, target).backward()
        optimizer.step()

    return step


def flops_per_step(model: nn.Module, x: torch.Tensor) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    step = step_fn(model, x, "fp32")
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


def saved_bytes(model: nn.Module, x: torch.Tensor, precision: str) -> int:
    """Bytes of the tensors one forward pass saves for backward (the activations' memory)."""
    total, seen = 0, set()

    def pack(t: torch.Tensor):
        nonlocal total
        key = (t.untyped_storage().data_ptr(), t.dtype)
        if key not in seen and not isinstance(t, nn.Parameter):
            seen.add(key)
            total += t.untyped_storage().nbytes()
        return t

    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), ctx:
        model(x).float().sum()
    return total


def memory(names: list[str]) -> None:
    paper = {"pain": 32, "alexnet": 128, "resnet112": 64, "resnet128": 64}
    built = models(paper)
    print(f"{'model':>10} {'batch':>5} {'params MB':>9} {'x4 (w,g,m,v)':>12} {'act. fp32 MB':>12} {'act. bf16 MB':>12}")
    for name in names:
        model, shape, _ = built[name]
        x = torch.rand(shape)
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        fp32, bf16 = saved_bytes(model, x, "fp32"), saved_bytes(model, x, "bf16")
        print(f"{name:>10} {shape[0]:>5} {params / 2**20:>9.1f} {4 * params / 2**20:>12.1f} {fp32 / 2**20:>12.0f} "
              f"{bf16 / 2**20:>12.0f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=["pain", "alexnet", "resnet112", "resnet128"])
    parser.add_argument("--batch", type=int, nargs=4, default=[32, 32, 32, 32], metavar=("PAIN", "ALEXNET", "R112", "R128"))
    parser.add_argument("--memory", action="store_true", help="print the training memory at the papers' batches instead")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory:
        memory(args.models)
        return
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, CPU kernels {torch.backends.cpu.get_cpu_capability()}, {args.threads} threads, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    built = models(dict(zip(["pain", "alexnet", "resnet112", "resnet128"], args.batch)))
    variants = [("fp32", False), ("bf16", False), ("fp32", True), ("bf16", True)]
    print(f"{'model':>10} {'batch':>5} {'GFLOP/step':>10} " + " ".join(f"{p + (' CL' if cl else ''):>9}" for p, cl in variants)
          + "  bf16/fp32  load")
    for name in args.models:
        model, shape, _ = built[name]
        x = torch.rand(shape)
        flops = flops_per_step(model, x)
        steps = {}
        for precision, channels_last in variants:
            m = model.to(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
            xi = x.contiguous(memory_format=torch.channels_last) if channels_last else x.contiguous()
            steps[(precision, channels_last)] = step_fn(m, xi, precision)
            steps[(precision, channels_last)]()  # warm-up (oneDNN picks its kernels)
        times: dict[tuple, list[float]] = {v: [] for v in variants}
        for _ in range(args.steps):  # alternate: the machine's load moves all variants alike
            for v in variants:
                m = model.to(memory_format=torch.channels_last if v[1] else torch.contiguous_format)
                t0 = time.perf_counter()
                steps[v]()
                times[v].append(time.perf_counter() - t0)
        per_image = {v: 1000 * statistics.median(t) / shape[0] for v, t in times.items()}
        ratio = per_image[("bf16", False)] / per_image[("fp32", False)]
        print(f"{name:>10} {shape[0]:>5} {flops / 1e9:>10.1f} " + " ".join(f"{per_image[v]:>9.2f}" for v in variants)
              + f"  {ratio:>8.2f}x  {os.getloadavg()[0]:.1f}", flush=True)
    print("columns: ms per training image-step (median step / batch); CL = channels_last")


if __name__ == "__main__":
    main()

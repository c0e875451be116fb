"""Where the time and the memory of the pain protocol go: one seed of configs/pain/tobis2020.toml
(215 px, T = 200, the thesis's learning rate and epochs) on a synthetic cohort with the real
archive's frame counts, cut short where it would take hours: `--methods`, `--last-session` and
`--max-rounds` (every phase ends after that many rounds or epochs; early stopping may end it
sooner).

Time is split by phase, each counted once (exclusive of the phases it calls):
  decode      reading the PNGs, greyscale, resize, histogram equalization (`read_cohort`)
  variants    cutting the four augmented variants from the stored frames (`FrameItems`)
  training    local and central training steps (`train_epochs`, `train_steps`)
  evaluation  forward passes for validation and test (`predict`)
  report      tables, plots and report.html (`build_report`)
  other       everything else (aggregation, bookkeeping, records)
Memory: the process's peak resident set, and its two parts sampled every 0.1 s: anonymous
memory (the process's own) and file-backed pages (the memory-mapped frame store, which the
kernel can drop and read back).

From the measured cost per training image-step and per evaluated image it prints the time a
full-length round and a full seed would take (14 methods, sessions 1-9, up to 30 rounds).

Its baseline, measured in the same process after the run: the bare arithmetic, the least
PyTorch code doing the same steps (a PainCNN of the same size, torch.optim.SGD and the binary
cross-entropy on random tensors already in memory, batches of the protocol's training and
evaluation sizes, the same threads). It prints the protocol's cost per image over the bare
cost (training and evaluation) and the whole run over its bare arithmetic (the images it
trained and evaluated, at the bare costs): what fedcare's data path and bookkeeping add to
the convolutions, i.e. what is left to optimise in the code rather than in the arithmetic.

    python benchmarks/pain_profile.py --data DIR [--methods BC "F(C)"] [--last-session 1]
        [--max-rounds 1] [--threads 2] [--baseline-steps 10] [--out DIR]
    python benchmarks/pain_profile.py --frame-scale 1.0 ...   # generate the cohort first (250 px)
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class PhaseClock:
    """Exclusive wall time per phase: entering a phase pauses the one that called it."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.items: dict[str, int] = defaultdict(int)
        self.stack: list[tuple[str, float]] = []

    def wrap(self, phase: str, fn, count=None):
        clock = self

        def timed(*args, **kwargs):
            now = time.perf_counter()
            if clock.stack:
                parent, since = clock.stack[-1]
                clock.seconds[parent] += now - since
            clock.stack.append((phase, now))
            try:
                result = fn(*args, **kwargs)
            finally:
                end = time.perf_counter()
                name, since = clock.stack.pop()
                clock.seconds[name] += end - since
                if clock.stack:
                    clock.stack[-1] = (clock.stack[-1][0], end)
            if count is not None:
                clock.items[phase] += count(args, kwargs, result)
            return result

        return timed


class MemorySampler(threading.Thread):
    """Peak RssAnon and RssFile of this process (/proc/self/status), sampled every 0.1 s."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak = {"RssAnon": 0, "RssFile": 0, "VmRSS": 0}
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(0.1):
            for line in Path("/proc/self/status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in self.peak:
                    self.peak[key] = max(self.peak[key], int(value.split()[0]) * 1024)


def patch_everywhere(module_prefix: str, original, replacement) -> int:
    """Replace `original` wherever a loaded module of `module_prefix` imported it by name."""
    hits = 0
    for name, module in list(sys.modules.items()):
        if name.startswith(module_prefix) and module is not None:
            for attr, value in list(vars(module).items()):
                if value is original:
                    setattr(module, attr, replacement)
                    hits += 1
    return hits


# The real archive's groups (reference/pain-tobis-thesis.md, derived from Table 3.1): frames and pain share.
GROUP1_FRAMES, GROUP1_PAIN = 25_744, 0.201
GROUP2_FRAMES = 19_545
CLIENTS, T, EPOCHS, SESSIONS = 12, 200, 5, 9


def full_seed_estimate(step: float, image: float) -> str:
    """Hours one seed of tobis2020.toml would take at these costs (seconds per training
    image-step and per evaluated image), if every phase stopped after 6 rounds (the fewest
    early stopping with patience 5 allows) or ran all 30."""
    pre_items = 2 * 4 * GROUP1_FRAMES * GROUP1_PAIN  # every positive item and as many negatives
    pre_train, pre_val = 0.8 * pre_items, 0.2 * pre_items
    group2_images = 4 * GROUP2_FRAMES
    val_round = group2_images / SESSIONS * image  # a session's frames of the 12 subjects
    fed_round = CLIENTS * 2 * T * EPOCHS * step
    per_round = {  # seconds of one round of a Group 2 session, validation included
        "C (centralized; a round is an epoch on the pooled sets)": CLIENTS * 2 * T * step + val_round,
        "F, FL (5 local epochs on every client)": fed_round + val_round,
        "FP (and 5 epochs fine-tuning the heads: forward passes)": fed_round + CLIENTS * 2 * T * EPOCHS * image
                                                                   + val_round,
    }
    methods = {"C (centralized; a round is an epoch on the pooled sets)": 2,  # C(N), C(C)
               "F, FL (5 local epochs on every client)": 6, "FP (and 5 epochs fine-tuning the heads: forward passes)": 3}
    rows = [("central pretraining (BC and the (C) inits)", pre_train * step + pre_val * image),
            ("federated pretraining (BF and the (F) inits)", EPOCHS * pre_train * step + pre_val * image)]
    rows += [(f"{k}: {n} methods x {SESSIONS} sessions", n * SESSIONS * v) for k, v in per_round.items()
             for n in [methods[k]]]
    test = 14 * group2_images * image
    lines = ["one seed of configs/pain/tobis2020.toml at these costs (hours; 6 or 30 rounds per phase):",
             "| part | 6 rounds | 30 rounds |", "|---|---:|---:|"]
    low = high = test
    for name, seconds in rows:
        lines.append(f"| {name} | {6 * seconds / 3600:.1f} | {30 * seconds / 3600:.1f} |")
        low, high = low + 6 * seconds, high + 30 * seconds
    lines.append(f"| testing 14 methods on sessions 1-9 | {test / 3600:.1f} | {test / 3600:.1f} |")
    lines.append(f"| one seed | {low / 3600:.0f} | {high / 3600:.0f} |")
    return "\n".join(lines)


def bare_costs(image_size: int, batch_size: int, eval_batch: int, steps: int) -> tuple[float, float]:
    """Seconds per training image-step and per evaluated image of the least PyTorch code doing
    the protocol's arithmetic: PainCNN(image_size), plain SGD on the binary cross-entropy, random
    tensors already in memory (no decoding, no cutting of variants, no bookkeeping); two steps
    and two batches of warm-up (the first of a shape is slower: allocations), then `steps` of each."""
    import torch
    from torch.nn.functional import binary_cross_entropy_with_logits

    from fedcare.models.pain_cnn import PainCNN

    g = torch.Generator().manual_seed(0)
    model = PainCNN(image_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    x = torch.rand(batch_size, 1, image_size, image_size, generator=g)
    y = (torch.rand(batch_size, generator=g) < 0.5).float()

    def train_step():
        optimizer.zero_grad()
        binary_cross_entropy_with_logits(model(x).reshape(-1), y).backward()
        optimizer.step()

    model.train()
    for _ in range(2):
        train_step()
    start = time.perf_counter()
    for _ in range(steps):
        train_step()
    per_step = (time.perf_counter() - start) / (steps * batch_size)
    model.eval()
    x_eval = torch.rand(eval_batch, 1, image_size, image_size, generator=g)
    with torch.no_grad():
        for _ in range(2):
            model(x_eval)
        start = time.perf_counter()
        for _ in range(steps):
            model(x_eval)
    return per_step, (time.perf_counter() - start) / (steps * eval_batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="a UNBC-McMaster-layout copy (default: generate one into --out)")
    parser.add_argument("--frame-scale", type=float, default=1.0, help="frames to generate, as a fraction of the archive's")
    parser.add_argument("--methods", nargs="+", default=["BC", "F(C)"], help="methods of the seed to run")
    parser.add_argument("--last-session", type=int, default=1, help="test sessions 1..N (the protocol has 9)")
    parser.add_argument("--max-rounds", type=int, default=1, help="rounds (epochs) per phase, pretraining included")
    parser.add_argument("--image-size", type=int, default=215, help="network input size (the thesis: 215)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--baseline-steps", type=int, default=10,
                        help="training steps and evaluation batches of the bare-arithmetic baseline (after the run)")
    parser.add_argument("--out", type=Path, default=Path("pain-profile"), help="folder for the cohort and the run")
    args = parser.parse_args()
    if args.baseline_steps < 1:
        parser.error("--baseline-steps must be at least 1")

    sampler = MemorySampler()
    sampler.start()
    import torch

    import fedcare.studies.pain.study as pain_study
    from fedcare.algorithms import training
    from fedcare.studies.load import load_config
    from fedcare.studies import run as run_module
    from fedcare.studies.pain.cohort import FrameItems
    from fedcare.studies.pain.methods import eval_batch_size

    args.out.mkdir(parents=True, exist_ok=True)
    generate_seconds = None
    root = args.data
    if root is None:
        from fedcare.data.unbc.synthetic import generate_pain_cohort

        root = args.out / f"unbc-{args.frame_scale:g}"
        if not root.is_dir():
            start = time.perf_counter()
            generate_pain_cohort(root, frame_scale=args.frame_scale, image_size=250)
            generate_seconds = time.perf_counter() - start

    rounds = args.max_rounds
    config = load_config(REPO / "configs/pain/tobis2020.toml", overrides=[
        f"data.root={root}", "seeds=[123]", f"methods={json.dumps(args.methods)}",
        f"protocol.image_size={args.image_size}", f"protocol.last_session={args.last_session}",
        f"train.rounds={rounds}", f"train.pretrain_rounds={rounds}", f"runtime.threads={args.threads}",
    ])

    clock = PhaseClock()
    import fedcare.algorithms  # noqa: F401 - every algorithm module, so each import of the loops is patched

    for fn, phase in ((training.train_epochs, "training"), (training.train_steps, "training"),
                      (training.predict, "evaluation")):
        patch_everywhere("fedcare", fn, clock.wrap(phase, fn))
    pain_study.read_cohort = clock.wrap("decode", pain_study.read_cohort)
    run_module.build_report = clock.wrap("report", run_module.build_report)
    getitem = FrameItems.__getitem__

    def images(args_, kwargs, result):
        return len(result) if result.ndim == 4 else 1

    cut = clock.wrap("variants", getitem, count=images)

    def counted(self, index):  # count each image under the phase that asked for it
        caller = clock.stack[-1][0] if clock.stack else "other"
        result = cut(self, index)
        clock.items[f"{caller} images"] += len(result) if result.ndim == 4 else 1
        return result

    FrameItems.__getitem__ = counted

    start = time.perf_counter()
    run_dir = run_module.run_study(config, args.out / f"run-{time.strftime('%Y%m%d-%H%M%S')}")
    total = time.perf_counter() - start
    sampler.done.set()
    sampler.join()
    batch, eval_batch = config.train.batch_size, eval_batch_size(args.image_size)
    torch.set_num_threads(args.threads)  # as the run had them (runtime.threads)
    bare_step, bare_eval = bare_costs(args.image_size, batch, eval_batch, args.baseline_steps)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    phases = ("decode", "variants", "training", "evaluation", "report")
    other = total - sum(clock.seconds[p] for p in phases)
    frames = sum(1 for _ in Path(root, "Images").rglob("*.png"))

    print(f"\npain protocol profile: {frames} frames, {args.image_size} px, methods {args.methods}, sessions 1-"
          f"{args.last_session}, at most {rounds} round(s) per phase, {args.threads} threads; run: {run_dir}")
    if generate_seconds is not None:
        print(f"(generating the synthetic cohort took {generate_seconds:.0f} s, not counted below)")
    print("\n| phase | seconds | share |\n|---|---:|---:|")
    for p in (*phases, "other"):
        s = other if p == "other" else clock.seconds[p]
        print(f"| {p} | {s:.1f} | {100 * s / total:.1f}% |")
    print(f"| total | {total:.1f} | 100% |")
    train_images, eval_images = clock.items["training images"], clock.items["evaluation images"]
    per_step = clock.seconds["training"] / max(train_images, 1)
    per_eval = clock.seconds["evaluation"] / max(eval_images, 1)
    per_variant = clock.seconds["variants"] / max(clock.items["variants"], 1)
    print(f"\ntraining: {train_images} image-steps, {1e3 * per_step:.2f} ms each; evaluation: {eval_images} images, "
          f"{1e3 * per_eval:.2f} ms each; cutting a variant: {1e6 * per_variant:.0f} us")
    print(f"decode: {1e3 * clock.seconds['decode'] / max(frames, 1):.2f} ms per frame")
    bare_total = train_images * bare_step + eval_images * bare_eval
    print(f"\nbaseline, the bare arithmetic (PainCNN({args.image_size}), plain SGD, random tensors in memory, "
          f"batches of {batch} and {eval_batch}, {args.baseline_steps} of each): {1e3 * bare_step:.2f} ms per training "
          f"image-step, {1e3 * bare_eval:.2f} ms per evaluated image")
    print(f"| protocol / bare | ratio |\n|---|---:|\n| training, per image-step | {per_step / bare_step:.2f}x |\n"
          f"| evaluation, per image | {per_eval / bare_eval:.2f}x |\n"
          f"| the whole run / its images' bare arithmetic ({bare_total:.1f} s) | {total / bare_total:.2f}x |")
    gib = 2**30
    print(f"\nmemory: peak RSS {peak_rss / gib:.2f} GiB; sampled peaks: anonymous {sampler.peak['RssAnon'] / gib:.2f} GiB, "
          f"file-backed {sampler.peak['RssFile'] / gib:.2f} GiB")
    print("\n" + full_seed_estimate(per_step + per_variant, per_eval + per_variant))
    print(json.dumps({"frames": frames, "seconds": {p: round(clock.seconds[p], 2) for p in phases} | {"other": round(other, 2)},
                      "total": round(total, 2), "train_image_steps": train_images, "eval_images": eval_images,
                      "bare_step": bare_step, "bare_eval": bare_eval,
                      "peak_rss": peak_rss, "peak_anon": sampler.peak["RssAnon"], "peak_file": sampler.peak["RssFile"]}))


if __name__ == "__main__":
    main()

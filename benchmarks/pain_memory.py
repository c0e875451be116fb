"""The memory of the pain study's data path at full scale: every frame of the 24 thesis subjects
read at the network size of configs/pain/tobis2020.toml (215 px), as a run in this process
reads them (the frames in a memory-mapped file in the run directory), then every data set the
protocol builds from them (Group 1's pretraining split, each Group 2 subject's balanced
training set up to every session at T = 200 and every session's test set), one training step
of PainCNN(215) on a balanced set and one evaluation batch.

It prints the process's peak resident set and its two parts, sampled every 0.1 s: anonymous
memory (the process's own, which cannot be dropped) and file-backed pages (the frame store and
the libraries, which the kernel drops and reads back under pressure), next to what the frames
would take in the cohort's old layout (4 variants at 215 px, held by the process).

    python benchmarks/pain_memory.py --data DIR [--image-size 215] [--out DIR]

To check a memory limit, run it in a cgroup with that limit (as measured in
benchmarks/README.md: a cgroup v1 with memory.limit_in_bytes = 3G).
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from pain_profile import REPO, MemorySampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="a UNBC-McMaster-layout copy (e.g. from "
                        "`fedcare data synth pain DIR --frame-scale 1.0`)")
    parser.add_argument("--image-size", type=int, default=215, help="network input size (the thesis: 215)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()), help="where the frame store goes")
    args = parser.parse_args()

    sampler = MemorySampler()
    sampler.start()
    import numpy as np
    import torch

    from fedcare.algorithms.training import as_float
    from fedcare.studies.load import load_config
    from fedcare.models.pain_cnn import PainCNN
    from fedcare.studies.pain.cohort import PainSite, pretraining_sets, read_cohort
    from fedcare.studies.pain.methods import eval_batch_size

    torch.set_num_threads(args.threads)
    config = load_config(REPO / "configs/pain/tobis2020.toml",
                         overrides=[f"data.root={args.data}", f"protocol.image_size={args.image_size}"])
    p = config.protocol
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    cohort = read_cohort(config, args.data, sorted(set(p.subjects) | set(p.pretrain_subjects)), store_dir=args.out)
    read_seconds = time.perf_counter() - start
    frames = sum(len(s.labels) for sessions in cohort.sessions.values() for s in sessions)

    start = time.perf_counter()
    train, val = pretraining_sets(cohort, p.pretrain_subjects, p.pretrain_val_fraction, np.random.default_rng(0))
    sites = {k: PainSite(k, cohort.sessions[k], p.balance_per_class, cohort.synthetic) for k in p.subjects}
    sets = [*train.values(), *val.values()]
    for k, site in sites.items():
        for s in range(len(site.sessions)):
            sets.append(site.data(f"session/{s}"))
            if site.summary()["trainable"][s]:
                sets.append(site.data(f"train/123/{s}"))
    build_seconds = time.perf_counter() - start
    items = sum(len(d) for d in sets)

    model = PainCNN(args.image_size)
    balanced = sites[p.subjects[0]].data("train/123/1")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(as_float(balanced.x[0:32])), balanced.y[0:32])
    loss.backward()
    optimizer.step()
    test = sites[p.subjects[0]].data("session/1")
    with torch.no_grad():
        model.eval()(as_float(test.x[0:eval_batch_size(args.image_size)]))
    time.sleep(0.3)  # one more sample
    sampler.done.set()
    sampler.join()

    gib = 2**30
    side = cohort.sessions[p.subjects[0]][0].frames.shape[-1]
    print(f"{frames} frames at {args.image_size} px (stored at {side} px): read in {read_seconds:.0f} s; "
          f"{len(sets)} data sets, {items} items, built in {build_seconds:.1f} s")
    print(f"frame store: {frames * side * side / gib:.2f} GiB in a memory-mapped file; the old layout "
          f"(4 variants at {args.image_size} px, in the process): {frames * 4 * args.image_size ** 2 / gib:.2f} GiB")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / gib:.2f} GiB; sampled peaks: "
          f"anonymous {sampler.peak['RssAnon'] / gib:.2f} GiB, file-backed {sampler.peak['RssFile'] / gib:.2f} GiB")


if __name__ == "__main__":
    main()

"""What a run's lineage costs (docs/runs.md, "Lineage and saved models"): the same demo run
with its lineage and without (the federations not followed: nothing hashed, no model saved),
side by side in one process, alternating, `--repeats` times each; and, in the runs with it, the
seconds spent in the lineage's own code (hashing each round's messages, writing its records,
saving the models), which a loaded machine disturbs less than the ratio of two wall times.

    PYTHONPATH=src python benchmarks/lineage.py --study fedhealth2 --set train.rounds=5 --repeats 3
    PYTHONPATH=src python benchmarks/lineage.py --study surgical --set train.rounds=5 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from fedcare.runtime import federation as federation_module
from fedcare.runtime import lineage as lineage_module
from fedcare.studies import registry
from fedcare.studies import run as run_module
from fedcare.studies.load import load_config

SPENT = {"seconds": 0.0}


def timed(function):
    """`function`, its time added to SPENT (the lineage's own work)."""
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            SPENT["seconds"] += time.perf_counter() - t0
    return wrapper


class Unfollowed(lineage_module.Lineage):
    """A lineage that follows no federation: the run without one."""

    def follow(self, *args, **kwargs) -> None:
        pass


def one_run(config, with_lineage: bool) -> tuple[float, float, int]:
    """(wall seconds of the run, seconds in the lineage's code, bytes of lineage.jsonl and models/)."""
    real = run_module._lineage
    if not with_lineage:
        run_module._lineage = lambda run, study, saved: Unfollowed(run.partial, config_sha256="0" * 64)
    SPENT["seconds"] = 0.0
    try:
        with tempfile.TemporaryDirectory(prefix="fedcare-lineage-bench-") as tmp:
            t0 = time.perf_counter()
            out = run_module.run_study(config, Path(tmp) / "run")
            wall = time.perf_counter() - t0
            size = sum(p.stat().st_size for p in [out / "lineage.jsonl", *(out / "models").glob("*")] if p.is_file()) \
                if (out / "models").is_dir() else 0
    finally:
        run_module._lineage = real
    return wall, SPENT["seconds"], size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", default="fedhealth2", help="a study whose demo runs (default fedhealth2)")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="a --set of the demo config (repeatable)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    config = load_config(registry.get(args.study).demo_config(), args.sets)
    # the lineage's own work: the federation's parent digest, each aggregation's record, each commit
    federation_module.message_digest = timed(federation_module.message_digest)
    lineage_module.Chain.aggregated = timed(lineage_module.Chain.aggregated)
    lineage_module.Lineage.commit = timed(lineage_module.Lineage.commit)
    lineage_module.Lineage.follow = timed(lineage_module.Lineage.follow)
    on, off, own = [], [], []
    size = 0
    for i in range(args.repeats):
        wall, spent, size = one_run(config, True)
        on.append(wall)
        own.append(spent)
        off.append(one_run(config, False)[0])
        print(f"run {i + 1}: with lineage {on[-1]:.1f} s (of it {spent:.2f} s in its code), without {off[-1]:.1f} s",
              flush=True)
    m_on, m_off, m_own = statistics.median(on), statistics.median(off), statistics.median(own)
    print(f"{args.study} demo {' '.join(args.sets)}: median {m_on:.1f} s with the lineage, {m_off:.1f} s without: "
          f"{m_on / m_off:.3f}x; its own code {m_own:.2f} s ({100 * m_own / m_on:.1f}% of the run); "
          f"lineage.jsonl and models/ {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()

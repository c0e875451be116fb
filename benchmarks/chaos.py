"""The chaos test at full size (issue 37; the suite runs a small one:
tests/deployment/test_cli_deployed_chaos.py): SuperNodes on 127.0.0.1 with TLS and signed site
identity run FedBN on a synthetic PAMAP2 with `late_sites = "wait"` while a seeded schedule of
faults hits them (`--each` of every kind): sites SIGKILLed mid-fit and restarted, replies
corrupted on the wire, the SuperLink's database locked mid-round, the coordinator SIGKILLed and
the run resumed (tests/support/chaos.py). Prints the schedule, the faults injected and what
the coordinator waited out, the time and the machine's load, and whether the run's
metrics.jsonl equals an undisturbed run's (Flower's Simulation Engine in process) byte for byte.

    python benchmarks/chaos.py [--sites 8] [--rounds 12] [--each 3] [--seed 37] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the test deployment's harness
# ports from a range of their own (support.deployment.port: one per xdist worker): not the suite's
os.environ.setdefault("PYTEST_XDIST_WORKER", "gw7")

from fedcare.data.pamap2.synthetic import generate_pamap2  # noqa: E402
from fedcare.deployment.cli import put_flower_commands_on_path  # noqa: E402

from support import chaos  # noqa: E402
from support.flower_inprocess import run_experiment_on_flower  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sites", type=int, default=8, help="SuperNodes, one per site (at least 6)")
    parser.add_argument("--rounds", type=int, default=12, help="FedBN's federated rounds (at least 10)")
    parser.add_argument("--each", type=int, default=3, help="faults of every kind")
    parser.add_argument("--seed", type=int, default=37, help="the schedule's seed")
    parser.add_argument("--keep", type=Path, help="a folder to keep the runs and logs in (default: a temporary one)")
    args = parser.parse_args()
    put_flower_commands_on_path()  # `flwr`, beside this interpreter, for the researcher's commands
    root = args.keep or Path(tempfile.mkdtemp(prefix="fedcare-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    site_ids = chaos.sites(args.sites)
    data = root / "PAMAP2_Dataset"
    generate_pamap2(data, seed=2, subjects=sorted(site_ids.values()), seconds_per_activity=2.0)
    experiment = chaos.config(data, site_ids, args.rounds)
    started = time.monotonic()
    run_experiment_on_flower(experiment, root / "calm", len(site_ids), "chaos.toml")
    calm = time.monotonic() - started
    plan = chaos.schedule(args.seed, list(site_ids), args.rounds, args.each)
    print("schedule:", plan.describe(), flush=True)
    load_before = os.getloadavg()
    outcome = chaos.run(root / "deploy", data, experiment, plan, timeout=3600,
                        say=lambda line: print(f"  [{time.monotonic() - started:6.0f} s] {line}", flush=True))
    load_after = os.getloadavg()
    same = ((outcome.out / "metrics.jsonl").read_bytes().replace(b'"site-1', b'"1')
            == (root / "calm" / "metrics.jsonl").read_bytes())
    print("outcome:", outcome.describe())
    print(f"undisturbed run (Simulation Engine in process): {calm:.0f} s; load average before "
          f"{load_before[0]:.1f}, after {load_after[0]:.1f} (1 min), {os.cpu_count()} CPUs")
    print(f"metrics.jsonl byte-identical to the undisturbed run: {same}; runs and logs in {root}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

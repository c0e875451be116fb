"""What each robust rule buys (docs/robustness.md): the FedHealth 2 demo's FedAvg (synthetic
PAMAP2, 20 Dirichlet clients, 20 rounds) under each `[robustness] rule`, without attackers
and with `--attackers` of the 20 clients sending a poisoned update; prints the clients' mean
final accuracy per rule in a Markdown table, over all clients and over the honest ones (the
clients not in --attackers). Not a timing: a measurement of accuracy.

    PYTHONPATH=src python benchmarks/robustness.py --kind sign_flip --scale 4 --attackers 0 1 2 3

The synthetic copy is generated once (the first run) and read from there by the others.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
from importlib.resources import files
from collections.abc import Sequence
from pathlib import Path

from fedcare.studies.load import parse_config
from fedcare.studies.run import run_study

RULES = {  # rule -> its [robustness] parameters for 20 clients, 4 of them attacking
    "mean": {},
    "median": {},
    "trimmed_mean": {"trim_fraction": 0.2},
    "krum": {"byzantine": 4},
    "multi_krum": {"byzantine": 4, "multi_krum_keep": 10},
    "bulyan": {"byzantine": 4},  # 20 >= 4 x 4 + 3
}


def final_accuracy(run_dir: Path, leave_out: Sequence[int] = ()) -> float:
    """The clients' mean accuracy (each client's own test data, unweighted) after the last
    round, over the clients not in `leave_out`."""
    evals = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
             if r["type"] == "client_eval"]
    last = max(r["round"] for r in evals)
    final = [r["accuracy"] for r in evals if r["round"] == last and r["client"] not in leave_out]
    return sum(final) / len(final)


def toml_value(v: object) -> str:
    return json.dumps(v)  # numbers, strings and lists of them are the same in TOML


def experiment(demo: str, data_root: Path | None, rule: str, attack: dict | None) -> str:
    text = re.sub(r'methods = \[.*\]', 'methods = ["fedavg"]', demo)
    if data_root is not None:  # the copy the first run generated, instead of generating it again
        text = re.sub(r"\[data\.synthetic\]\n(.+\n)*", "", text).replace(
            'dataset = "pamap2"', f'dataset = "pamap2"\nroot = {toml_value(str(data_root))}')
    table = {"rule": rule, **RULES[rule]}
    text += "\n[robustness]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in table.items())
    if attack:
        text += "\n[robustness.attack]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in attack.items())
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="sign_flip", choices=["sign_flip", "scaled_update", "label_flip"])
    parser.add_argument("--scale", type=float, default=None)
    parser.add_argument("--attackers", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--rules", nargs="+", default=list(RULES), choices=list(RULES))
    parser.add_argument("--attacked-only", action="store_true", help="skip the runs without attackers")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directories here")
    args = parser.parse_args()
    demo = (files("fedcare") / "configs" / "fedhealth2" / "demo.toml").read_text()
    attack = {"clients": args.attackers, "kind": args.kind, **({"scale": args.scale} if args.scale else {})}
    work = args.keep or Path(tempfile.mkdtemp(prefix="fedcare-robustness-"))
    data_root, rows = None, []
    for rule in args.rules:
        row = [rule]
        for attacked in ((attack,) if args.attacked_only else (None, attack)):
            out = work / f"{rule}-{'attacked' if attacked else 'clean'}"
            config = parse_config(experiment(demo, data_root, rule, attacked), out.with_suffix(".toml"))
            run_study(config, out)
            if data_root is None:
                data_root = out / "synthetic-data"
            # over all clients, and over the honest ones (the same clients with and without the attack)
            row += [f"{final_accuracy(out):.3f}", f"{final_accuracy(out, args.attackers):.3f}"]
        rows.append(row)
        print(f"{rule}: {row[1:]}", flush=True)
    print(f"\nFedAvg on the fedhealth2 demo, mean client accuracy after 20 rounds; attack: {attack}\n")
    runs = ["attacked"] if args.attacked_only else ["no attack", "attacked"]
    print("| rule | " + " | ".join(f"{run}: {who}" for run in runs for who in ("all", "honest")) + " |")
    print("|---|" + "---:|" * 2 * len(runs))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

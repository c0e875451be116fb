"""What tests in several folders check of a run's lineage (`fedcare lineage --verify`): it holds,
each round record of metrics.jsonl is one of its aggregates (same round, clients and examples,
in order), and each Flower site's own record agrees with it."""

from __future__ import annotations

import json
from pathlib import Path

from fedcare.runtime.flower.site_record import RECORD_SUFFIX, Comparison, client_of, compare
from fedcare.runtime.hashchain import check_chain
from fedcare.runtime.lineage_verify import Verified, verify_lineage

from support import records


def examples(aggregate: dict) -> int:
    if "secure_aggregation" in aggregate:
        return aggregate["secure_aggregation"]["examples"]
    return sum(v["examples"] for v in aggregate["clients"].values())


def check_lineage(run_dir: Path) -> Verified:
    """The run's lineage verifies, and its aggregates hold the protocol's round records in order
    (a protocol may aggregate without writing a round record: FedHealth 2's pooled pretraining)."""
    verified = verify_lineage(run_dir)
    aggregates = iter([(r["round"], len(r["clients"]), examples(r)) for r in verified.records
                       if r["type"] == "aggregate"])
    rounds = [(r["round"], r["clients"], r["n_train"]) for r in records(run_dir, "round")]
    missing = [r for r in rounds if not any(r == a for a in aggregates)]  # a subsequence: each found after the last
    assert rounds and not missing, f"round records with no aggregate in the lineage: {missing[:3]}"
    assert verified.sealed and verified.models
    return verified


def site_comparisons(state_dir: Path, run_dir: Path) -> dict[str, Comparison]:
    """Each site's own record (in `state_dir`, any depth) against the run's lineage, by client."""
    lineage = verify_lineage(run_dir).records
    key = json.loads((Path(run_dir) / "run.json").read_text())["flower_run"]
    found = {}
    for path in sorted(Path(state_dir).rglob(f"run-{key}/*{RECORD_SUFFIX}")):
        found[client_of(path)] = compare(check_chain(path), lineage, client_of(path))
    return found


RUN_KEY = "0123456789abcdef"  # the handmade run's key, as a run across sites has in run.json (flower_run)


def handmade_run(run: Path, seeds=(1, 2), rounds: int = 2) -> Path:
    """A finished run's directory made without a study: config.toml, a lineage of one FedAvg
    federation per seed over three tiny clients (a unit a round), run.json with its seal and
    a `flower_run` key."""
    import hashlib

    from fedcare.algorithms import fedavg
    from fedcare.algorithms.training import TrainSettings
    from fedcare.runtime.federation import Federation
    from fedcare.runtime.lineage import Lineage

    from support.tiny import tiny_data, tiny_model

    run.mkdir(parents=True)
    (run / "config.toml").write_text('study = "x"\n')
    lineage = Lineage(run, config_sha256=hashlib.sha256(b'study = "x"\n').hexdigest())
    for seed in seeds:
        federation = Federation(tiny_model(seed), fedavg(TrainSettings(lr=0.05, batch_size=8)), seed)
        lineage.follow(federation, "fedavg", {"method": "fedavg", "seed": seed})
        for rnd in range(1, rounds + 1):
            federation.run_round("train", rnd, {c: tiny_data(c, n=16) for c in (1, 2, 3)})
            lineage.commit((seed, "fedavg", rnd))
    (run / "run.json").write_text(json.dumps({"status": "finished", "lineage": lineage.seal(), "flower_run": RUN_KEY}))
    lineage.close()
    return run


def truthful_site_record(state_dir: Path, run: Path, client: str) -> Path:
    """The record a site holding `client` keeps of the handmade run: what the lineage says it
    received and sent (fit entries only), in its state folder."""
    from fedcare.runtime.hashchain import ChainWriter

    path = state_dir / f"run-{RUN_KEY}" / f"client-{client}{RECORD_SUFFIX}"
    writer = ChainWriter(path, private=True)
    writer.append({"type": "fit", "site": f"site-{client}", "client": client, "namespace": "ns",
                   "algorithm": r["algorithm"], "seed": r["seed"], "phase": r["phase"], "round": r["round"],
                   "received": r["received"].get(client, r["parent"]), "sent": r["clients"][client]["update"],
                   "examples": r["clients"][client]["examples"], "code_sha256": r["code_sha256"]}
                  for r in verify_lineage(run).records if r["type"] == "aggregate" and client in r["clients"])
    writer.close()
    return path

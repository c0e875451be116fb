"""The chaos test across real sites (issue 37): a Flower deployment on 127.0.0.1 (TLS, signed
site identity, one SuperNode per site) runs FedBN on a small synthetic PAMAP2 with
`late_sites = "wait"` while a seeded schedule of faults hits it:

- a site SIGKILLed mid-fit (it trained, then its whole process group is killed before it saved
  or replied: the fault hook of support/supernode_heartbeat/site_faults.py), restarted;
- a site whose fit reply leaves with a NaN (the same hook): dropped, asked for again;
- the SuperLink's SQLite database held under a write lock for `LOCK_SECONDS` (longer than its
  5 s busy timeout: HTTP 500s for the calls that came first) mid-round;
- the coordinator (ServerApp, SuperLink, `flwr run`) SIGKILLed once a unit (a round) is
  finished, the SuperLink restarted and the run continued with `fedcare flower run --resume`.

A supervisor restarts every SuperNode that exits (the planned kills, and those Flower 1.42's
SuperNode makes itself on an HTTP 500), as systemd would, once the SuperLink has marked its
node offline (Flower lets a node back in only then). Flower 1.42's SuperNode does not end
on an HTTP 500: it logs the error, stops pulling and sending heartbeats, and its process waits
at shutdown for ever (the SuperLink counts it offline): the supervisor kills one that logged
an HTTP 500 and still runs `HUNG_AFTER` seconds later, as a watchdog would. The database lock
can also cost the ServerApp its run: the SuperLink, unable to record the ServerApp's heartbeat,
fails the run ("No heartbeat received from the task"), and the SuperLink's SuperExec may be
gone with it (a resumed run then never starts); `fedcare flower run` says how to continue, and
the harness restarts the SuperLink and does so (`failed_runs_resumed`), as an operator would. The run must end with the metrics.jsonl
of an undisturbed run, byte for byte. Used by tests/deployment/test_cli_deployed_chaos.py (small)
and benchmarks/chaos.py (full size)."""

from __future__ import annotations

import json
import random
import re
import sqlite3
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from fedcare.config import to_toml
from fedcare.studies.fedhealth2.config import FedHealth2Experiment

from support.deployment import Deployment

PHASE = "train"  # FedHealth 2's federated rounds after its pretraining
LOCK_SECONDS = 6.0  # the SuperLink's busy timeout is 5 s: a call in the lock's first second gets HTTP 500
HUNG_AFTER = 5.0  # seconds a SuperNode that met an HTTP 500 may take to end by itself
RESUMABLE = "continue with: fedcare flower run --resume"  # what `fedcare flower run` says of a run it can continue
STOPPED = "500 Internal Server Error"  # what a SuperNode logs as its loop ends on the SuperLink's fault
RESTART_AFTER = 23.0  # a killed node is offline after 2 heartbeats of 10 s (support/deployment.py) + a margin


def sites(count: int) -> dict[str, int]:
    """Site name -> subject: site-101, site-102, ..."""
    return {f"site-{100 + i}": 100 + i for i in range(1, count + 1)}


def config(data: Path, site_ids: dict[str, int], rounds: int) -> FedHealth2Experiment:
    """FedBN (its BatchNorm layers stay at the sites) with `late_sites = "wait"`."""
    return FedHealth2Experiment.model_validate({
        "study": "fedhealth2", "seeds": [1], "methods": ["fedbn"], "data": {"dataset": "pamap2", "root": str(data)},
        "protocol": {"split": "natural", "pretrain": "federated", "subjects": sorted(site_ids.values())},
        "train": {"rounds": rounds, "pretrain_rounds": 1, "hidden": 8}, "runtime": {"threads": 1},
        "deployment": {"sites": site_ids, "late_sites": "wait", "round_timeout": 300, "connect_timeout": 300},
    })


@dataclass(frozen=True)
class Schedule:
    """Which faults hit when; rounds are FedHealth 2's federated (train) rounds."""

    seed: int
    rounds: int
    kills: tuple[tuple[str, int], ...]  # (site, round): killed mid-fit of that round
    corruptions: tuple[tuple[str, int], ...]  # (site, round): its reply to that fit leaves with a NaN
    coordinator_kills: tuple[int, ...]  # once this many units (rounds) are finished: coordinator killed, resumed
    database_locks: tuple[int, ...]  # once this many rounds are recorded: the database locked (mid next round)

    def describe(self) -> str:
        return (f"seed {self.seed}, {self.rounds} rounds: sites killed mid-fit {list(self.kills)}; replies corrupted "
                f"{list(self.corruptions)}; coordinator killed after units {list(self.coordinator_kills)}; "
                f"database locked {LOCK_SECONDS:g} s after rounds {list(self.database_locks)}")


def schedule(seed: int, site_names: list[str], rounds: int, each: int = 1, coordinator: bool = True) -> Schedule:
    """`each` faults of every kind, at rounds and sites drawn from `seed`. A site is killed or
    corrupted at most once per round; the coordinator is killed before the database is locked
    (run.json keeps the faults the last ServerApp survived). `coordinator=False`: the sites'
    faults only (the suite's short version; the coordinator's have their own tests)."""
    rng = random.Random(seed)

    def site_rounds(first: int) -> tuple[tuple[str, int], ...]:
        picked = rng.sample([(s, r) for s in site_names for r in range(first, rounds + 1)], each)
        return tuple(sorted(picked, key=lambda p: (p[1], p[0])))

    half = max(1, rounds // 2)
    kills, corruptions = site_rounds(1), site_rounds(1)
    if not coordinator:
        return Schedule(seed, rounds, kills, corruptions, (), ())
    return Schedule(seed, rounds, kills, corruptions,
                    tuple(sorted(rng.sample(range(1, half + 1), min(each, half)))),
                    tuple(sorted(rng.sample(range(half + 1, rounds), min(each, max(rounds - half - 1, 0))))))


def site_faults(plan: Schedule, root: Path) -> dict[str, dict]:
    """Each faulty site's FEDCARE_TEST_FAULTS (support/supernode_heartbeat/site_faults.py)."""
    faults: dict[str, dict] = {}
    for kind, hits in (("kill", plan.kills), ("corrupt", plan.corruptions)):
        for site, rnd in hits:
            faults.setdefault(site, {"marks": str(root / "faults" / site)}).setdefault(kind, []).append([PHASE, rnd])
    return faults


def units_done(partial: Path) -> int:
    """The units (here: rounds) the run has finished and checkpointed (its run.log says so)."""
    path = partial / "run.log"
    return len(re.findall(r" finished \S+ \(\d+ of \d+ units\)", path.read_text())) if path.is_file() else 0


def rounds_done(partial: Path) -> int:
    path = partial / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return sum(1 for line in lines if '"type": "round"' in line and f'"phase": "{PHASE}"' in line)


def hold_lock(database: Path, seconds: float) -> None:
    """A write lock on the SuperLink's database, as a busy coordinator's other writer holds one."""
    db = sqlite3.connect(database, timeout=30, isolation_level=None)
    try:
        db.execute("BEGIN EXCLUSIVE")
        time.sleep(seconds)
        db.execute("ROLLBACK")
    finally:
        db.close()


def _last_error(log: str) -> str:
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    return errors[-1][:300] if errors else "no error line"


@dataclass
class Outcome:
    out: Path  # the finished run directory
    seconds: float
    injected: Counter = field(default_factory=Counter)  # fault kind -> how many hit
    site_restarts: int = 0  # SuperNodes the supervisor restarted (the planned kills, and exits on HTTP 500)
    hung: int = 0  # SuperNodes that met an HTTP 500 and did not end: killed by the supervisor
    failed_runs_resumed: int = 0  # runs that failed by themselves (the SuperLink lost their heartbeat), resumed
    run_info: dict = field(default_factory=dict)

    def describe(self) -> str:
        seen = {k: len(self.run_info.get(k, [])) for k in ("rejoined", "asked_again", "coordinator_faults")}
        return (f"faults injected: {dict(self.injected)}; SuperNodes restarted: {self.site_restarts} (of them "
                f"hung after an HTTP 500, killed: {self.hung}); runs that failed by themselves and were resumed: "
                f"{self.failed_runs_resumed}; the last "
                f"ServerApp waited out: {seen}; run complete: {self.run_info.get('complete')}; {self.seconds:.0f} s")


def run(root: Path, data: Path, experiment: FedHealth2Experiment, plan: Schedule, timeout: float = 1800,
        say=print) -> Outcome:
    """The experiment across real sites under `plan`'s faults; the finished run's directory and counts."""
    site_ids = dict(experiment.deployment.sites)
    faults = site_faults(plan, root)
    d = Deployment(root, list(site_ids))
    start = time.monotonic()
    outcome = Outcome(root / "runs" / "chaos", 0.0)
    partial = outcome.out.with_name("chaos.partial")

    def start_site(site: str) -> None:
        env = {"FEDCARE_TEST_FAULTS": json.dumps(faults[site])} if site in faults else {}
        d.start_site(site, data, env={**env, "PYTHONUNBUFFERED": "1"})  # its log as it goes: the supervisor reads it

    def researcher(*args: str) -> None:
        d.start("researcher", ["flower", "run", *args, "--federation", "test", "--site-keys", str(d.certs / "keys")])

    try:
        d.start_superlink()
        d.register(*site_ids)
        for site in site_ids:
            start_site(site)
        path = d.root / "chaos.toml"
        path.write_text(to_toml(experiment))
        researcher(str(path), "--out", str(outcome.out))
        kills, locks = list(plan.coordinator_kills), list(plan.database_locks)
        died: dict[str, float] = {}
        said_ended: dict[str, float] = {}  # sites whose SuperNode met an HTTP 500, since when
        while True:
            ended = d.processes["researcher"].poll()
            if ended == 0:
                break
            if ended is not None and RESUMABLE in d.log("researcher") and outcome.failed_runs_resumed < 3:
                # the run failed and said how to continue it: an operator (here, the harness) does so
                say(f"the run failed ({_last_error(d.log('researcher'))}): restarting the SuperLink, resuming it")
                outcome.failed_runs_resumed += 1
                d.kill_coordinator()  # its SuperExec may have died of the same fault: no ServerApp would start
                d.start_superlink()
                researcher("--resume", str(partial))
                continue
            if ended is not None:
                raise RuntimeError(f"the chaos run failed:\n{d.log('researcher')}\n{d.log('superlink')[-3000:]}")
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"the chaos run did not end within {timeout:g} s")
            done = rounds_done(partial)
            if kills and units_done(partial) >= kills[0]:
                say(f"unit {kills[0]} finished: killing the coordinator, then resuming")
                kills.pop(0)
                d.kill_coordinator()
                outcome.injected["coordinator killed and resumed"] += 1
                d.start_superlink()
                researcher("--resume", str(partial))
                continue
            if locks and done >= locks[0] and not kills:
                say(f"round {done} recorded: locking the SuperLink's database for {LOCK_SECONDS:g} s")
                locks.pop(0)
                threading.Thread(target=hold_lock, args=(root / "superlink.db", LOCK_SECONDS), daemon=True).start()
                outcome.injected["SuperLink database locked"] += 1
            for site in site_ids:  # the supervisor
                proc = d.processes.get(site)
                if proc is not None and proc.poll() is None and STOPPED in d.log(site):
                    said = said_ended.setdefault(site, time.monotonic())
                    if time.monotonic() - said > HUNG_AFTER:
                        say(f"{site} met an HTTP 500 {HUNG_AFTER:g} s ago and still runs, serving nothing: killing it")
                        d.kill(site)  # ends it (and takes it out of d.processes)
                        outcome.hung += 1
                if proc is not None and proc.poll() is not None:
                    said_ended.pop(site, None)
                    d.processes.pop(site, None)
                    died[site] = time.monotonic()
                    say(f"{site} exited ({proc.returncode}); restarting it in {RESTART_AFTER:g} s")
                if site in died and time.monotonic() - died[site] > RESTART_AFTER:
                    del died[site]
                    start_site(site)
                    outcome.site_restarts += 1
            time.sleep(0.5)
    finally:
        d.close()
    for label, kind, hits in (("site killed mid-fit", "kill", plan.kills),
                              ("reply corrupted", "corrupt", plan.corruptions)):  # the hook's marks say what hit
        outcome.injected[label] = sum((root / "faults" / s / f"{kind}-{PHASE}-{r}").is_file() for s, r in hits)
    outcome.seconds = time.monotonic() - start
    outcome.run_info = json.loads((outcome.out / "run.json").read_text())
    return outcome

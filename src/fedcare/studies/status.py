"""`fedcare status RUN_DIR`: where a run stands, read from its directory while it runs (in
process or across sites) or after it ended.

What it says comes from the files the run writes anyway: run.json (status, units done of the
total, when it started, `pace`: when this process began its units and how many were done
then, which gives the ETA), metrics.jsonl (the last `round` record is the current round; the
`participation` records of a run across sites say which sites answered, were late or were
missing in each round, `missed` and `refused` records who dropped out or was refused; the
epsilon each client has spent so far under DP) and lineage.jsonl where the run has one.

Read-only and safe while the run writes: it never takes the run's lock (whether a process
holds it is read from /proc/locks, or from the process the lock file names) and never writes;
run.json is replaced atomically by the run, and a half-written last line of metrics.jsonl is
left for the next reading. `StatusReader` reads metrics.jsonl on from where it stopped, so
`--watch` costs only what the run wrote since; a file cut back (a resume) is read again.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fedcare.files import process_alive
from fedcare.runfiles import METRICS_FILE, RUN_FILE, read_run_info

LOCK_FILE = ".lock"  # fedcare.studies.rundir's (not imported: it loads torch)
PARTIAL = ".partial"
LINEAGE_FILE = "lineage.jsonl"
EPSILON_FIELDS = ("dp_epsilon_clients", "client_dp_epsilon_clients")  # a round's epsilon per client
ROUND_FIELDS = ("method", "seed", "phase", "model", "round")  # what says which round a record is


def find_run(path: Path) -> Path:
    """The run directory `path` names: itself, or `<path>.partial` while it runs; FileNotFoundError if neither."""
    path = Path(path)
    partial = path.with_name(path.name + PARTIAL)
    if path.is_dir():
        return path
    if partial.is_dir():
        return partial
    if path.name.endswith(PARTIAL) and path.with_name(path.name[: -len(PARTIAL)]).is_dir():
        return path.with_name(path.name[: -len(PARTIAL)])  # it finished since
    raise FileNotFoundError(f"{path}: no such run directory")


def lock_holder(run_dir: Path) -> tuple[bool | None, dict]:
    """(whether a live process holds the run's lock, what the lock file says: pid, host, since),
    without taking it. None: it cannot be told from here (a run on another host, no /proc)."""
    lock = Path(run_dir) / LOCK_FILE
    try:
        said = json.loads(lock.read_text() or "{}")
        inode = lock.stat().st_ino
    except (OSError, ValueError):
        return False, {}
    said = said if isinstance(said, dict) else {}
    try:  # Linux lists every flock: "1: FLOCK ADVISORY WRITE <pid> <major>:<minor>:<inode> 0 EOF"
        with open("/proc/locks") as locks:
            return any(f[1] == "FLOCK" and f[5].rsplit(":", 1)[-1] == str(inode)
                       for f in (line.split() for line in locks) if len(f) > 5), said
    except OSError:
        pass
    if said.get("host") != socket.gethostname() or not isinstance(said.get("pid"), int):
        return None, said
    return process_alive(said["pid"]), said


class StatusReader:
    """The status of one run directory, read again at each `read()` (metrics.jsonl from where
    the last reading stopped)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.dir = find_run(self.path)
        self._reset()

    def _reset(self) -> None:
        self.offset = 0  # bytes of metrics.jsonl folded in so far (complete lines)
        self.unreadable = 0  # complete lines that are not JSON objects
        self.records = 0
        self.last_round: dict | None = None
        self.clients: set[str] = set()  # clients evaluated (in process) or that trained in a round
        self.participation: dict[str, dict[str, int]] = {}  # site -> answered, late, missing
        self.last_participation: dict | None = None
        self.missed: list[dict] = []
        self.refused: list[dict] = []
        self.diverged: list[dict] = []
        self.privacy: list[dict] = []  # records that carry epsilon per client

    def read(self) -> dict[str, Any]:
        info, notes = read_run_info(self.dir)
        if not self.dir.is_dir():  # it finished meanwhile: renamed from <out>.partial to <out>
            self.dir = find_run(self.path)
            info, notes = read_run_info(self.dir)
        self._fold()
        return self._status(info, notes)

    # -- metrics.jsonl -------------------------------------------------------------------
    def _fold(self) -> None:
        path = self.dir / METRICS_FILE
        try:
            with open(path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if size < self.offset:  # cut back to a checkpoint by a resume: read it again
                    self._reset()
                handle.seek(self.offset)
                data = handle.read(size - self.offset)
        except FileNotFoundError:
            return
        complete = data[: data.rfind(b"\n") + 1]  # a half-written last line waits for the next reading
        self.offset += len(complete)
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if isinstance(record, dict):
                self._take(record)
            elif line.strip():
                self.unreadable += 1

    def _take(self, r: dict) -> None:
        self.records += 1
        kind = r.get("type")
        if kind == "round":
            self.last_round = {k: r[k] for k in ROUND_FIELDS if r.get(k) is not None}
            if any(r.get(f) for f in EPSILON_FIELDS):
                self.privacy.append(r)
        elif kind == "client_eval" and r.get("client") is not None:
            self.clients.add(str(r["client"]))
        elif kind == "privacy_budget":
            self.privacy.append(r)
        elif kind == "participation":
            for what in ("answered", "late", "missing"):
                for site in r.get(what) or []:
                    self.participation.setdefault(str(site), {"answered": 0, "late": 0, "missing": 0})[what] += 1
            self.last_participation = {k: r.get(k) for k in (*ROUND_FIELDS, "operation", "answered", "late",
                                                             "missing") if r.get(k) is not None}
        elif kind == "missed":
            self.missed.append({k: r[k] for k in ("site", "operation", *ROUND_FIELDS, "late") if k in r})
        elif kind == "refused":
            self.refused.append({k: r[k] for k in ("site", "reason") if k in r})
        elif kind == "diverged":
            self.diverged.append({k: r[k] for k in ("method", "seed", "model", "reason") if k in r})

    # -- the status ----------------------------------------------------------------------
    def _status(self, info: dict, notes: list[str]) -> dict[str, Any]:
        progress = info.get("progress") or {}
        done, total = progress.get("units_done"), progress.get("units_total")
        live, holder = lock_holder(self.dir) if self.dir.name.endswith(PARTIAL) else (False, {})
        status = str(info.get("status") or "unknown")
        if status == "running" and live is False:
            status = "crashed"  # run.json says running, but no process holds the run (fedcare resume records it)
        now = datetime.now(timezone.utc)
        out: dict[str, Any] = {
            "run_dir": str(self.dir), "study": info.get("study"), "title": info.get("title"), "status": status,
            "runtime": "flower" if info.get("runtime") == "flower" else "in process",
            "process": holder if live is not False and holder else None,
            "units_done": done, "units_total": total,
            "unit": min(done + 1, total) if status == "running" and isinstance(done, int) and isinstance(total, int)
            and done < total else None,
            "current_round": self.last_round,
            "started": info.get("started"), "finished": info.get("finished"),
            "elapsed_seconds": _seconds(info.get("started"), info.get("finished") or (
                now if status == "running" else _modified(self.dir / RUN_FILE))),  # stopped: its last word
            "eta_seconds": _eta(info, now) if status == "running" else None,
            "error": info.get("error") if status in ("failed", "interrupted", "crashed") else None,
            "records": self.records,
            "clients": sorted(self.clients, key=_natural),
        }
        if status == "crashed" and not out["error"]:
            out["error"] = "no process holds the run: it ended without recording why (continue it with fedcare resume)"
        if self.participation or out["runtime"] == "flower":
            out["sites"] = {site: dict(c) for site, c in sorted(self.participation.items())}
            out["last_exchange"] = self.last_participation
            out["missed"] = self.missed[-20:]
            out["refused"] = self.refused
        out["epsilon"] = self._epsilon()
        out["diverged"] = self.diverged
        if isinstance(info.get("mlflow"), dict):
            out["mlflow"] = {k: info["mlflow"].get(k) for k in ("uri", "run_id")}
        lineage = _lineage(self.dir)
        if lineage is not None:
            out["lineage"] = lineage
        if self.unreadable:
            notes.append(f"{METRICS_FILE}: {self.unreadable} line(s) are not JSON records and were skipped")
        out["notes"] = notes
        return out

    def _epsilon(self) -> list[dict]:
        """Epsilon spent so far per method, protection and client (the privacy report's rows)."""
        if not self.privacy:
            return []
        import tomllib

        from fedcare.privacy.report import budget_rows  # the same reading as the report's budget table

        try:
            config = tomllib.loads((self.dir / "config.toml").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            config = {}
        return [{k: r.get(k) for k in ("method", "kind", "client", "epsilon", "target", "skipped")}
                for r in budget_rows(self.privacy, config)]


def _natural(name: str) -> tuple:
    return (0, int(name), "") if name.lstrip("-").isdigit() else (1, 0, name)


def _time(text: Any) -> datetime | None:
    if isinstance(text, datetime):
        return text
    try:
        moment = datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _modified(path: Path) -> datetime | None:
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)
    except OSError:
        return None


def _seconds(start: Any, end: Any) -> float | None:
    a, b = _time(start), _time(end)
    return max((b - a).total_seconds(), 0.0) if a and b else None


def _eta(info: dict, now: datetime) -> float | None:
    """Seconds left: the units left at the pace of the units this process has finished (None before its first)."""
    pace, progress = info.get("pace") or {}, info.get("progress") or {}
    since, before = _time(pace.get("since")), pace.get("units_done")
    done, total = progress.get("units_done"), progress.get("units_total")
    if since is None or not all(isinstance(n, int) for n in (before, done, total)) or done <= before:
        return None
    return (now - since).total_seconds() / (done - before) * (total - done)


def _lineage(run_dir: Path) -> dict | None:
    """lineage.jsonl's count of records and its last complete one (None: the run has none)."""
    try:
        data = (run_dir / LINEAGE_FILE).read_bytes()
    except OSError:
        return None
    lines = [line for line in data[: data.rfind(b"\n") + 1].splitlines() if line.strip()]
    last = None
    if lines:
        try:
            last = json.loads(lines[-1])
        except ValueError:
            pass
    return {"records": len(lines), "last": last}


# -- what a person reads -------------------------------------------------------------------
def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    h, rest = divmod(int(round(seconds)), 3600)
    m, s = divmod(rest, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else f"{m}m {s:02d}s"


def _where(r: dict | None) -> str:
    if not r:
        return "-"
    parts = [str(r["method"])] if r.get("method") is not None else []
    parts += [f"seed {r['seed']}"] if r.get("seed") is not None else []
    parts += [str(r["phase"])] if r.get("phase") is not None else []
    parts += [f"{r['model']}'s model"] if r.get("model") is not None else []
    parts += [f"round {r['round']}"] if r.get("round") is not None else []
    return ", ".join(parts)


def render(status: dict):
    """The status as a rich table, for a terminal."""
    from rich.table import Table
    from rich.text import Text

    colour = {"running": "cyan", "finished": "green", "interrupted": "yellow"}.get(status["status"], "red")
    table = Table(show_header=False, box=None, pad_edge=False, title=Text(status["run_dir"], style="bold"),
                  title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("status", Text(status["status"], style=colour))
    if status.get("process"):
        p = status["process"]
        table.add_row("process", f"{p.get('pid', '?')} on {p.get('host', '?')} since {p.get('since', '?')}")
    table.add_row("study", f"{status.get('study') or '?'}: {status.get('title') or ''}".rstrip(": "))
    table.add_row("runtime", status["runtime"])
    done, total = status.get("units_done"), status.get("units_total")
    units = f"{done if done is not None else '?'} of {total if total is not None else '?'} done"
    if status.get("unit"):
        units = f"unit {status['unit']} of {total} ({units})"
    table.add_row("units", units)
    table.add_row("last round", _where(status.get("current_round")))
    eta = status.get("eta_seconds")
    table.add_row("elapsed", _duration(status.get("elapsed_seconds"))
                  + (f", about {_duration(eta)} left" if eta is not None else ""))
    if status.get("clients"):
        table.add_row("clients evaluated", ", ".join(status["clients"]))
    if "sites" in status:
        for site, c in status["sites"].items():
            table.add_row(f"site {site}", f"answered {c['answered']}, late {c['late']}, missing {c['missing']}")
        last = status.get("last_exchange")
        if last:
            table.add_row("last exchange", f"{_where(last)}: answered {', '.join(last.get('answered', [])) or '-'}; "
                                           f"late {', '.join(last.get('late', [])) or '-'}; "
                                           f"missing {', '.join(last.get('missing', [])) or '-'}")
        for r in status.get("refused") or []:
            table.add_row("refused", f"{r.get('site')}: {r.get('reason')}")
    for e in status.get("epsilon") or []:
        budget = f" of {e['target']:g}" if isinstance(e.get("target"), (int, float)) else ""
        table.add_row("epsilon", f"{e['method']} ({e['kind']}), client {e['client']}: {e['epsilon']:.3g}{budget}")
    for d in status.get("diverged") or []:
        table.add_row("diverged", f"{d.get('method')} (seed {d.get('seed')}): {d.get('reason')}")
    if status.get("lineage"):
        table.add_row("lineage", f"{status['lineage']['records']} record(s) in {LINEAGE_FILE}")
    if status.get("mlflow"):
        table.add_row("MLflow", f"run {status['mlflow'].get('run_id')} at {status['mlflow'].get('uri')}")
    if status.get("error"):
        table.add_row("error", status["error"])
    for note in status.get("notes") or []:
        table.add_row("note", note)
    return table

"""A run's bookkeeping: what run.json and run.log say about one run, from its start to its end.

`RunRecord` writes everything a run says about itself besides its records (metrics.jsonl):
what it is (study, title, config file and its digest, seeds, methods), when it started and
finished, the arithmetic and fedcare version it began on and each resume on others since, how
far it got, and how it ended (status, the report's notes, the error). The run sequence
(`fedcare.studies.run`) calls it at each of its steps, in this order:

- `begin`: a new run writes config.toml; run.json says what runs, since when, on what;
- `runtime_ready`: the runtime's facts known from the start (a run across sites says so);
- `planned`: the protocol's units, and whether the data are synthetic;
- `unit_finished`: each finished unit (the checkpoint calls it once the unit is durable);
- `finish`: the protocol's and the runtime's facts, the lineage's seal, the report's notes
  (`notes`), "finished";
- `reported`: the report is written; the run is over;
- `stopped`: a run that failed or was interrupted says why (`discarded`: one that kept nothing).

With `[tracking]`, each step tells the run's MLflow run too (`fedcare.studies.tracking`):
`begin` opens it (a resume continues run.json's), every durable record is logged as its unit
finishes, and `reported` logs the files and ends it.

Something new a run must record is one call in the step it belongs to: a fact known at the
start (a tracking run's id) in `begin` or `runtime_ready`, live progress in `unit_finished`,
a fact or verdict known at the end (the lineage of the aggregates, a privacy audit's verdict)
in `finish`, a note for the report in `notes`; each through `update` (run.json) or `log`
(run.log).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedcare import __version__
from fedcare.compute import compute_facts, describe, same_arithmetic
from fedcare.config import to_toml
from fedcare.files import atomic_write_text
from fedcare.studies.base import Study, StudyProtocol, StudyRuntime
from fedcare.studies.rundir import RunDirectory, log, now, read_run_info, read_run_records, update_run_info

if TYPE_CHECKING:
    from fedcare.studies.tracking import MlflowRun


def config_digest(run_dir: Path) -> str:
    """SHA-256 of a run's config.toml, as written when it started."""
    return hashlib.sha256((Path(run_dir) / "config.toml").read_bytes()).hexdigest()


class RunRecord:
    """run.json and run.log of the run in `run` (its partial directory), for `study`; `resumed`:
    this process continues a run that an earlier one began (`fedcare resume`)."""

    def __init__(self, run: RunDirectory, study: Study, *, resumed: bool):
        self.dir = run.partial
        self.name = run.out.name
        self.study = study
        self.resumed = resumed
        self.before = read_run_info(self.dir)[0] if resumed else {}  # run.json as the earlier process left it
        self.compute: dict = {}  # the arithmetic this process computes on (`begin`)
        self.compute_changes = list(self.before.get("compute_changes", []))
        self.version_changes = list(self.before.get("version_changes", []))
        self.tracking: MlflowRun | None = None  # the MLflow run, with [tracking] (`begin`)

    def update(self, **facts: Any) -> None:
        update_run_info(self.dir, **facts)

    def log(self, message: str) -> None:
        log(self.dir, message)

    # -- the steps of a run ------------------------------------------------------------
    def begin(self, config_file: str) -> None:
        """A new run writes its config.toml; run.json says what runs, since when, with status
        "running", and the arithmetic it begins on (a resume: each change of arithmetic or
        fedcare version since the run began, logged)."""
        config = self.study.config
        self.compute = {**compute_facts(), **self.study.compute.facts()}
        if self.resumed:
            started = self.before.get("started", now())
        else:
            atomic_write_text(self.dir / "config.toml", to_toml(config))
            started = now()
            self.update(config_sha256=config_digest(self.dir))
        self.log(f"{'resumed' if self.resumed else 'started'} {self.study.name} run {self.name} (pid {os.getpid()})")
        self.update(run_dir=self.name, study=self.study.name, title=config.title, config_file=config_file,
                    seeds=config.seeds, methods=config.methods, started=started, status="running")
        if self.resumed:
            self._resumed_on()
        else:
            self.update(compute=self.compute)
        self._open_tracking()

    def _open_tracking(self) -> None:
        """With [tracking]: the run's MLflow run (a resume continues the one run.json names);
        without MLflow installed, a ConfigError before any data are read."""
        settings = self.study.config.tracking
        if settings is None:
            return
        from fedcare.studies.tracking import MlflowRun, continued  # MLflow: only for a run that tracks

        self.tracking = MlflowRun.begin(self.dir, settings, self.study.name, resume=continued(self.before, settings))
        if self.tracking is not None:
            self.update(mlflow=self.tracking.state())
            self.log(f"tracking: MLflow run {self.tracking.run_id} at {self.tracking.uri}")

    def _tracked(self, tags: bool = False) -> dict:
        """MLflow gets the records made durable since it last did (and the tags, as run.json says
        now); returns run.json's `mlflow`, to write with the step's own facts."""
        if self.tracking is None:
            return {}
        if tags:
            self.tracking.tag()
        self.tracking.log_records()
        return {"mlflow": self.tracking.state()}

    def _track(self, tags: bool = False) -> None:
        if self.tracking is not None:
            self.update(**self._tracked(tags))

    def _resumed_on(self) -> None:
        """A resume on other arithmetic, or under another fedcare version, than the run began
        with: logged, and kept in run.json for the report's notes."""
        done = (self.before.get("progress") or {}).get("units_done", 0)
        begun = self.before.get("compute")
        if isinstance(begun, dict) and not same_arithmetic(begun, self.compute):
            self.log(f"resumed after {done} units on other arithmetic: {describe(self.compute)} "
                     f"(begun on {describe(begun)})")
            self.compute_changes.append({"after_units": done, "compute": self.compute})
            self.update(compute_changes=self.compute_changes)
        began = self.before.get("fedcare_version")
        if began not in (None, __version__):
            self.log(f"resumed after {done} units under fedcare {__version__} (begun under {began})")
            self.version_changes.append({"after_units": done, "fedcare_version": __version__})
            self.update(version_changes=self.version_changes)

    def runtime_ready(self, runtime: StudyRuntime) -> None:
        """What the runtime says from the start (a run across sites: that it is, so that a
        failure's note says how to continue it)."""
        self.update(**runtime.start_facts())

    def planned(self, runtime: StudyRuntime, protocol: StudyProtocol) -> None:
        """Whether the data are synthetic, and the protocol's units (those a resume skips done);
        `pace`: when this process starts its units and how many were done then (the ETA of
        `fedcare status`)."""
        self.update(synthetic=runtime.synthetic, progress=_progress(protocol.units_done, protocol.units_total),
                    pace={"since": now(), "units_done": protocol.units_done})
        self._track(tags=True)  # a resume: what the earlier process made durable

    def unit_finished(self, key: tuple, done: int, total: int) -> None:
        """Unit `key` is finished and durable: `done` of `total`."""
        self.update(progress=_progress(done, total), **self._tracked())
        self.log(f"finished {'/'.join(map(str, key))} ({done} of {total} units)")

    def finish(self, runtime: StudyRuntime, protocol: StudyProtocol, seconds: float) -> None:
        """The protocol ran to its end in `seconds`: its facts and the runtime's, the privacy audit's
        verdict, the lineage's seal, the notes, "finished"."""
        self._privacy_audit()
        self._lineage(runtime)
        self.update(**protocol.facts(), finished=now(), training_seconds=round(seconds, 2),
                    notes=self.notes(runtime, protocol), status="finished",
                    progress=_progress(protocol.units_done, protocol.units_total), **runtime.facts())
        self._track(tags=True)

    def reported(self) -> None:
        """The report is written: the run is over (with [tracking]: its files go to MLflow, whose run ends)."""
        if self.tracking is not None:
            self.tracking.finish("FINISHED")
        self.log("finished")

    def _privacy_audit(self) -> None:
        """run.json's `privacy_audit` when the run had a one-run audit ([privacy.audit] canaries):
        whether every accountant's epsilon stands against the audit's epsilon-hat; a
        contradiction is logged too, never quiet (the report and its tables head with it)."""
        from fedcare.privacy.report import audit_verdict  # the privacy layer's reading of the records

        verdict = audit_verdict(read_run_records(self.dir)[0])
        if verdict is None:
            return
        self.update(privacy_audit=verdict)
        if not verdict["sound"]:
            self.log("PRIVACY AUDIT CONTRADICTS THE ACCOUNTANT: " + "; ".join(verdict["unsound"]))

    def _lineage(self, runtime: StudyRuntime) -> None:
        """run.json's `lineage`: how many records lineage.jsonl ends with, the last one's hash (what
        `fedcare lineage --verify` checks the file's end against) and how many models were saved."""
        lineage = getattr(runtime, "lineage", None)
        if lineage is not None:
            lineage.flush()
            self.update(lineage=lineage.seal())

    def stopped(self, why: str, interrupted: bool) -> None:
        """The run failed (or was interrupted) with `why`; a full disk leaves what is on it."""
        try:
            self.log(f"stopped: {why}")
            self.update(status="interrupted" if interrupted else "failed", error=why)
        except OSError:
            pass
        self.discarded(interrupted)

    def discarded(self, interrupted: bool) -> None:
        """The run stopped (and its directory, holding nothing finished, may be removed): with
        [tracking], its MLflow run ends KILLED (interrupted) or FAILED; its records are those of
        the finished units, logged as each finished."""
        if self.tracking is not None:
            self.tracking.tag()
            self.tracking.end("KILLED" if interrupted else "FAILED")

    # -- the report's notes ------------------------------------------------------------
    def notes(self, runtime: StudyRuntime, protocol: StudyProtocol) -> list[str]:
        """What the report must say about this run besides its numbers."""
        return (runtime.notes() + protocol.notes() + self._diverged_notes() + self._compute_notes()
                + self._version_notes() + self._reproducibility_notes() + self._robustness_notes())

    def _diverged_notes(self) -> list[str]:
        """A note for each method whose training stopped on a loss that was not a number."""
        records, _ = read_run_records(self.dir)
        notes = []
        for r in records:
            if r.get("type") == "diverged":
                which = f"{r['method']} (seed {r['seed']}" + (f", {r['model']}'s model" if r.get("model") else "") + ")"
                notes.append(f"{which} stopped: {r['reason']}. Its rows cover only what it finished before; the other "
                             "methods ran on.")
        return notes

    def _compute_notes(self) -> list[str]:
        """A note for each resume on other arithmetic than the run began with."""
        begun = self.before.get("compute") if self.resumed else self.compute
        return [f"Resumed after {c.get('after_units', '?')} finished units on other arithmetic "
                f"({describe(c['compute'])}; begun on {describe(begun)}): the records after that may differ from an "
                f"uninterrupted run's by float rounding." for c in self.compute_changes if isinstance(begun, dict)]

    def _version_notes(self) -> list[str]:
        """A note for each resume under another fedcare version than the run began with."""
        began = self.before.get("fedcare_version") if self.resumed else None
        return [f"Resumed after {v.get('after_units', '?')} finished units under fedcare {v['fedcare_version']} "
                f"(begun under {began}): the records after that come from that version's code."
                for v in self.version_changes if began]

    def _reproducibility_notes(self) -> list[str]:
        """A note when a rerun of this run may not give the same numbers bit for bit."""
        why = self.study.compute.reproducible()
        return [f"Not bit-reproducible: {why}."] if why else []

    def _robustness_notes(self) -> list[str]:
        from fedcare.algorithms.robust import describe as describe_robustness

        note = describe_robustness(self.study.config.robustness)
        return [note] if note else []


def _progress(done: int, total: int) -> dict[str, int]:
    return {"units_done": done, "units_total": total}

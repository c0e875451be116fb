"""A run logged to MLflow while it runs (`[tracking] mlflow = "<URI>"`), or after the fact
(`fedcare export RUN_DIR --mlflow URI`): both log the same, from the run directory alone.

- **params**: config.toml flattened to dotted keys (`train.lr`); a value longer than MLflow
  takes (6000 characters) is cut and says so (config.toml is an artifact, whole);
- **tags** `fedcare.*`, from run.json: study, methods, synthetic or real data, runtime (in
  process or across sites), device, compute, fedcare's version, the run directory;
- **metrics**: every number of every record of metrics.jsonl, under a key naming the record
  (`round/FedAvg/seed 1/train/train_loss`, `client_eval/FedAvg/seed 1/client 3/accuracy`), at
  step = its round (or session, else 0); a table of numbers (epsilon per client) gives a key
  per entry, a list of names (the sites that answered) its length;
- **artifacts** at the end: report.html, tables/, plots/, config.toml, run.json, metrics.jsonl
  lineage.jsonl and the saved models (models/) where the run has them.

Only durable records are logged: those a checkpoint has committed (after each finished unit,
and all of them at the end), so a resumed run, whose metrics.jsonl is cut back to its last
checkpoint, logs each record once. run.json's `mlflow` names the MLflow run (uri, experiment,
run id) and how much of metrics.jsonl it holds (`logged_bytes`); `fedcare resume` and `fedcare
export` to that store continue it (an export to another store is `mlflow_exports`, by store).

A tracking failure (a server down) never stops the run: a warning in run.log and on stderr,
tracking stops for this process, and `fedcare export` logs the rest later. MLflow is imported
here only, and only by a run that tracks: a site, or a run without `[tracking]`, never loads it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fedcare.config import ConfigError, Tracking
from fedcare.errors import InputError
from fedcare.runfiles import LINEAGE_FILE, LOG_FILE, METRICS_FILE, MODELS_DIR, RUN_FILE, read_run_info
from fedcare.studies.rundir import log, update_run_info

INSTALL = 'pip install "fedcare[mlflow]"'
RUN_INFO_KEY = "mlflow"  # run.json: the run's own MLflow run ([tracking]): {uri, experiment_id, run_id, logged_bytes}
EXPORTS_KEY = "mlflow_exports"  # run.json: {uri: the same} of each other store `fedcare export` logged it to
FILES = ("report.html", "config.toml", RUN_FILE, METRICS_FILE, LOG_FILE, LINEAGE_FILE)  # those the run has
FOLDERS = ("tables", "plots", MODELS_DIR)  # MODELS_DIR: the saved global models (safetensors), named in the lineage
# MLflow's limits (mlflow.utils.validation): a param's value, a key, entries per log_batch call
PARAM_LENGTH, KEY_LENGTH, METRICS_PER_BATCH, PARAMS_PER_BATCH = 6000, 250, 1000, 100
CUT = " ... (cut to MLflow's 6000 characters; config.toml has it whole)"
# the record's fields that name it (in this order), and those that are its step
NAME_FIELDS = ("method", "seed", "phase", "model", "site", "client", "view", "operation", "protection")
STEP_FIELDS = ("round", "session")
NOT_METRICS = {"type", "study", *NAME_FIELDS}
# MLflow's HTTP client retries a request 7 times with growing pauses (minutes on a server that
# is down): a run's tracking gives up sooner, unless the environment says otherwise
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}

warn = logging.getLogger("fedcare.tracking").warning


# -- what MLflow gets, from the run directory ----------------------------------------------
def params_of(config_toml: str) -> dict[str, str]:
    """config.toml's keys, dotted, with their values as text (lists as JSON)."""
    def flat(table: dict, prefix: str) -> Iterator[tuple[str, str]]:
        for key, value in table.items():
            name = prefix + _segment(str(key))
            if isinstance(value, dict):
                yield from flat(value, f"{name}.")
            else:
                text = value if isinstance(value, str) else json.dumps(value)
                yield _key(name, "."), text if len(text) <= PARAM_LENGTH else text[: PARAM_LENGTH - len(CUT)] + CUT

    return dict(flat(tomllib.loads(config_toml), ""))


def tags_of(info: dict, config: dict, run_dir: Path) -> dict[str, str]:
    """The run's tags, from its run.json and config.toml; `run_dir`: where it is (its final name)."""
    from fedcare.compute import describe

    compute = info.get("compute")
    tags = {"study": info.get("study"), "methods": ", ".join(map(str, info.get("methods") or [])) or None,
            "title": info.get("title"), "data": {True: "synthetic", False: "real"}.get(info.get("synthetic")),
            "runtime": "flower" if info.get("runtime") == "flower" else "in process",
            "device": (config.get("runtime") or {}).get("device", "cpu"),
            "compute": describe(compute) if isinstance(compute, dict) else None,
            "fedcare_version": info.get("fedcare_version"), "status": info.get("status"),
            "run_dir": str(Path(run_dir).resolve()).removesuffix(".partial")}
    return {f"fedcare.{k}": str(v)[:PARAM_LENGTH] for k, v in tags.items() if v is not None}


def record_metrics(record: dict) -> list[tuple[str, float, int]]:
    """(key, value, step) of each number in one record of metrics.jsonl."""
    step_field = next((f for f in STEP_FIELDS if _is_int(record.get(f))), None)
    step = record[step_field] if step_field else 0
    names = [str(record.get("type", "record"))]
    for field in NAME_FIELDS:
        if record.get(field) is not None:
            value = record[field]
            names.append(str(value) if field in ("method", "phase") else f"{field} {value}")
    prefix = "/".join(_segment(n) for n in names)
    out: list[tuple[str, float, int]] = []
    for field, value in record.items():
        if field not in NOT_METRICS and field != step_field:
            out += [(_key(f"{prefix}/{name}", "/"), v, step) for name, v in _numbers(_segment(field), value)]
    return out


def _numbers(name: str, value: Any) -> Iterator[tuple[str, float]]:
    """The numbers in one field: itself, a table's entries (name/entry), a list of numbers'
    items (name/i), a list of names' length."""
    if _is_number(value):
        if math.isfinite(value):
            yield name, float(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers(f"{name}/{_segment(str(k))}", v)
    elif isinstance(value, list):
        if value and all(_is_number(v) for v in value):
            for i, v in enumerate(value):
                yield from _numbers(f"{name}/{i}", v)
        elif all(isinstance(v, str) for v in value):
            yield name, float(len(value))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _segment(text: str) -> str:
    """One part of a key, in the characters MLflow accepts (letters, digits, _ - . space :)."""
    text = re.sub(r"[^\w.\- :]+", "_", text).strip("_ ") or "_"
    return "_" if set(text) == {"."} else text


def _key(key: str, joint: str) -> str:
    """A key within MLflow's 250 characters (a longer one keeps its start and a digest of the rest)."""
    if len(key) <= KEY_LENGTH:
        return key
    import hashlib

    return key[: KEY_LENGTH - 13].rstrip("/. ") + joint + "cut-" + hashlib.sha256(key.encode()).hexdigest()[:8]


def durable_records(run_dir: Path, start: int, end: int) -> tuple[list[dict], int]:
    """The records of metrics.jsonl's complete lines between byte offsets `start` and `end`, and
    the offset after the last of them."""
    with open(Path(run_dir) / METRICS_FILE, "rb") as handle:
        handle.seek(start)
        data = handle.read(max(end - start, 0))
    complete = data[: data.rfind(b"\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()], start + len(complete)


# -- the MLflow run ------------------------------------------------------------------------
def mlflow_client(uri: str):
    """MLflow's client for `uri`; a one-line ConfigError when MLflow is not installed."""
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    if is_file_store(uri):  # MLflow 3 keeps its file store in maintenance mode, behind an opt-in: the config chose it
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise ConfigError(f"tracking.mlflow: MLflow is not installed; install it with {INSTALL}") from None
    return MlflowClient(tracking_uri=uri)


def absolute_uri(uri: str) -> str:
    """`uri` with a relative SQLite or file-store path made absolute (a resume or an export
    from elsewhere finds the same store)."""
    parts = urlsplit(uri)
    if parts.scheme == "sqlite":
        path = uri[len("sqlite:///"):]
        return uri if path.startswith("/") else f"sqlite:///{Path(path).resolve()}"
    if is_file_store(uri) and parts.scheme != "file":  # a folder
        return str(Path(uri).resolve())
    return uri


def is_file_store(uri: str) -> bool:
    """Whether `uri` names MLflow's file store (a folder): a path, or file://."""
    scheme = urlsplit(uri).scheme
    return scheme in ("", "file") or bool(re.match(r"^[A-Za-z]:[\\/]", uri))


def tracking_failures() -> tuple[type[BaseException], ...]:
    """What the tracking side raises when it cannot log (a store or server that fails, the
    network): a warning, never the end of a run. Anything else is a bug and keeps its traceback."""
    from mlflow.exceptions import MlflowException

    failures: tuple[type[BaseException], ...] = (MlflowException, OSError)
    try:
        from sqlalchemy.exc import SQLAlchemyError
    except ImportError:
        return failures
    return (*failures, SQLAlchemyError)


class MlflowRun:
    """One run directory's MLflow run. `begin` opens it (run.json's, or a new one), `log_records`
    logs what is durable, `finish` the artifacts and the end. After a failure it stops for
    this process (`broken`), with a warning in run.log."""

    def __init__(self, run_dir: Path, client, uri: str, experiment_id: str, run_id: str, logged: int,
                 check_logged: bool):
        self.dir = Path(run_dir)
        self.client = client
        self.uri = uri
        self.experiment_id = experiment_id
        self.run_id = run_id
        self.logged = logged  # bytes of metrics.jsonl whose records MLflow has
        self.check_logged = check_logged  # a continued run: MLflow may hold records run.json does not count
        self.broken = False
        self.failures = tracking_failures()

    @classmethod
    def begin(cls, run_dir: Path, settings: Tracking, study: str, *, resume: dict | None = None,
              uri: str | None = None) -> "MlflowRun | None":
        """The MLflow run of `run_dir`: the one `resume` (run.json's `mlflow`) names, else a new one
        in `settings.experiment` at `uri` (default: settings.mlflow) with the config's params and
        the run's tags. None, after a warning, when the store cannot be reached."""
        uri = absolute_uri(uri or (resume or {}).get("uri") or settings.mlflow)
        client = mlflow_client(uri)
        failures = tracking_failures()
        try:
            if resume and resume.get("run_id") and resume.get("uri") == uri:
                client.update_run(resume["run_id"], status="RUNNING")
                run = cls(run_dir, client, uri, str(resume.get("experiment_id", "")), resume["run_id"],
                          int(resume.get("logged_bytes", 0)), check_logged=True)
            else:
                experiment_id = _experiment(client, uri, settings.experiment or f"fedcare-{study}")
                name = Path(run_dir).name.removesuffix(".partial")
                created = client.create_run(experiment_id, run_name=name)
                run = cls(run_dir, client, uri, experiment_id, created.info.run_id, 0, check_logged=False)
                run._log_params()
            run.tag()
            return run
        except ImportError as e:  # a database MLflow reaches through a driver that is not installed
            raise ConfigError(f"tracking.mlflow: {uri.split(':')[0]} needs {e.name or e}, which is not installed") \
                from None
        except failures as e:
            _warn(run_dir, uri, "opening the MLflow run", e)
            return None

    def state(self) -> dict:
        """What run.json keeps of it: where it is, and how much of metrics.jsonl it holds."""
        return {"uri": self.uri, "experiment_id": self.experiment_id, "run_id": self.run_id,
                "logged_bytes": self.logged}

    def _safely(self, what: str, action: Callable[[], None]) -> bool:
        """Run `action`; a tracking failure is a warning and stops tracking for this process."""
        if self.broken:
            return False
        try:
            action()
            return True
        except self.failures as e:
            self.broken = True
            _warn(self.dir, self.uri, what, e)
            return False

    def _log_params(self) -> None:
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in params_of((self.dir / "config.toml").read_text(encoding="utf-8")).items()]
        for i in range(0, len(params), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i: i + PARAMS_PER_BATCH])

    def tag(self) -> bool:
        """The tags, as run.json and config.toml say now."""
        def action() -> None:
            from mlflow.entities import RunTag

            config = tomllib.loads((self.dir / "config.toml").read_text(encoding="utf-8"))
            tags = [RunTag(k, v) for k, v in tags_of(read_run_info(self.dir)[0], config, self.dir).items()]
            self.client.log_batch(self.run_id, tags=tags)

        return self._safely("tagging the MLflow run", action)

    def log_records(self, upto: int | None = None) -> bool:
        """Log the records of metrics.jsonl from where MLflow stopped up to byte `upto` (default:
        its end, complete lines); False once tracking has failed."""
        from mlflow.entities import Metric

        path = self.dir / METRICS_FILE
        end = path.stat().st_size if upto is None and path.is_file() else (upto or 0)
        if end < self.logged:  # cut back by a resume (records that are rewritten, byte for byte)
            self.check_logged, self.logged = True, end
        records, end = durable_records(self.dir, self.logged, end) if end > self.logged else ([], end)
        stamp = int(time.time() * 1000)
        metrics = [Metric(k, v, stamp, s) for r in records for k, v, s in record_metrics(r)]
        for i in range(0, len(metrics), METRICS_PER_BATCH):
            batch = metrics[i: i + METRICS_PER_BATCH]
            if not self._safely("logging metrics to MLflow", lambda: self._log_metrics(batch)):
                return False
        self.logged, self.check_logged = end, False
        return True

    def _log_metrics(self, batch: list) -> None:
        """One batch, unless a continued run finds it in MLflow already (its last metric logged
        by a process that died before run.json said so)."""
        if self.check_logged:
            last = batch[-1]
            if any(m.step == last.step and m.value == last.value
                   for m in self.client.get_metric_history(self.run_id, last.key)):
                return
        self.client.log_batch(self.run_id, metrics=batch)

    def finish(self, status: str) -> bool:
        """The artifacts the run directory has (report, tables, plots, its records), then the
        MLflow run ends with `status` (FINISHED, KILLED, FAILED)."""
        def action() -> None:
            for name in FILES:
                if (self.dir / name).is_file():
                    self.client.log_artifact(self.run_id, str(self.dir / name))
            for name in FOLDERS:
                if (self.dir / name).is_dir():
                    self.client.log_artifacts(self.run_id, str(self.dir / name), artifact_path=name)

        return self._safely("logging the run's files to MLflow", action) and self.end(status)

    def end(self, status: str) -> bool:
        return self._safely("ending the MLflow run", lambda: self.client.set_terminated(self.run_id, status))


def continued(info: dict, settings: Tracking) -> dict | None:
    """The MLflow run a resumed run goes on with: the one it tracked to (run.json's `mlflow`), else
    one that `fedcare export` made in its store meanwhile."""
    return info.get(RUN_INFO_KEY) or (info.get(EXPORTS_KEY) or {}).get(absolute_uri(settings.mlflow))


def _experiment(client, uri: str, name: str) -> str:
    """The MLflow experiment `name`'s id, created if new (with a SQLite store: its artifacts
    beside the database, in mlartifacts/, not in the folder a run happens to start from)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        location = (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri()
    return client.create_experiment(name, artifact_location=location)


def _warn(run_dir: Path, uri: str, what: str, error: BaseException) -> None:
    """A tracking failure: one line in run.log and on stderr; the run goes on."""
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    message = (f"tracking: {what} failed at {uri} ({type(error).__name__}: {first}); the run goes on without "
               f"MLflow; `fedcare export {Path(run_dir)} --mlflow {uri}` logs it later")
    warn(message)
    try:
        log(run_dir, f"WARNING {message}")
    except OSError:
        pass


# -- after the fact ------------------------------------------------------------------------
MLFLOW_STATUS = {"finished": "FINISHED", "interrupted": "KILLED"}  # else FAILED (failed, crashed)


class ExportFailed(InputError):
    """MLflow could not take the run (the warning before it says why)."""


def export_run(run_dir: Path, uri: str, experiment: str | None = None) -> str:
    """Log a finished or stopped run directory to MLflow at `uri`: the MLflow run that run.json
    names for that store, continued, else a new one (then named in run.json). A stopped run logs
    its records up to its last checkpoint (what a resume keeps), and is held while it is
    exported (a live run is refused: it tracks itself with [tracking]). Returns the MLflow run id."""
    from fedcare.studies.rundir import PARTIAL, RunDirectory

    run_dir = Path(run_dir)
    held = RunDirectory.reopen(run_dir) if run_dir.name.endswith(PARTIAL) else None
    try:
        return _export(run_dir, absolute_uri(uri), experiment, stopped=held is not None)
    finally:
        if held is not None:
            held.release()


def _export(run_dir: Path, uri: str, experiment: str | None, stopped: bool) -> str:
    from fedcare.studies.checkpoint import Checkpoint

    info = read_run_info(run_dir)[0]
    upto = (Checkpoint.load(run_dir) or {}).get("offset", 0) if stopped else None
    own, exports = info.get(RUN_INFO_KEY) or {}, dict(info.get(EXPORTS_KEY) or {})
    before = own if own.get("uri") == uri else exports.get(uri)
    run = MlflowRun.begin(run_dir, Tracking(mlflow=uri, experiment=experiment), str(info.get("study") or "run"),
                          resume=before, uri=uri)
    if run is None:
        raise ExportFailed(f"{uri}: MLflow could not take the run (the warning above says why)")
    logged = run.log_records(upto)
    if own.get("uri") == uri:  # what the run's own tracking missed
        update_run_info(run_dir, **{RUN_INFO_KEY: run.state()})
    else:
        update_run_info(run_dir, **{EXPORTS_KEY: {**exports, uri: run.state()}})
    log(run_dir, f"exported to MLflow at {uri} (run {run.run_id})")
    if not logged or not run.finish(MLFLOW_STATUS.get(str(info.get("status")), "FAILED")):
        raise ExportFailed(f"{uri}: MLflow failed while taking {run_dir} (the warning above says why); exporting "
                           "again continues where it stopped")
    return run.run_id

"""MLflow tracking (fedcare.studies.tracking), against the real library on a SQLite store in a
temporary folder, read back with MLflow's own client: what a tracked run logs equals its
config.toml and metrics.jsonl; an interrupted and resumed run is one MLflow run with every step
once; `fedcare export` logs an untracked run as a live one is logged, and continues an MLflow
run instead of repeating it; a tracking failure never stops a run; without MLflow, `[tracking]`
is one line saying how to install it, and a run without it never loads MLflow."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.config import Tracking, to_toml
from fedcare.runtime.federation import Federation
from fedcare.studies.run import resume_study, run_study
from fedcare.studies.tracking import MlflowRun, export_run, params_of, record_metrics

from support.fedhealth2 import tiny_config
from support.interrupt import interrupted_at_call

mlflow_tracking = pytest.importorskip("mlflow.tracking")  # in the test extra: skipped only where it is not installed
NAMES = ("type", "study", "method", "seed", "phase", "client", "round")  # what names a fedhealth2 record


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One SQLite tracking store for the module (MLflow creates its tables once)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture(scope="module")
def tracked(store, tmp_path_factory) -> Path:
    """A finished run tracked live."""
    return run_study(tiny_config(tracking={"mlflow": store, "experiment": "live"}),
                     tmp_path_factory.mktemp("runs") / "tracked")


def client(store: str):
    return mlflow_tracking.MlflowClient(tracking_uri=store)


def mlflow_run_id(run_dir: Path, exported_to: str | None = None) -> str:
    """The MLflow run of run.json: the run's own (tracked live), or the one an export to another store made."""
    info = json.loads((run_dir / "run.json").read_text())
    return (info["mlflow_exports"][exported_to] if exported_to else info["mlflow"])["run_id"]


def expected_metrics(run_dir: Path, upto: int | None = None) -> list[tuple[str, int, float]]:
    """(key, step, value) of every number in metrics.jsonl (its first `upto` bytes), as the
    records name it: fedhealth2's round and client_eval records, at their round."""
    out = []
    for line in (run_dir / "metrics.jsonl").read_bytes()[:upto].splitlines():
        r = json.loads(line)
        where = (f"round/{r['method']}/seed {r['seed']}/{r['phase']}" if r["type"] == "round" else
                 f"client_eval/{r['method']}/seed {r['seed']}/client {r['client']}")
        out += [(f"{where}/{k}", r["round"], float(v)) for k, v in r.items()
                if k not in NAMES and isinstance(v, (int, float)) and not isinstance(v, bool)]
    return sorted(out)


def logged_metrics(store: str, run_id: str) -> list[tuple[str, int, float]]:
    """Every value of every metric of the MLflow run, each time it was logged."""
    c = client(store)
    return sorted((k, m.step, m.value) for k in c.get_run(run_id).data.metrics
                  for m in c.get_metric_history(run_id, k))


def flat_config(run_dir: Path) -> dict[str, str]:
    def flat(table: dict, prefix: str = "") -> dict[str, str]:
        out: dict[str, str] = {}
        for k, v in table.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else
                       {prefix + k: v if isinstance(v, str) else json.dumps(v)})
        return out

    return flat(tomllib.loads((run_dir / "config.toml").read_text()))


def without_mlflow(monkeypatch) -> None:
    """Make every `import mlflow...` fail, as where MLflow is not installed."""
    for name in [m for m in sys.modules if m == "mlflow" or m.startswith("mlflow.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "mlflow", None)


# -- what a record and a config become ---------------------------------------------------------
def test_every_number_of_a_record_is_a_metric_named_after_the_record_at_its_round():
    record = {"type": "round", "study": "pain", "method": "FP(N)", "seed": 5, "phase": "pretrain-federated",
              "round": 3, "train_loss": 0.25, "clients": 4, "n_train": 800, "val_loss": None, "late": True,
              "dp_epsilon_clients": {"43": 1.5, "44": 2.0}, "skipped": ["44"], "per_tool_f1": [0.5, 0.75]}
    prefix = "round/FP_N/seed 5/pretrain-federated"
    assert sorted(record_metrics(record)) == sorted([
        (f"{prefix}/train_loss", 0.25, 3), (f"{prefix}/clients", 4.0, 3), (f"{prefix}/n_train", 800.0, 3),
        (f"{prefix}/dp_epsilon_clients/43", 1.5, 3), (f"{prefix}/dp_epsilon_clients/44", 2.0, 3),
        (f"{prefix}/skipped", 1.0, 3), (f"{prefix}/per_tool_f1/0", 0.5, 3), (f"{prefix}/per_tool_f1/1", 0.75, 3)])
    # the pain study's test records are at a session; a record with neither is at step 0
    assert record_metrics({"type": "client_eval", "method": "PFDL", "seed": 1, "session": 2, "client": 43,
                           "acc": 0.5}) == [("client_eval/PFDL/seed 1/client 43/acc", 0.5, 2)]
    assert record_metrics({"type": "phase", "method": "F(N)", "seed": 1, "phase": "pretrain", "rounds": 7}) == \
        [("phase/F_N/seed 1/pretrain/rounds", 7.0, 0)]
    long = record_metrics({"type": "round", "method": "m" * 300, "round": 1, "loss": 1.0})[0][0]
    assert len(long) <= 250 and long.startswith("round/mmm")


def test_the_config_becomes_dotted_params_within_mlflows_length():
    params = params_of('title = "t"\nseeds = [1, 2]\n[train]\nlr = 0.1\n[deployment.sites]\n"site-a" = 43\n'
                       f'"ward (3)" = 44\n[data]\nroot = "{"x" * 7000}"\n')
    assert params["title"] == "t" and params["seeds"] == "[1, 2]" and params["train.lr"] == "0.1"
    assert params["deployment.sites.site-a"] == "43" and params["deployment.sites.ward _3"] == "44"
    assert len(params["data.root"]) == 6000 and params["data.root"].endswith("config.toml has it whole)")


# -- a run tracked live ------------------------------------------------------------------------
def test_a_tracked_run_reads_back_equal_to_its_config_records_and_files(store, tracked, tmp_path):
    run_id = mlflow_run_id(tracked)
    c = client(store)
    run = c.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked"
    assert run.data.params == flat_config(tracked)
    assert logged_metrics(store, run_id) == expected_metrics(tracked)  # every number once, at its round
    tags = run.data.tags
    assert (tags["fedcare.study"], tags["fedcare.methods"], tags["fedcare.data"], tags["fedcare.runtime"],
            tags["fedcare.device"]) == ("fedhealth2", "fedavg", "synthetic", "in process", "cpu")
    assert tags["fedcare.compute"].startswith("torch ") and tags["fedcare.run_dir"] == str(tracked.resolve())
    assert json.loads((tracked / "run.json").read_text())["mlflow"]["logged_bytes"] == \
        (tracked / "metrics.jsonl").stat().st_size
    assert f"<th>MLflow run</th><td>{run_id} at {store}</td>" in (tracked / "report.html").read_text()
    # the files: records, config, report and every table, byte for byte
    listed = {a.path for a in c.list_artifacts(run_id)}
    assert {"metrics.jsonl", "config.toml", "run.json", "report.html", "tables", "plots", "models",
            "lineage.jsonl"} <= listed
    tables = sorted(p.name for p in (tracked / "tables").iterdir())
    assert sorted(Path(a.path).name for a in c.list_artifacts(run_id, "tables")) == tables
    got = Path(c.download_artifacts(run_id, "metrics.jsonl", str(tmp_path)))
    assert got.read_bytes() == (tracked / "metrics.jsonl").read_bytes()
    got = Path(c.download_artifacts(run_id, f"tables/{tables[0]}", str(tmp_path)))
    assert got.read_bytes() == (tracked / "tables" / tables[0]).read_bytes()


def test_an_interrupted_and_resumed_run_ends_as_one_mlflow_run(store, tmp_path, monkeypatch):
    config = tiny_config(tracking={"mlflow": store, "experiment": "resumed"})
    # Ctrl-C in round 2's evaluation: round 2's record is written but not yet durable (a resume drops it)
    interrupted_at_call(monkeypatch, Federation, "evaluate", 3, lambda: run_study(config, tmp_path / "run"))
    partial = tmp_path / "run.partial"
    info = json.loads((partial / "run.json").read_text())
    run_id, logged = info["mlflow"]["run_id"], info["mlflow"]["logged_bytes"]
    assert client(store).get_run(run_id).info.status == "KILLED"
    assert 0 < logged < (partial / "metrics.jsonl").stat().st_size  # round 2's record is not logged
    assert logged_metrics(store, run_id) == expected_metrics(partial, logged)
    # exported as it stands to another store (a folder): what a resume keeps, in a KILLED run there
    folder = str(tmp_path / "mlruns")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # the export opts in; put back afterwards
    copy = export_run(partial, folder)
    assert client(folder).get_run(copy).info.status == "KILLED"
    assert logged_metrics(folder, copy) == expected_metrics(partial, logged)
    assert json.loads((partial / "run.json").read_text())["mlflow"]["run_id"] == run_id  # its own is untouched
    done = resume_study(partial)
    experiment = client(store).get_experiment_by_name("resumed").experiment_id
    assert [r.info.run_id for r in client(store).search_runs([experiment])] == [run_id]  # one MLflow run
    assert client(store).get_run(run_id).info.status == "FINISHED"
    assert logged_metrics(store, run_id) == expected_metrics(done)  # every step once


# -- after the fact ------------------------------------------------------------------------------
def test_export_logs_an_untracked_run_as_a_live_run_is_logged_and_never_twice(store, tracked, tmp_path, monkeypatch):
    without_mlflow(monkeypatch)  # a run without [tracking] never imports MLflow
    plain = run_study(tiny_config(), tmp_path / "plain")
    monkeypatch.undo()
    assert (plain / "metrics.jsonl").read_bytes() == (tracked / "metrics.jsonl").read_bytes()
    result = CliRunner().invoke(app, ["export", str(plain), "--mlflow", store, "--experiment", "exported"])
    assert result.exit_code == 0, result.output
    run_id = mlflow_run_id(plain, exported_to=store)
    assert f"exported {plain} to MLflow run {run_id}" in " ".join(result.output.split())
    live = client(store).get_run(mlflow_run_id(tracked)).data
    run = client(store).get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.experiment_id == \
        client(store).get_experiment_by_name("exported").experiment_id
    assert run.data.params == {k: v for k, v in live.params.items() if not k.startswith("tracking.")}
    assert logged_metrics(store, run_id) == logged_metrics(store, mlflow_run_id(tracked))
    assert {k: v for k, v in run.data.tags.items() if k.startswith("fedcare.") and k != "fedcare.run_dir"} == \
        {k: v for k, v in live.tags.items() if k.startswith("fedcare.") and k != "fedcare.run_dir"}
    # exported again: the same MLflow run, nothing twice; even when run.json lost count of what MLflow holds
    # (a process that died after MLflow took its records and before run.json said so)
    info = json.loads((plain / "run.json").read_text())
    info["mlflow_exports"][store]["logged_bytes"] = 0
    (plain / "run.json").write_text(json.dumps(info))
    assert export_run(plain, store) == run_id
    assert logged_metrics(store, run_id) == logged_metrics(store, mlflow_run_id(tracked))


def test_a_tracking_failure_never_stops_the_run_and_export_logs_the_rest(store, tmp_path, monkeypatch):
    from mlflow.exceptions import MlflowException

    real, calls = mlflow_tracking.MlflowClient.log_batch, []

    def failing(self, run_id, metrics=(), *args, **kwargs):
        if metrics:
            calls.append(1)
            if len(calls) == 2:  # the store fails as round 2's unit is logged
                raise MlflowException("database is locked")
        return real(self, run_id, metrics, *args, **kwargs)

    monkeypatch.setattr(mlflow_tracking.MlflowClient, "log_batch", failing)
    done = run_study(tiny_config(tracking={"mlflow": store, "experiment": "failing"}), tmp_path / "run")
    monkeypatch.undo()
    assert json.loads((done / "run.json").read_text())["status"] == "finished" and (done / "report.html").is_file()
    log = (done / "run.log").read_text()
    assert (f"WARNING tracking: logging metrics to MLflow failed at {store} (MlflowException: database is locked); "
            f"the run goes on without MLflow; `fedcare export {tmp_path / 'run.partial'} --mlflow {store}`") in log
    assert len(calls) == 2  # tracking stopped for the rest of the run
    run_id = mlflow_run_id(done)
    assert client(store).get_run(run_id).info.status == "RUNNING"
    assert export_run(done, store) == run_id  # the rest goes to the same MLflow run
    assert client(store).get_run(run_id).info.status == "FINISHED"
    assert logged_metrics(store, run_id) == expected_metrics(done)


def test_a_tracking_server_that_is_down_is_a_warning_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    assert MlflowRun.begin(tmp_path, Tracking(mlflow="http://127.0.0.1:9"), "pain") is None
    assert "WARNING tracking: opening the MLflow run failed at http://127.0.0.1:9" in (tmp_path / "run.log").read_text()


def test_export_refuses_a_bad_uri_and_a_folder_that_is_no_run_in_one_line(tracked, tmp_path):
    bad = CliRunner().invoke(app, ["export", str(tracked), "--mlflow", "sqlte:///mlflow.db"])
    assert bad.exit_code == 2 and "--mlflow 'sqlte:///mlflow.db': unknown scheme 'sqlte'" in bad.output
    empty = CliRunner().invoke(app, ["export", str(tmp_path), "--mlflow", "sqlite:///mlflow.db"])
    assert empty.exit_code == 2 and "not a run directory (no metrics.jsonl)" in empty.output
    assert "Traceback" not in bad.output + empty.output and not (tmp_path / "mlflow.db").exists()


def test_without_mlflow_a_tracked_run_stops_before_training_saying_how_to_install_it(tmp_path, monkeypatch):
    without_mlflow(monkeypatch)
    path = tmp_path / "exp.toml"
    path.write_text(to_toml(tiny_config(tracking={"mlflow": f"sqlite:///{tmp_path / 'mlflow.db'}"})))
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "tracking.mlflow: MLflow is not installed; install it with pip install \"fedcare[mlflow]\"" in \
        " ".join(result.output.split())
    assert not (tmp_path / "run").exists() and not (tmp_path / "run.partial").exists()

"""What `[tracking]` (MLflow) and `fedcare status` cost a run, against its training.

    python benchmarks/tracking.py RUN_DIR

RUN_DIR is a finished run (e.g. `fedcare run configs/fedhealth2/demo.toml --set
'methods=["fedavg","fedbn"]'`). Its records are logged again, into a new SQLite store in a
temporary folder, as a live run logs them: the MLflow run opened (params, tags), then one
`log_records` per unit (metrics.jsonl cut into run.json's units_total pieces of equal line
counts), then the files and the end. `fedcare status` is timed on the same directory: a first
reading (all of metrics.jsonl) and the next one after a unit's records more (what `--watch`
reads). Times are this process's CPU seconds (`time.process_time`), which a busy machine
moves less than wall time; the ratios are against the run's own training time per unit
(run.json's training_seconds / units_total, wall time on the machine it ran on).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from fedcare.config import Tracking
from fedcare.studies.status import StatusReader
from fedcare.studies.tracking import MlflowRun


def cpu(action) -> tuple[float, object]:
    t0 = time.process_time()
    result = action()
    return time.process_time() - t0, result


def main(run_dir: Path) -> None:
    info = json.loads((run_dir / "run.json").read_text())
    units, training = info["progress"]["units_total"], info["training_seconds"]
    lines = (run_dir / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "run.partial"
        shutil.copytree(run_dir, copy)
        (copy / "metrics.jsonl").write_bytes(b"")
        info.pop("mlflow", None)
        (copy / "run.json").write_text(json.dumps(info))
        store = f"sqlite:///{Path(tmp) / 'mlflow.db'}"
        import_s, _ = cpu(lambda: __import__("mlflow.tracking"))
        begin_s, run = cpu(lambda: MlflowRun.begin(copy, Tracking(mlflow=store), info["study"]))
        per_unit = []
        for u in range(units):
            piece = lines[u * len(lines) // units: (u + 1) * len(lines) // units]
            with open(copy / "metrics.jsonl", "ab") as f:
                f.write(b"".join(piece))
            seconds, ok = cpu(run.log_records)
            assert ok, "tracking failed"
            per_unit.append(seconds)
        finish_s, _ = cpu(lambda: run.finish("FINISHED"))
        reader = StatusReader(copy)
        first_s, status = cpu(reader.read)
        with open(copy / "metrics.jsonl", "ab") as f:
            f.write(b"".join(lines[: max(len(lines) // units, 1)]))
        next_s, _ = cpu(reader.read)
    unit_s = training / units
    mean = sum(per_unit) / units
    print(f"{run_dir}: {info['study']}, {units} units, {len(lines)} records, training {training:.1f} s "
          f"({unit_s:.3f} s a unit)")
    print(f"MLflow import (once)            {import_s:7.3f} s CPU")
    print(f"open the MLflow run (once)      {begin_s:7.3f} s CPU (a new SQLite store: its tables created)")
    print(f"log one unit's records          {mean:7.4f} s CPU mean, {max(per_unit):.4f} max "
          f"({len(lines) / units:.0f} records): {mean / unit_s:.2%} of a unit's training (wall)")
    print(f"files and end (once)            {finish_s:7.3f} s CPU")
    print(f"all tracking / training (wall)  {(import_s + begin_s + sum(per_unit) + finish_s) / training:.2%}")
    print(f"fedcare status, first reading   {first_s:7.4f} s CPU ({status['records']} records)")
    print(f"fedcare status, next reading    {next_s:7.4f} s CPU (one unit's records more)")


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""What a run directory holds (its file names) and reading it back: run.json, the records
of metrics.jsonl and the lineage. Reports read runs through here; `fedcare.studies.rundir`
writes them (the lineage: `fedcare.runtime.lineage`)."""

from __future__ import annotations

import json
from pathlib import Path

SYNTHETIC_DIR = "synthetic-data"  # where a config's [data.synthetic] is generated inside the run
METRICS_FILE = "metrics.jsonl"  # the records, one JSON object per line
RUN_FILE = "run.json"  # the run's facts
LOG_FILE = "run.log"  # what happened, one line per event
LINEAGE_FILE = "lineage.jsonl"  # one record per aggregation and per saved model, hash-chained
MODELS_DIR = "models"  # the global models a run saved (safetensors), named in the lineage


def read_run_info(run_dir: Path) -> tuple[dict, list[str]]:
    """(run.json as a dict, notes). A missing, unreadable or non-object run.json gives ``{}`` and
    a note saying so; it is never an error."""
    notes: list[str] = []
    run_info: dict = {}
    run_path = Path(run_dir) / RUN_FILE
    if run_path.is_file():
        try:
            loaded = json.loads(run_path.read_text())
            if isinstance(loaded, dict):
                run_info = loaded
            else:
                notes.append(f"{RUN_FILE} is not a JSON object; run facts are missing.")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            notes.append(f"{RUN_FILE} could not be read ({e}); run facts are missing.")
    else:
        notes.append(f"{RUN_FILE} is missing; run facts are unknown.")
    return run_info, notes


def read_run_records(run_dir: Path) -> tuple[list[dict], list[str]]:
    """(the records of metrics.jsonl, notes about reading it); FileNotFoundError when the
    directory holds no metrics.jsonl, ValueError naming the file and line when it is malformed."""
    from fedcare.evaluation.statistics import read_records  # only when a report is made

    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (not a run directory?)")
    return read_records(path)


def read_lineage(run_dir: Path) -> list[dict]:
    """The records of a run's lineage.jsonl as written so far, unchecked ([] when there is
    none); safe while the run appends to it (a line still being written is left out).
    `fedcare lineage RUN_DIR --verify` checks them (`fedcare.runtime.lineage_verify`)."""
    path = Path(run_dir) / LINEAGE_FILE
    try:
        data = path.read_bytes().decode("utf-8", errors="replace")  # a character cut mid-write is in the tail
    except FileNotFoundError:
        return []
    lines = data.split("\n")[:-1]  # the part after the last newline is unfinished
    return [json.loads(line) for line in lines if line]

"""A run directory's lifecycle: work in `<out>.partial`, rename to `<out>` only on success.

An existing run directory is never overwritten; a failed run leaves nothing behind (unless
asked to keep the partial directory for debugging)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

import torch

from fedcare import __version__

SYNTHETIC_DIR = "synthetic-data"  # where a config's [data.synthetic] is generated inside the run
METRICS_FILE = "metrics.jsonl"  # the records, one JSON object per line
RUN_FILE = "run.json"  # the run's facts

# progress(task description, units done, units total)
Progress = Callable[[str, int, int], None]


class RunDirectoryExists(FileExistsError):
    pass


@contextmanager
def partial_run_directory(out: Path, keep_partial: bool = False) -> Iterator[Path]:
    out = Path(out)
    if out.exists():
        raise RunDirectoryExists(f"{out}: run directory already exists; choose another --out or remove it")
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    try:
        yield partial
        partial.rename(out)
    except BaseException:
        if not keep_partial:
            shutil.rmtree(partial, ignore_errors=True)
        raise


@contextmanager
def records_writer(path: Path) -> Iterator[Callable[[dict], None]]:
    """Append one JSON object per line, flushed as it goes (metrics.jsonl)."""
    handle: IO[str] = path.open("a")

    def write(record: dict) -> None:
        handle.write(json.dumps(record, allow_nan=True) + "\n")
        handle.flush()

    try:
        yield write
    finally:
        handle.close()


def start_run(run_dir: Path, config, config_toml: str) -> str:
    """What every study does first: its thread count, the resolved config on disk; returns the start time."""
    if config.runtime.threads:
        torch.set_num_threads(config.runtime.threads)
    (run_dir / "config.toml").write_text(config_toml)
    return now()


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_run_info(run_dir: Path, out: Path, **facts) -> None:
    """run.json: what the report shows about the run."""
    info = {"run_dir": Path(out).name, "fedcare_version": __version__, "finished": now(), **facts}
    (run_dir / RUN_FILE).write_text(json.dumps(info, indent=2))


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
    from fedcare.evaluation.statistics import read_records

    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (not a run directory?)")
    return read_records(path)

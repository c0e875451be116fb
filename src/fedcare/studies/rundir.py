"""A run directory's lifecycle: work in `<out>.partial`, rename it to `<out>` only on success.

- **Exclusive.** The partial directory is created atomically with a lock file inside it
  (`.lock`, `fcntl.flock`, held while the run lives and released by the kernel when the
  process ends, however it ends). A second run into the same directory is refused with the
  first run's process id, host and start time; a default name that is taken gets a suffix.
- **Nothing finished is lost.** The records (metrics.jsonl) are flushed as they are written
  and synced at every finished unit; a failure or an interruption keeps the partial directory
  when it holds finished work, and `fedcare resume` continues it (`fedcare.studies.checkpoint`).
  A partial directory is never deleted because a new run wants its name.
- **run.json** is written when the run starts (with whether the data are synthetic), updated
  as units finish, and completed at the end; `run.log` has a line per event.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import socket
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import torch

from fedcare import __version__
from fedcare.errors import InputError, UserError
from fedcare.files import AppendedFile, atomic_write_text
from fedcare.progress import Report
from fedcare.runfiles import (  # noqa: F401 (the file names and readers, imported from here by the studies)
    LOG_FILE,
    METRICS_FILE,
    RUN_FILE,
    SYNTHETIC_DIR,
    read_run_info,
    read_run_records,
)
from fedcare.threads import auto_threads

LOCK_FILE = ".lock"  # held by the process running in a partial directory
RESUME_STATE_FILE = "checkpoint.pt"  # what `fedcare resume` continues from (fedcare.studies.checkpoint)
PARTIAL = ".partial"

# progress(description, done, total, task=None): `fedcare.progress.Report`
Progress = Report


class RunDirectoryExists(UserError, FileExistsError):
    """The run directory (or its partial directory) is taken; the message says by what."""


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def partial_of(out: Path) -> Path:
    out = Path(out)
    return out if out.name.endswith(PARTIAL) else out.with_name(out.name + PARTIAL)


def final_of(partial: Path) -> Path:
    partial = Path(partial)
    return partial.with_name(partial.name[: -len(PARTIAL)]) if partial.name.endswith(PARTIAL) else partial


class RunDirectory:
    """`<out>.partial`, held by this process until `finish` renames it to `<out>`."""

    def __init__(self, out: Path, lock: IO[str]):
        self.out = final_of(out)
        self.partial = partial_of(out)
        self._lock = lock

    # -- taking a directory ------------------------------------------------------------
    @classmethod
    def create(cls, out: Path, *, unique: bool = False) -> "RunDirectory":
        """A new partial directory for `out`. `unique` (a default name): if `out` is taken,
        try `out-2`, `out-3`, ...; otherwise a taken `out` is an error naming what holds it."""
        out = Path(out)
        for n in range(1, 1000):
            candidate = out if n == 1 else out.with_name(f"{out.name}-{n}")
            try:
                return cls._create(candidate)
            except RunDirectoryExists:
                if not unique:
                    raise
        raise RunDirectoryExists(f"{out}: 999 run directories of this name exist; choose another --out")

    @classmethod
    def _create(cls, out: Path) -> "RunDirectory":
        partial = partial_of(out)
        if out.exists():
            raise RunDirectoryExists(f"{out}: run directory already exists; choose another --out or remove it")
        if partial.exists():
            raise RunDirectoryExists(describe_partial(partial))
        # build it beside, locked, then rename into place: no one ever sees it unlocked
        try:
            partial.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{partial.name}.", dir=partial.parent))
        except OSError as e:
            raise OSError(e.errno, f"cannot create the run directory here ({e.strerror})", str(out)) from None
        try:
            os.chmod(staging, 0o777 & ~_umask())
            lock = _take_lock(staging)
            try:
                os.rename(staging, partial)
            except OSError:
                lock.close()
                raise RunDirectoryExists(describe_partial(partial)) from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return cls(out, lock)

    @classmethod
    def reopen(cls, partial: Path) -> "RunDirectory":
        """An interrupted run's partial directory, to resume; refused while a process holds it."""
        partial = partial_of(partial)
        if not partial.is_dir():
            done = final_of(partial)
            if done.is_dir():
                raise RunDirectoryExists(f"{done}: this run finished; there is nothing to resume")
            raise FileNotFoundError(f"{partial}: no such run directory to resume")
        mark_if_crashed(partial)  # what the dead process could not write: the log keeps it
        try:
            lock = _take_lock(partial)
        except BlockingIOError:
            raise RunDirectoryExists(describe_partial(partial)) from None
        if final_of(partial).exists():
            lock.close()
            raise RunDirectoryExists(f"{final_of(partial)}: exists already; move it away to resume {partial}")
        return cls(final_of(partial), lock)

    # -- leaving it --------------------------------------------------------------------
    def finish(self) -> Path:
        """The finished run under its own name, without what only continuing needed: the
        checkpoint (every client's private layers) and the lock file."""
        (self.partial / RESUME_STATE_FILE).unlink(missing_ok=True)
        os.rename(self.partial, self.out)
        (self.out / LOCK_FILE).unlink(missing_ok=True)
        self._lock.close()
        return self.out

    def remove(self) -> None:
        shutil.rmtree(self.partial, ignore_errors=True)
        self._lock.close()

    def release(self) -> None:
        """Keep the partial directory (finished work in it), free for `fedcare resume`."""
        self._lock.close()


def _umask() -> int:
    from fedcare.files import umask

    return umask()


def _take_lock(folder: Path) -> IO[str]:
    """Hold `folder/.lock` (BlockingIOError if another process holds it) and write who we are."""
    handle = open(folder / LOCK_FILE, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": now()}))
    handle.flush()
    return handle


def _lock_held(partial: Path) -> bool:
    """Whether a live process holds the partial directory's lock (the kernel frees it however a process ends)."""
    try:
        with open(partial / LOCK_FILE, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when closed
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False


CRASHED = ("the process ended without recording why (killed with SIGKILL, out of memory, or a crash in native "
           "code: see the end of run.log and the terminal's output)")


def mark_if_crashed(partial: Path) -> bool:
    """A run.json still saying "running" with no process holding the lock is a run that died
    without a word (a crash can write nothing itself): record it as "crashed". True if it was."""
    if not partial.is_dir() or read_run_info(partial)[0].get("status") != "running" or _lock_held(partial):
        return False
    update_run_info(partial, status="crashed", error=CRASHED)
    log(partial, f"crashed: {CRASHED}")
    return True


def describe_partial(partial: Path) -> str:
    """Why a partial directory cannot be taken: a live run holds it, or an interrupted one left it."""
    holder = {}
    try:
        holder = json.loads((partial / LOCK_FILE).read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        pass
    if _lock_held(partial):
        who = f"process {holder.get('pid', '?')} on {holder.get('host', '?')} since {holder.get('since', '?')}"
        return f"{partial}: another run is writing here ({who}); choose another --out"
    how = "a crashed run" if mark_if_crashed(partial) or read_run_info(partial)[0].get("status") == "crashed" \
        else "an interrupted run"
    progress = read_run_info(partial)[0].get("progress") or {}
    done = f" ({progress.get('units_done', 0)} of {progress.get('units_total', '?')} units finished)" if progress else ""
    return (f"{partial}: {how} is kept here{done}; continue it with `fedcare resume {partial}` "
            f"or remove the directory")


# -- records -----------------------------------------------------------------------------
def _json_safe(value: Any) -> Any:
    """NaN and infinities as null: metrics.jsonl is strict JSON for every other tool."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


class RecordsWriter(AppendedFile):
    """metrics.jsonl: one JSON object per line, flushed as written; `sync` makes everything
    written so far durable and returns the file's size (a checkpoint's offset)."""

    def __init__(self, path: Path, truncate_to: int | None = None):
        super().__init__(path, truncate_to)
        self.written = 0

    def write(self, record: dict) -> None:
        self._handle.write(json.dumps(_json_safe(record), allow_nan=False) + "\n")
        self._handle.flush()
        self.written += 1


# -- run.json and run.log --------------------------------------------------------------------
def set_threads(config) -> None:
    """torch's CPU threads as the experiment says (float sums depend on the thread count):
    a number, "auto" (the cores left free now: `fedcare.threads.auto_threads`), or torch's
    choice when not given."""
    threads = config.runtime.threads
    if threads == "auto":
        threads = auto_threads()
    if threads:
        torch.set_num_threads(threads)


def update_run_info(folder: Path, **facts: Any) -> dict:
    """Merge `facts` into the run.json of `folder` (written atomically); returns the new content."""
    info, _ = read_run_info(folder)
    info.setdefault("fedcare_version", __version__)  # the version the run began with (a resume notes its own)
    info.update(facts)
    atomic_write_text(Path(folder) / RUN_FILE, json.dumps(_json_safe(info), indent=2))
    return info


def log(run_dir: Path, message: str) -> None:
    """One timestamped line in run.log (appended and flushed: a crash keeps every line)."""
    with open(Path(run_dir) / LOG_FILE, "a") as handle:
        handle.write(f"{now()} {message}\n")

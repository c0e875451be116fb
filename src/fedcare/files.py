"""Writing files so that readers never see half a file, with the permissions a user expects.

Run outputs (reports, tables, plots, records) follow the umask, like any file a program
writes (`tempfile.mkstemp` alone would leave them 0600). Private files (a site's state with
its private layers, authentication keys) are 0600 from the moment they exist: no window in
which another user could read them.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO

from fedcare.errors import InputError

_UMASK: int | None = None


def umask() -> int:
    """The process's umask (read once: changing it needs a set-and-restore, which threads could observe)."""
    global _UMASK
    if _UMASK is None:
        _UMASK = os.umask(0o022)
        os.umask(_UMASK)
    return _UMASK


def atomic_write_bytes(path: Path, data: bytes, *, private: bool = False) -> Path:
    """Write `data` to `path` via a temp file in the same directory and `os.replace`, so readers
    see either the old file or the complete new one. Mode: 0600 if `private`, else 0666 minus
    the umask."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # 0600 from creation
    try:
        if not private:
            os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def atomic_write_text(path: Path, text: str, *, private: bool = False) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), private=private)


class AppendedFile:
    """A file written only by appending lines (a run's records, its lineage): `truncate_to`
    (bytes) first drops what follows (what an unfinished unit wrote, before a resume); `sync`
    makes everything written durable and returns the file's size (a checkpoint's offset)."""

    def __init__(self, path: Path, truncate_to: int | None = None, *, private: bool = False):
        self.path = Path(path)
        if truncate_to is not None and self.path.exists():
            size = self.path.stat().st_size
            if size < truncate_to:
                raise InputError(f"{self.path}: {size} bytes, but its checkpoint needs {truncate_to}: the file was "
                                 "cut short; this run cannot be resumed")
            os.truncate(self.path, truncate_to)  # drop what an unfinished unit wrote
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        self._handle: IO[str] = os.fdopen(os.open(self.path, flags, 0o600 if private else 0o666), "a",
                                          encoding="utf-8")

    def sync(self) -> int:
        self._handle.flush()
        os.fsync(self._handle.fileno())
        return self.path.stat().st_size

    def close(self) -> None:
        self._handle.close()


def process_alive(pid: int) -> bool:
    """Whether a process with this id exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True

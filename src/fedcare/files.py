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

_UMASK: int | None = None


def umask() -> int:
    """The process's umask (read once: changing it needs a set-and-restore, which threads could observe)."""
    global _UMASK
    if _UMASK is None:
        _UMASK = os.umask(0o022)
        os.umask(_UMASK)
    return _UMASK


def atomic_write_bytes(path: Path, data: bytes, *, private: bool = False, exclusive: bool = False) -> Path:
    """Write `data` to `path` via a temp file in the same directory and `os.replace`, so readers
    see either the old file or the complete new one. Mode: 0600 if `private`, else 0666 minus
    the umask. `exclusive`: never replace a file (a key): FileExistsError if `path` exists, also
    when it appears meanwhile (the complete file is hard-linked into place, which never replaces)."""
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
        if exclusive:
            os.link(tmp, path)
            os.unlink(tmp)
        else:
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


def process_alive(pid: int) -> bool:
    """Whether a process with this id exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True

"""Writing a generated dataset so that a failure leaves nothing half-written.

A generator writes into a hidden sibling (`.<name>.XXXX.tmp`) and renames it into place. A
process killed mid-way (SIGKILL, power loss) cannot remove its sibling: the next generator
writing next to it removes siblings whose process is gone: only folders with fedcare's own
`.owner` file (saying which process made it), never a user's folder that merely has a
similar name."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedcare.files import process_alive, umask

OWNER = ".owner"
MARKER = "fedcare synthetic output"  # in every owner file: what tells our siblings from a user's folders


def _write_owner(folder: Path) -> None:
    (folder / OWNER).write_text(json.dumps({"made_by": MARKER, "pid": os.getpid(), "host": socket.gethostname()}))


def check_output_dir(out: Path, overwrite: bool) -> None:
    """Refuse a non-empty `out` unless `overwrite`; never replace a file with a folder."""
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out}: exists and is not a directory; not replacing it")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out}: exists and is not empty (pass overwrite=True / --overwrite to replace it)")


@contextmanager
def atomic_directory(out: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of `out` to write into; on success it replaces `out`, on any
    failure it is removed and `out` is left as it was."""
    out = Path(out)
    check_output_dir(out, overwrite)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_siblings(out)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    except OSError as e:
        raise OSError(e.errno, f"cannot write a dataset here ({e.strerror})", str(out)) from None
    try:
        _write_owner(tmp)
        yield tmp
        (tmp / OWNER).unlink()
        os.chmod(tmp, 0o777 & ~umask())  # mkdtemp made it 0700: the dataset follows the umask
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            _write_owner(old)
            os.replace(out, old / "old")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_stale_siblings(out: Path) -> list[Path]:
    """Remove the temporary siblings of `out` left by generators that died on this host;
    returns what was removed."""
    removed = []
    host = socket.gethostname()
    for sibling in Path(out).parent.glob(f".{Path(out).name}.*"):
        if not sibling.is_dir() or sibling.suffix not in (".tmp", ".old"):
            continue
        try:
            owner = json.loads((sibling / OWNER).read_text())
        except (OSError, json.JSONDecodeError):
            continue  # no owner file of ours (a user's folder, or one being created this instant)
        if not isinstance(owner, dict) or owner.get("made_by") != MARKER:
            continue
        if owner.get("host") != host:
            continue  # made on another machine sharing this disk: not ours to judge
        if not isinstance(owner.get("pid"), int) or process_alive(owner["pid"]):
            continue
        shutil.rmtree(sibling, ignore_errors=True)
        removed.append(sibling)
    return removed

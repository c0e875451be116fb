"""Writing a generated dataset so that a failure leaves nothing half-written.

A generator writes into a hidden sibling (`.<name>.XXXX.tmp`) and renames it into place. A
process killed mid-way (SIGKILL, power loss) cannot remove its sibling: the next generator
writing next to it removes siblings whose process is gone: only folders with fedcare's own
`.owner` file (saying which process made it), never a user's folder that merely has a
similar name. A replaced copy waits in such a sibling (`.<name>.XXXX.old`) until the new one
is in place; killed in between, the next generator puts the old copy back before anything else.

`overwrite` replaces only a synthetic copy: a folder whose root holds the marker
(`fedcare.data.common.SYNTHETIC_MARKER`) written by the same generator. Any other non-empty
folder is refused (`--overwrite` on a home folder deleted it)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedcare.data.common import SYNTHETIC_MARKER
from fedcare.files import process_alive, umask

OWNER = ".owner"
MARKER = "fedcare synthetic output"  # in every owner file: what tells our siblings from a user's folders


def _write_owner(folder: Path) -> None:
    (folder / OWNER).write_text(json.dumps({"made_by": MARKER, "pid": os.getpid(), "host": socket.gethostname()}))


def check_output_dir(out: Path, overwrite: bool, generator: str | None = None) -> None:
    """Refuse a non-empty `out` unless `overwrite` and it is a synthetic copy that `generator`
    wrote (any generator's when None: its marker says which); never replace a file with a folder."""
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out}: exists and is not a directory; not replacing it")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out}: exists and is not empty (pass overwrite=True / --overwrite to replace it)")
        problem = _not_a_copy(out, generator)
        if problem:
            raise FileExistsError(f"{out}: {problem}; --overwrite replaces only a synthetic copy this generator wrote, "
                                  "never another folder")


def _not_a_copy(out: Path, generator: str | None) -> str | None:
    """Why `out` is not a synthetic copy of `generator`'s (None: it is)."""
    try:
        marker = json.loads((out / SYNTHETIC_MARKER).read_text())
    except FileNotFoundError:
        return f"not a synthetic copy (no {SYNTHETIC_MARKER} in it)"
    except (OSError, ValueError):
        return f"its {SYNTHETIC_MARKER} cannot be read"
    made_by = marker.get("generator") if isinstance(marker, dict) else None
    if not isinstance(made_by, str):
        return f"its {SYNTHETIC_MARKER} names no generator"
    if generator is not None and made_by != generator:
        return f"a synthetic copy of another generator ({made_by})"
    return None


@contextmanager
def atomic_directory(out: Path, overwrite: bool = False, generator: str | None = None) -> Iterator[Path]:
    """Yield a temporary sibling of `out` to write into; on success it replaces `out` (with
    `overwrite`, a synthetic copy `generator` wrote: `check_output_dir`), on any failure it is
    removed and `out` is left as it was."""
    out = Path(out)
    try:
        if out.parent.is_dir():
            remove_stale_siblings(out)  # first: a copy a killed generator was replacing is put back
    except OSError as e:
        raise OSError(e.errno, f"cannot write a dataset here ({e.strerror})", str(out)) from None
    check_output_dir(out, overwrite, generator)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
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
    """Remove the temporary siblings of `out` left by generators that died on this host, first
    putting back a copy one was replacing when it died (`out` missing, the old copy in a
    `.old` sibling); returns what was removed."""
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
        if sibling.suffix == ".old" and (sibling / "old").is_dir() and not out.exists():
            os.replace(sibling / "old", out)  # killed between its two renames: the old copy stays
        shutil.rmtree(sibling, ignore_errors=True)
        removed.append(sibling)
    return removed

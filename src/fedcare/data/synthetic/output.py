"""Writing a generated dataset so that a failure leaves nothing half-written."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


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
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            os.replace(out, old / "old")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

"""A fingerprint of a run's data, recorded in run.json (`data_fingerprint`) when the run starts,
so that `fedcare resume` on other data is refused instead of mixing two datasets in one run's
records (a copy replaced at the same `data.root` between the interruption and the resume).

Two parts, both cheap: no data file is read.

- `clients`: per client, a SHA-256 of the summary its site gives the protocol (`Site.summary`:
  its sessions, frames or examples per split and seed). Every runtime has it, a run across
  sites too, where the coordinator sees nothing else of a site's data.
- `files`: when this process reads the data from `data.root`, a SHA-256 of every file's path
  under it and its size, with their count. Modification times are left out: copying a dataset
  (cp, rsync without -t) changes them, not the data. So are hidden files and folders (`.*`):
  what a file manager leaves (.DS_Store) is not data.

A resume compares what it can: the clients present both times (a site that has not joined yet
is not a change), and the files when both runs read them here. A run.json from before the
fingerprint was recorded resumes unchecked, and its run.log says so.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from fedcare.config import Experiment
from fedcare.studies.base import StudyRuntime


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def data_fingerprint(config: Experiment, runtime: StudyRuntime) -> dict:
    """The fingerprint of the data `runtime` holds for `config`'s run."""
    clients = {str(c): _digest(json.dumps(s, sort_keys=True, default=str)) for c, s in runtime.summaries().items()}
    fingerprint: dict[str, Any] = {"clients": clients}
    root = getattr(getattr(config, "data", None), "root", None)
    if runtime.sites is not None and root is not None and Path(root).exists():
        fingerprint["files"] = files_digest(Path(root))
    return fingerprint


def files_digest(root: Path) -> dict:
    """{"root", "count", "sha256"} of the names and sizes of every file under `root` (or of
    `root` itself, a file) but hidden ones, in a fixed order."""
    h, count = hashlib.sha256(), 0
    if root.is_file():
        entries = [(root, root.name)]
    else:
        entries = []
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # os.walk visits these, in this order
            entries += [(Path(folder, name), str(Path(folder, name).relative_to(root)))
                        for name in sorted(files) if not name.startswith(".")]
    for path, name in entries:
        try:
            size = path.stat().st_size
        except OSError:  # a dangling link: its name still counts
            size = -1
        h.update(f"{name}\0{size}\n".encode())
        count += 1
    return {"root": str(root), "count": count, "sha256": h.hexdigest()}


def fingerprint_problem(began: dict, now: dict) -> str | None:
    """Why the data `now` are not those the run `began` with (None: they are, as far as both
    fingerprints tell)."""
    changed = sorted(c for c, digest in now.get("clients", {}).items()
                     if c in began.get("clients", {}) and began["clients"][c] != digest)
    if changed:
        return (f"client{'s' if len(changed) > 1 else ''} {', '.join(changed)} now hold{'' if len(changed) > 1 else 's'} "
                "other data than when the run began (their sites' summaries differ)")
    then, files = began.get("files"), now.get("files")
    if then and files and then.get("sha256") != files.get("sha256"):
        return (f"{files['root']}: other files than when the run began ({then.get('count')} files then, "
                f"{files['count']} now, or other names or sizes)")
    return None

"""A JSON-lines file whose records are chained by SHA-256: a run's lineage and a site's own
record (`fedcare.runtime.lineage`, `fedcare.runtime.flower.site_record`).

Each line is one record written canonically (keys sorted, no spaces, strict JSON) with three
fields of the chain: `seq` (0, 1, ...), `prev` (the previous record's `hash`; "" for the first)
and `hash` (SHA-256 of the record's canonical line without `hash`). `check_chain` reads the
file back and names the first line that is not what the writer wrote: a changed byte
anywhere changes the line (it is no longer canonical or its hash no longer matches), a removed
or reordered line breaks `seq` and `prev`. What a hash chain cannot show is a file cut after a
record or rewritten whole with new hashes: a run seals its head (`head`) in run.json when it
finishes, and a site's own record is a second, independent copy of what concerned the site.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedcare.errors import InputError
from fedcare.files import AppendedFile

CHAIN_FIELDS = ("seq", "prev", "hash")


class ChainError(InputError):
    """A chained file is not what its writer wrote; the message names the file, line and problem."""


def strict(value: Any) -> Any:
    """Non-finite floats (an unbounded epsilon) as null: the lines are strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def canonical(record: dict) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def record_hash(record: dict) -> str:
    """SHA-256 of the record's canonical line without its own `hash`."""
    return hashlib.sha256(canonical({k: v for k, v in record.items() if k != "hash"}).encode()).hexdigest()


class ChainWriter(AppendedFile):
    """Appends chained records to `path`, each batch flushed and synced to disk. `truncate_to`
    (bytes) first drops what follows (what an unfinished unit wrote before a resume);
    `drop_cut_line` drops a last line a crash cut short (it has no newline yet)."""

    def __init__(self, path: Path, truncate_to: int | None = None, *, private: bool = False,
                 drop_cut_line: bool = False):
        super().__init__(path, truncate_to, private=private)
        data = self.path.read_bytes()
        if drop_cut_line and data and not data.endswith(b"\n"):
            os.truncate(self.path, data.rfind(b"\n") + 1)
        records = check_chain(self.path)
        self.count = len(records)
        self.head = records[-1]["hash"] if records else ""

    def append(self, records: Iterable[dict]) -> int:
        """Write `records` (each without the chain's fields) at the end; durable when it returns.
        Returns the file's size (a checkpoint's offset)."""
        for record in records:
            if any(k in record for k in CHAIN_FIELDS):
                raise ValueError(f"a chained record sets its own {CHAIN_FIELDS}")
            chained = {**strict(record), "seq": self.count, "prev": self.head}
            chained["hash"] = record_hash(chained)
            self._handle.write(canonical(chained) + "\n")
            self.count += 1
            self.head = chained["hash"]
        return self.sync()



def check_chain(path: Path) -> list[dict]:
    """The records of a chained file, checked; `ChainError` naming the first line that is not
    what the writer wrote (not JSON, not canonical, a wrong hash, `seq` or `prev`)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ChainError(f"{path}: cannot be read ({e.strerror or e})") from None
    if data and not data.endswith(b"\n"):
        raise ChainError(f"{path}: the last line is cut short (no newline after it)")
    records: list[dict] = []
    for number, line in enumerate(data.split(b"\n")[:-1] if data else [], start=1):
        where = f"{path} line {number}"
        try:
            text = line.decode("utf-8")
            record = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ChainError(f"{where}: not a JSON record (a changed byte?)") from None
        if not isinstance(record, dict) or any(k not in record for k in CHAIN_FIELDS):
            raise ChainError(f"{where}: not a chained record (no {', '.join(CHAIN_FIELDS)})")
        if canonical(record) != text:
            raise ChainError(f"{where}: not as written (its bytes are not the record's canonical form)")
        if record["hash"] != record_hash(record):
            raise ChainError(f"{where} (record {record.get('seq')}): changed since it was written (its hash does "
                             "not match its content)")
        if record["seq"] != len(records) or record["prev"] != (records[-1]["hash"] if records else ""):
            raise ChainError(f"{where} (record {record['seq']}): out of its chain (a record before it was removed, "
                             "added or moved)")
        records.append(record)
    return records

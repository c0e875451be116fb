"""Checking a run's lineage (`fedcare lineage RUN_DIR --verify`): the records are as written,
each aggregate descends from its federation's models, and every saved model is the one its
record names.

`verify_lineage(run_dir)` checks, and names the first problem (a `LineageError`, one line):

1. lineage.jsonl's hash chain (`fedcare.runtime.hashchain.check_chain`): a changed byte, a
   removed, added or moved record;
2. its end against run.json's seal (`lineage`: records and head), written when the run
   finished: records cut from or added to the end;
3. each aggregate's parent is its federation's initial model or one of its earlier aggregates
   (early stopping goes back to its best round), and its `config_sha256` is config.toml's;
4. each model file: the last "model" record naming it gives its SHA-256 (the file's bytes) and
   its digest (the message read back, recomputed), which must be one of its federation's
   models; no file in models/ that no record names.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import safe_open

from fedcare.algorithms.messages import Message
from fedcare.runfiles import LINEAGE_FILE, MODELS_DIR, read_run_info
from fedcare.runtime.digest import message_digest
from fedcare.runtime.hashchain import ChainError, check_chain
from fedcare.runtime.lineage import METADATA_KEY

MODEL_FILE = re.compile(rf"{MODELS_DIR}/[A-Za-z0-9][A-Za-z0-9._+-]*\.safetensors")


class LineageError(ChainError):
    """The lineage does not hold: the message names the record or file and what is wrong."""


@dataclass
class Verified:
    records: list[dict]
    models: dict[str, dict] = field(default_factory=dict)  # file -> the last "model" record naming it
    sealed: bool = False  # run.json holds the finished run's seal, and the file ends there


def describe(record: dict) -> str:
    """A record as a message names it: its number, unit, method, phase and round."""
    label = record.get("label") or {}
    what = [str(x) for x in (label.get("method") or record.get("algorithm"), record.get("phase")) if x]
    if record.get("round") is not None:
        what.append(f"round {record['round']}")
    unit = [f"unit {'/'.join(map(str, record['unit']))}"] if record.get("unit") else []
    inside = ": ".join(x for x in (" ".join(unit), " ".join(what)) if x)
    return f"record {record.get('seq')}" + (f" ({inside})" if inside else "")


def load_model(path: Path) -> Message:
    """A saved model file back as the message it was made from (tensors, scalars from its
    metadata); `LineageError` naming the file when it cannot be read."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        scalars = json.loads(meta.get(METADATA_KEY, "{}")).get("scalars", {})
    except Exception as e:  # safetensors' own error type for a damaged header or body
        raise LineageError(f"{path}: not a readable model file ({str(e).strip().splitlines()[0][:200]})") from None
    return Message(tensors, {str(k): float(v) for k, v in scalars.items()})


def verify_lineage(run_dir: Path, *, models: bool = True) -> Verified:
    """Check the lineage of `run_dir` (see the module docstring); `models=False` leaves out
    the model files (a site that holds only the coordinator's lineage.jsonl)."""
    run_dir = Path(run_dir)
    path = run_dir / LINEAGE_FILE
    if not path.is_file():
        raise LineageError(f"{run_dir}: no {LINEAGE_FILE} (runs made before fedcare kept a lineage have none)")
    records = check_chain(path)
    result = Verified(records)
    _check_seal(run_dir, result)
    config = run_dir / "config.toml"
    config_sha256 = hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else None
    known: dict[str, set[str]] = {}  # federation -> the digests of its models so far (its initial one first)
    for record in records:
        kind, chain = record.get("type"), record.get("chain")
        if kind == "aggregate":
            seen = known.setdefault(chain, {record["parent"]})  # its first aggregate starts from its initial model
            if record["parent"] not in seen:
                raise LineageError(f"{path} {describe(record)}: its parent {record['parent'][:12]} is none of its "
                                   "federation's earlier models")
            if config_sha256 is not None and record.get("config_sha256") != config_sha256:
                raise LineageError(f"{path} {describe(record)}: config_sha256 is not config.toml's (config.toml "
                                   "changed since the run)")
            seen.add(record["digest"])
        elif kind == "model":
            if record.get("digest") not in known.get(chain, ()):
                raise LineageError(f"{path} {describe(record)}: model {record.get('file')} is none of its "
                                   "federation's models")
            if not isinstance(record.get("file"), str) or not MODEL_FILE.fullmatch(record["file"]):
                raise LineageError(f"{path} {describe(record)}: {record.get('file')!r} is not a model file name")
            result.models[record["file"]] = record
        else:
            raise LineageError(f"{path} {describe(record)}: unknown record type {kind!r}")
    if models:
        _check_models(run_dir, result.models)
    return result


def _check_seal(run_dir: Path, result: Verified) -> None:
    """The file's end against the seal run.json took when the run finished."""
    info = read_run_info(run_dir)[0]
    seal = info.get("lineage")
    if seal is None:
        if info.get("status") == "finished":
            raise LineageError(f"{run_dir / 'run.json'}: a finished run without its lineage seal (`lineage`)")
        return  # an unfinished run: its lineage is not sealed yet
    records = result.records
    head = records[-1]["hash"] if records else ""
    if seal.get("records") != len(records) or seal.get("head") != head:
        raise LineageError(f"{run_dir / LINEAGE_FILE}: {len(records)} records, but run.json sealed "
                           f"{seal.get('records')} ending in {str(seal.get('head'))[:12]}: records were removed from "
                           "its end or added")
    result.sealed = True


def _check_models(run_dir: Path, named: dict[str, dict]) -> None:
    for file, record in named.items():
        path = run_dir / file
        if not path.is_file():
            raise LineageError(f"{path}: missing ({describe(record)} names it)")
        if hashlib.sha256(path.read_bytes()).hexdigest() != record["sha256"]:
            raise LineageError(f"{path}: changed since it was saved (its SHA-256 is not {describe(record)}'s)")
        message = load_model(path)
        if message_digest(message) != record["digest"]:
            raise LineageError(f"{path}: its model is not the one {describe(record)} names (its digest differs)")
    folder = run_dir / MODELS_DIR
    extra = sorted(p.name for p in folder.glob("*.safetensors")) if folder.is_dir() else []
    for name in extra:
        if f"{MODELS_DIR}/{name}" not in named:
            raise LineageError(f"{folder / name}: a file no lineage record names")

"""Experiment files as text: reading, `--set` overrides, renamed keys, validation errors a user
reads, and the resolved config written back as TOML."""

from __future__ import annotations

import difflib
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from fedcare.config.base import ConfigError

if TYPE_CHECKING:
    from fedcare.config.experiment import Experiment

def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Apply `a.b.c=value` to the raw TOML dict; the value is read as TOML, else as a string."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected key=value, e.g. train.rounds=3")
    key, text = assignment.split("=", 1)
    if not all(part.strip() for part in key.split(".")):  # `--set =5` was blamed on the experiment file
        raise ConfigError(f"--set {assignment!r}: expected a dotted key before '=', e.g. train.rounds=3")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    except RecursionError:
        raise ConfigError(f"--set {key.strip()}=...: the value is nested too deeply") from None
    node = raw
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {assignment!r}: {part!r} is not a table")
    node[parts[-1]] = value


MAX_CONFIG_BYTES = 1 << 20  # an experiment file is a page of TOML; /dev/zero was read until memory ran out


def read_config(path: Path | str) -> str:
    """An experiment file's text (a UTF-8 byte-order mark, as some editors write, is dropped);
    ConfigError naming the file when it cannot be read, is not a regular file (a FIFO blocked
    the read for ever) or is larger than an experiment file can be."""
    path = Path(path)
    try:
        if path.exists() and not path.is_dir() and not path.is_file():
            raise ConfigError(f"{path}: not a regular file (a device, a FIFO or a socket); give an experiment TOML "
                              "file")
        with path.open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MiB, not an experiment file")
        return data.decode("utf-8-sig")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file (an experiment TOML file, e.g. "
                          f"configs/pain/demo.toml)") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (an experiment file is TOML text)") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror or e})") from None


def parse_toml(text: str, path: Path | str, overrides: list[str] | None = None) -> dict[str, Any]:
    """An experiment given as TOML text, with the `--set` overrides applied, as a dict
    (`path` names it in errors)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except RecursionError:  # tomllib recurses per nesting level
        raise ConfigError(f"{path}: nested too deeply to be an experiment file") from None
    for assignment in overrides or []:
        apply_override(raw, assignment)
    return raw


def validate(model: type[Experiment], raw: dict[str, Any], path: Path | str,
             overrides: list[str] | None = None) -> Experiment:
    """`raw` validated by a study's config model, relative data paths resolved against `path`'s
    folder; ConfigError naming the file (or the `--set` of `overrides` that gave the value) and
    every key in error."""
    path = Path(path)
    try:
        config = model.model_validate(raw, context={"source": str(path)})
    except ValidationError as e:
        raise ConfigError(validation_message(e, model, path, overrides or [])) from None
    return config.relative_to(path.parent.resolve())  # absolute: a resume reads config.toml elsewhere


def validation_message(error: ValidationError, model: type[BaseModel], path: Path, overrides: list[str]) -> str:
    """pydantic's errors as a user reads them: each names where the value came from (the file, or
    the `--set` that gave it), the dotted key, and the problem in plain words; an unknown key
    comes with the nearest known one."""
    set_keys = {a.split("=", 1)[0].strip(): a for a in overrides if "=" in a}
    problems = []
    for err in error.errors():
        loc = [str(p) for p in err["loc"]]
        key = ".".join(loc) or "(top level)"
        given = next((a for k, a in set_keys.items() if _nested(key, k) or _nested(k, key)), None)
        where = f"--set {given}" if given else str(path)
        problems.append(f"{where}: {key}: {_plain(err, loc, model)}")
    return "; ".join(problems)  # one line: a log or a terminal shows every problem at once


def _nested(key: str, table: str) -> bool:
    """`key` is `table` or lies inside it (`train.lr` in `train`)."""
    return f"{key}.".startswith(f"{table}.")


def _plain(err: Any, loc: list[str], model: type[BaseModel]) -> str:
    if err["type"] == "extra_forbidden":
        known = _keys_at(model, loc[:-1])
        near = difflib.get_close_matches(loc[-1], known, n=1)
        hint = f"; did you mean {'.'.join([*loc[:-1], near[0]])}?" if near else (
            f"; known keys here: {', '.join(sorted(known))}" if known else "")
        return f"unknown key{hint}"
    if err["type"] == "missing":
        return "missing (this key is required)"
    if err["type"] == "list_type" and not isinstance(err.get("input"), (list, dict)):
        return f"expected a list, e.g. {loc[-1]} = [{_toml_value(err['input'])}]"
    return err["msg"]


def _keys_at(model: type[BaseModel], loc: list[str]) -> list[str]:
    """The keys a table at `loc` of `model` accepts (empty when it is not a model's table)."""
    for part in loc:
        field = model.model_fields.get(part)
        inner = _model_in(field.annotation) if field is not None else None
        if inner is None:
            return []
        model = inner
    return list(model.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (`X`, `X | None`, `Optional[X]`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return next((m for m in map(_model_in, typing.get_args(annotation)) if m is not None), None)
    return None


LAST_TABLES = ("runtime", "deployment")  # written after the study's own tables


def to_toml(config: BaseModel) -> str:
    """The resolved config as TOML (written into every run directory)."""
    dumped = config.model_dump(mode="json", exclude_none=True)
    ordered = {k: v for k, v in dumped.items() if k not in LAST_TABLES}
    ordered.update({k: dumped[k] for k in LAST_TABLES if k in dumped})
    return _toml_table(ordered, [])


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml_value(k)


def _toml_table(d: dict[str, Any], prefix: list[str]) -> str:
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in d.items() if not isinstance(v, dict)]
    out = "\n".join(lines) + ("\n" if lines else "")
    for k, v in d.items():
        if isinstance(v, dict):
            out += f"\n[{'.'.join(_toml_key(p) for p in prefix + [k])}]\n" + _toml_table(v, prefix + [k])
    return out

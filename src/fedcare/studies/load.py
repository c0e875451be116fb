"""Loading an experiment file: its TOML read (`fedcare.config`), its study found by name in the
registry, and the study's config model validating it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedcare.config import ConfigError, Experiment, parse_toml, read_config, validate
from fedcare.studies import registry


def load_config(path: Path | str, overrides: list[str] | None = None, *, recorded: Any = None) -> Experiment:
    """The experiment in file `path`, with `--set` `overrides` applied; ConfigError naming the
    file and the key for anything that is not a valid experiment. `recorded`: the study's
    source as a run recorded it (`fedcare.studies.registry.get`)."""
    return parse_config(read_config(path), path, overrides, recorded=recorded)


def parse_config(text: str, path: Path | str, overrides: list[str] | None = None, *,
                 recorded: Any = None) -> Experiment:
    """Validate an experiment given as TOML text with its study's config model; `path` names
    it in errors and anchors relative data paths."""
    raw = parse_toml(text, path, overrides)
    name = raw.setdefault("study", registry.DEFAULT_STUDY)
    try:
        study = registry.get(str(name), recorded)
    except registry.UnknownStudy as e:
        raise ConfigError(f"{path}: study: {e}") from None
    return validate(study.config_model, raw, path, overrides)

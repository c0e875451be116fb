"""Experiment files: TOML validated by pydantic. Unknown or mistyped keys are errors naming the key."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedcare.data.unbc import THESIS_GROUP1, THESIS_GROUP2
METHOD_PATTERN = re.compile(r"^(RANDOM|BC|BF|(C|F|FP|FL)\((N|C|F)\))$")


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the key."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SyntheticPainData(Strict):
    """Options of the synthetic UNBC-layout cohort generated into the run directory."""

    seed: int = 0
    subjects: list[int] | None = None
    frame_scale: float = Field(0.05, gt=0)
    image_size: int = Field(64, ge=16)
    min_frames_per_sequence: int = Field(8, ge=1)


class PainData(Strict):
    root: Path | None = None  # a UNBC-McMaster copy; relative paths resolve against the config's folder
    synthetic: SyntheticPainData | None = None
    pspi_threshold: float = 1.0  # pain = PSPI >= threshold (thesis: 1)
    drop_black_frames: bool = True  # the archive has pure-black frames (e.g. subject 095)
    augment_seed: int = 0  # rotation directions; fixed across run seeds, as the thesis augmented once on disk

    @model_validator(mode="after")
    def _one_source(self) -> "PainData":
        if (self.root is None) == (self.synthetic is None):
            raise ValueError("give exactly one of data.root (a UNBC-McMaster copy) or [data.synthetic]")
        return self


class PainProtocol(Strict):
    pretrain_subjects: list[int] = Field(default_factory=lambda: list(THESIS_GROUP1))  # thesis Group 1
    subjects: list[int] = Field(default_factory=lambda: list(THESIS_GROUP2))  # thesis Group 2
    image_size: int = Field(215, ge=16)
    crop_ratio: float = Field(215 / 250, gt=0.5, le=1)
    balance_per_class: int = Field(200, ge=1)  # SessionBalancing T
    pretrain_val_fraction: float = Field(0.2, gt=0, lt=1)
    last_session: int | None = None  # test sessions 1..last (default: every session present)


class Train(Strict):
    lr: float = Field(1e-3, gt=0)
    batch_size: int = Field(32, ge=2)
    local_epochs: int = Field(5, ge=1)
    max_rounds: int = Field(30, ge=1)  # per session; an epoch for centralized training
    patience: int = Field(5, ge=1)
    pretrain_max_rounds: int = Field(30, ge=1)
    pretrain_patience: int = Field(5, ge=1)
    aggregation: Literal["examples", "uniform"] = "uniform"  # thesis code: unweighted np.mean
    client_fraction: float = Field(1.0, gt=0, le=1)


class PFDLOptions(Strict):
    finetune_epochs: int = Field(5, ge=0)  # F
    lr_factor: float = Field(10.0, gt=0)  # fine-tuning runs at lr / lr_factor
    shared_paths: list[str] = Field(default_factory=lambda: ["features"])


class Runtime(Strict):
    threads: int | None = Field(None, ge=1)  # torch CPU threads; default: torch's choice


class PainExperiment(Strict):
    title: str = "fedcare pain study"
    study: Literal["pain"] = "pain"
    seeds: list[int] = Field(default_factory=lambda: list(range(123, 133)), min_length=1)
    methods: list[str] = Field(min_length=1)
    data: PainData
    protocol: PainProtocol = PainProtocol()
    train: Train = Train()
    pfdl: PFDLOptions = PFDLOptions()
    runtime: Runtime = Runtime()

    @field_validator("methods")
    @classmethod
    def _methods(cls, methods: list[str]) -> list[str]:
        for m in methods:
            if not METHOD_PATTERN.match(m):
                raise ValueError(
                    f"unknown method {m!r}: use RANDOM, BC, BF or C/F/FP/FL with an init N, C or F, e.g. 'FP(C)'"
                )
        if len(set(methods)) != len(methods):
            raise ValueError("methods are listed twice")
        return methods


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Apply `a.b.c=value` to the raw TOML dict; the value is read as TOML, else as a string."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected key=value, e.g. train.max_rounds=3")
    key, text = assignment.split("=", 1)
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    node = raw
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {assignment!r}: {part!r} is not a table")
    node[parts[-1]] = value


def load_config(path: Path | str, overrides: list[str] | None = None) -> PainExperiment:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    for assignment in overrides or []:
        apply_override(raw, assignment)
    try:
        config = PainExperiment.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}" for err in e.errors()
        )
        raise ConfigError(f"{path}: {problems}") from None
    root = config.data.root
    if root is not None and not root.is_absolute():
        config = config.model_copy(update={"data": config.data.model_copy(update={"root": path.parent / root})})
    return config


def to_toml(config: PainExperiment) -> str:
    """The resolved config as TOML (written into every run directory)."""
    return _toml_table(config.model_dump(mode="json", exclude_none=True), [])


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_table(d: dict[str, Any], prefix: list[str]) -> str:
    lines = [f"{k} = {_toml_value(v)}" for k, v in d.items() if not isinstance(v, dict)]
    out = "\n".join(lines) + ("\n" if lines else "")
    for k, v in d.items():
        if isinstance(v, dict):
            out += f"\n[{'.'.join(prefix + [k])}]\n" + _toml_table(v, prefix + [k])
    return out

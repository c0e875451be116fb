"""Experiment files: TOML validated by pydantic. Unknown or mistyped keys are errors naming the key."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

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


class Deployment(Strict):
    """How the experiment runs across sites on Flower (ignored by the in-process simulator)."""

    # site name (a SuperNode's --node-config site="...") -> the client it is (pain: subject id);
    # empty: a site's name is its client id, e.g. site="43"
    sites: dict[str, int] = Field(default_factory=dict)
    min_sites: int = Field(1, ge=1)  # an exchange goes ahead when at least this many sites answered
    round_timeout: float = Field(600.0, gt=0)  # seconds to wait for the sites' replies to one exchange
    connect_timeout: float = Field(300.0, gt=0)  # seconds to wait for every site at the start

    @field_validator("sites")
    @classmethod
    def _distinct(cls, sites: dict[str, int]) -> dict[str, int]:
        clients = list(sites.values())
        if len(set(clients)) != len(clients):
            raise ValueError("two sites are mapped to the same client")
        return sites


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
    deployment: Deployment = Deployment()

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


FEDHEALTH2_METHODS = ("local", "fedavg", "fedprox", "fedbn", "fedper", "fedap", "d-fedap", "f-fedap")


class FedHealth2Synthetic(Strict):
    """Generator options: PAMAP2 (`subjects`, `seconds_per_activity`) or X-ray (`scale`, `image_size`)."""

    seed: int = 0
    subjects: int = Field(9, ge=2)
    seconds_per_activity: float = Field(30.0, gt=0)
    scale: float = Field(0.05, gt=0)
    image_size: int = Field(64, ge=16)


class FedHealth2Data(Strict):
    dataset: Literal["pamap2", "xray"]
    root: Path | None = None  # a PAMAP2 or Sait et al. copy; relative to the config's folder
    synthetic: FedHealth2Synthetic | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "FedHealth2Data":
        if (self.root is None) == (self.synthetic is None):
            raise ValueError("give exactly one of data.root or [data.synthetic]")
        return self


class FedHealth2Protocol(Strict):
    clients: int = Field(20, ge=2)
    dirichlet_alpha: float = Field(0.1, gt=0)  # [code] non_iid_alpha
    test_fraction: float = Field(0.5, gt=0, lt=1)  # 50/50 per client (paper)
    pretrain_fraction: float = Field(0.2, gt=0, lt=1)  # FedAP's pretrained model: a random 20% (paper)
    window: int = Field(200, ge=8)  # PAMAP2: 2 s at 100 Hz (the HAR CNN's flatten size implies T = 200)
    step: int = Field(100, ge=1)  # PAMAP2 window stride
    image_size: int = Field(64, ge=63)  # X-ray input side (AlexNet needs >= 63)


class FedHealth2Train(Strict):
    lr: float = Field(1e-2, gt=0)
    batch_size: int = Field(32, ge=2)
    local_epochs: int = Field(1, ge=1)
    rounds: int = Field(20, ge=1)
    pretrain_epochs: int = Field(10, ge=1)
    aggregation: Literal["examples", "uniform"] = "examples"
    hidden: int = Field(4096, ge=8)  # AlexNet's FC width (X-ray)


class FedHealth2Options(Strict):
    fedprox_mu: float = Field(1e-3, ge=0)  # [code] mu = 1e-3
    fedprox_squared: bool = True  # paper: (mu/2)||w - w_g||^2; the code used the unsquared norm
    fedper_private: list[str] = Field(default_factory=lambda: ["classifier"])
    fedap_lambda: float = Field(0.5, ge=0, le=1)  # [code] model_momentum
    ffedap_warmup_rounds: int = Field(5, ge=1)  # FedBN rounds before f-FedAP's weights (paper: "several")


class FedHealth2Experiment(Strict):
    title: str = "fedcare FedHealth 2 study"
    study: Literal["fedhealth2"]
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    methods: list[Literal[FEDHEALTH2_METHODS]] = Field(min_length=1)  # type: ignore[valid-type]
    data: FedHealth2Data
    protocol: FedHealth2Protocol = FedHealth2Protocol()
    train: FedHealth2Train = FedHealth2Train()
    options: FedHealth2Options = FedHealth2Options()
    runtime: Runtime = Runtime()
    deployment: Deployment = Deployment()


Experiment = Annotated[Union[PainExperiment, FedHealth2Experiment], Field(discriminator="study")]
_EXPERIMENT = TypeAdapter(Experiment)


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


def load_config(path: Path | str, overrides: list[str] | None = None) -> PainExperiment | FedHealth2Experiment:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    return parse_config(text, path, overrides)


def parse_config(text: str, path: Path | str, overrides: list[str] | None = None) -> PainExperiment | FedHealth2Experiment:
    """Validate an experiment given as TOML text; `path` names it in errors and anchors
    relative data paths."""
    path = Path(path)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    for assignment in overrides or []:
        apply_override(raw, assignment)
    raw.setdefault("study", "pain")
    try:
        config = _EXPERIMENT.validate_python(raw)
    except ValidationError as e:  # locations start with the study tag ("pain."): drop it
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'][1:]) or '(top level)'}: {err['msg']}" for err in e.errors()
        )
        raise ConfigError(f"{path}: {problems}") from None
    root = config.data.root
    if root is not None and not root.is_absolute():
        config = config.model_copy(update={"data": config.data.model_copy(update={"root": path.parent / root})})
    return config


def to_toml(config: BaseModel) -> str:
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

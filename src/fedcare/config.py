"""Experiment files: TOML validated by pydantic. Unknown or mistyped keys are errors naming the key.

Every experiment names its study (`study = "pain"`, the default for files that do not say)
and is validated by that study's config model, which the study registry holds
(`fedcare.studies.load` reads a file and finds it there). What every study's config has is
`Experiment` below: title, seeds, methods, `[runtime]` and `[deployment]`; a study's `[train]`
extends `Train`, and the options of local training that several studies have are named and
typed once here.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the key."""


# A site's name becomes file names (keys/<site>, keys/<site>.pub) and a SuperNode's identity:
# one pattern, checked wherever a name enters (config, `fedcare flower certs/site-key/supernode`).
SITE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def site_name_problem(name: str) -> str | None:
    """Why `name` cannot be a site's name (None: it can)."""
    if SITE_NAME.fullmatch(name):
        return None
    return (f"site name {name!r}: use 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit "
            "(a site's name becomes its key files' names)")


def listed_twice(items: list[str]) -> list[str]:
    """The items a config list names more than once, sorted."""
    return sorted({m for m in items if items.count(m) > 1})


class Strict(BaseModel):
    # unknown keys are errors; so are inf and nan (lr = 1e400 trained into nan), except where a
    # field says what infinity means
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


DEVICE_PATTERN = r"auto|cpu|mps|cuda(:\d+)?"  # [runtime] device, and a SuperNode's --device


# The options of local training, one name and one type each across studies: a study's `[train]`
# subclasses `Train` and declares those it has with these types, at its own defaults.
LearningRate = Annotated[float, Field(gt=0)]  # `lr`: the clients' local learning rate
BatchSize = Annotated[int, Field(ge=2)]  # `batch_size`: examples per local step (BatchNorm needs 2)
LocalEpochs = Annotated[int, Field(ge=1)]  # `local_epochs`: passes over a client's data per round
Aggregation = Literal["examples", "uniform"]  # `aggregation`: the server's weights, n_k / n or 1 / K
ProximalMu = Annotated[float, Field(ge=0)]  # `mu`: FedProx's proximal weight


class Train(Strict):
    """`[train]`: local training. Every study has `lr` and `batch_size`; the others it adds
    with the types above (`local_epochs`, `aggregation`, `mu`) or its own."""

    lr: LearningRate = 1e-3
    batch_size: BatchSize = 32


class Runtime(Strict):
    """`[runtime]`: where and how this process computes (docs/running-at-scale.md). Numbers are
    bit-identical only on the same device, precision, threads and kernels (`fedcare.compute`)."""

    # torch CPU threads; default: torch's choice; "auto": the cores left free by other work
    # (cores this process may use - 1-minute load average, at least 1: `fedcare.threads`)
    threads: int | Literal["auto"] | None = None
    # "auto": the first of CUDA, Apple's MPS, the CPU that this machine has; "cuda:N" a given GPU.
    # A Flower site may choose its own (`fedcare flower supernode --device`).
    device: str = "cpu"
    # training arithmetic: "fp32", or "bf16"/"fp16" under torch.autocast (fp16 with a gradient
    # scaler); aggregation and privacy accounting stay in fp32/fp64 on the CPU
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    # CUDA only: deterministic kernels (torch.use_deterministic_algorithms, cuBLAS workspace),
    # slower; on the CPU fedcare's arithmetic is deterministic anyway
    deterministic: bool = False
    # conv nets' weights in channels-last layout (NHWC): fp32 steps 0.81-0.93x as long on an AVX-512
    # CPU (benchmarks/precision.py); other kernels, so other rounding: opt-in
    channels_last: bool = False
    # Flower's Simulation Engine (`fedcare flower run --federation-config ...`): the GPUs each
    # simulated site reserves in Ray (its client_resources num_gpus; 0.25: four sites per GPU)
    gpus_per_site: float = Field(0.0, ge=0)

    @field_validator("threads")
    @classmethod
    def _threads(cls, threads: int | str | None) -> int | str | None:
        if isinstance(threads, int) and threads < 1:
            raise ValueError("threads must be at least 1, or \"auto\"")
        cores = os.cpu_count() or 1
        if isinstance(threads, int) and threads > cores:  # 100000 crashed OpenMP (a segfault)
            raise ValueError(f"threads = {threads} is more than this machine's {cores} cores (more threads than "
                             "cores only slows torch down); give at most that, or \"auto\"")
        return threads

    @field_validator("device")
    @classmethod
    def _device(cls, device: str) -> str:
        if not re.fullmatch(DEVICE_PATTERN, device):
            raise ValueError(f"device must be \"auto\", \"cpu\", \"cuda\", \"cuda:N\" or \"mps\", got {device!r}")
        return device


class Deployment(Strict):
    """How the experiment runs across sites on Flower (ignored by the in-process simulator)."""

    # site name (a SuperNode's --node-config site="...") -> the client it is (pain: a subject
    # id); empty: a site's name is its client id, e.g. site="43"
    sites: dict[str, int | str] = Field(default_factory=dict)
    # the quorum: an exchange goes ahead when at least this many sites answered; a count (an
    # integer), or a fraction of the experiment's sites (0 < x <= 1, rounded up: 0.5 of 3 is 2)
    min_sites: int | float = Field(1, gt=0)
    round_timeout: float = Field(600.0, gt=0)  # seconds to wait for the sites' replies to one exchange
    connect_timeout: float = Field(300.0, gt=0)  # seconds to wait for every site at the start
    # a site that has not answered within round_timeout: "drop" it until its SuperNode reconnects,
    # "skip-round" (the exchange goes on without it; asked again next time) or "wait" for it
    late_sites: Literal["wait", "skip-round", "drop"] = "drop"

    @field_validator("min_sites")
    @classmethod
    def _count_or_fraction(cls, value: int | float) -> int | float:
        if isinstance(value, float) and value > 1:
            raise ValueError(f"{value}: a fraction of the sites is at most 1; give a count of sites as an integer")
        return value

    def quorum(self, sites: int) -> int:
        """min_sites as a count, for an experiment of `sites` sites."""
        if isinstance(self.min_sites, float):
            return max(1, math.ceil(self.min_sites * sites - 1e-9))
        return self.min_sites

    @field_validator("sites")
    @classmethod
    def _distinct(cls, sites: dict[str, int | str]) -> dict[str, int | str]:
        problems = [p for p in map(site_name_problem, sites) if p]
        if problems:
            raise ValueError(problems[0])
        clients = list(sites.values())
        if len(set(clients)) != len(clients):
            raise ValueError("two sites are mapped to the same client")
        return sites


class DataSource(Strict):
    """A study's `[data]`: a copy of the dataset (`root`) or a synthetic one generated into the
    run directory (`[data.synthetic]`), exactly one of them. Subclasses give both fields."""

    @model_validator(mode="after")
    def _one_source(self) -> "DataSource":
        if (self.root is None) == (self.synthetic is None):
            raise ValueError("give exactly one of data.root (a copy of the dataset) or [data.synthetic]")
        return self


class DPSGD(Strict):
    """`[privacy.dp_sgd]`: sample-level DP-SGD at every client (Abadi et al. 2016): each
    example's gradient is clipped to `max_grad_norm`, Gaussian noise of standard deviation
    `noise_multiplier * max_grad_norm` is added to the batch's sum (`fedcare.privacy.dp_sgd`)."""

    noise_multiplier: float = Field(1.0, ge=0)  # sigma; 0: clipping only (no privacy)
    max_grad_norm: float = Field(1.0, gt=0, allow_inf_nan=True)  # C, the per-example L2 bound; inf: no clipping
    delta: float = Field(1e-5, gt=0, lt=1)  # the target delta epsilon is reported for
    accountant: Literal["rdp", "prv"] = "rdp"  # Opacus's RDP or PRV accountant
    # BatchNorm mixes the examples of a batch, so per-example gradients do not exist:
    # "groupnorm" replaces every BatchNorm by a GroupNorm (Opacus's ModuleValidator.fix);
    # "refuse" stops with an error for a model that has BatchNorm.
    batchnorm: Literal["groupnorm", "refuse"] = "groupnorm"
    # "poisson": each example joins each batch with probability batch_size / n (what the
    # accountant assumes); "shuffle": fixed-size shuffled batches, epsilon then approximate
    sampling: Literal["poisson", "shuffle"] = "poisson"
    # a budget instead of a noise multiplier: sigma calibrated per client so that
    # `budget_epochs` passes over its data spend `target_epsilon` at `delta`; a client stops
    # training (later fits recorded as skipped) before a step would cross it
    target_epsilon: float | None = Field(None, gt=0)
    budget_epochs: float | None = Field(None, gt=0)  # passes planned over the whole run: rounds x (local + fine-tuning) epochs

    @model_validator(mode="after")
    def _budget(self) -> "DPSGD":
        if self.target_epsilon is not None:
            if self.budget_epochs is None:
                raise ValueError("target_epsilon needs budget_epochs: the passes over a client's data the budget "
                                 "must last (rounds x local epochs, plus fine-tuning epochs)")
            if "noise_multiplier" in self.model_fields_set:
                raise ValueError("give target_epsilon or noise_multiplier, not both (the noise multiplier is "
                                 "calibrated from target_epsilon)")
        elif self.budget_epochs is not None:
            raise ValueError("budget_epochs applies with target_epsilon only")
        return self

    @model_validator(mode="after")
    def _finite_noise(self) -> "DPSGD":
        if math.isinf(self.max_grad_norm) and self.noise_multiplier > 0:
            raise ValueError("max_grad_norm = inf (no clipping) makes the noise, noise_multiplier x max_grad_norm, "
                             "infinite: clip (a finite max_grad_norm) or set noise_multiplier = 0")
        return self


class ClientDP(Strict):
    """`[privacy.client_dp]`: client-level DP at the server (DP-FedAvg, McMahan et al. 2018;
    Andrew et al. 2021 for adaptive clipping), as Flower's DifferentialPrivacyServerSide*
    wrappers do it: each client's update is clipped to the clipping norm, the clipped updates
    are averaged uniformly, and Gaussian noise of std noise_multiplier * norm / clients is added."""

    noise_multiplier: float = Field(1.0, ge=0)
    clipping_norm: float = Field(1.0, gt=0)  # the fixed norm, or the adaptive norm's start
    adaptive: bool = False  # adapt the norm towards the `target_quantile` of update norms
    target_quantile: float = Field(0.5, ge=0, le=1)  # gamma: the fraction of updates left unclipped, C tends to that quantile
    clip_norm_lr: float = Field(0.2, gt=0)  # the geometric update's learning rate
    clipped_count_stddev: float | None = Field(None, ge=0)  # None: clients / 20, Flower's default
    delta: float = Field(1e-5, gt=0, lt=1)  # the target delta epsilon is reported for
    # a budget instead of a noise multiplier: sigma calibrated so that `budget_rounds` rounds
    # spend `target_epsilon` at `delta`; a client whose next round would cross it is skipped
    target_epsilon: float | None = Field(None, gt=0)
    budget_rounds: int | None = Field(None, ge=1)  # the rounds each client is planned to take part in, over the run

    @model_validator(mode="after")
    def _budget(self) -> "ClientDP":
        if self.target_epsilon is not None:
            if self.budget_rounds is None:
                raise ValueError("target_epsilon needs budget_rounds: the rounds the budget must last")
            if "noise_multiplier" in self.model_fields_set:
                raise ValueError("give target_epsilon or noise_multiplier, not both (the noise multiplier is "
                                 "calibrated from target_epsilon)")
        elif self.budget_rounds is not None:
            raise ValueError("budget_rounds applies with target_epsilon only")
        return self


class SecureAggregation(Strict):
    """`[privacy.secure_aggregation]`: the server learns only the weighted sum of the clients'
    updates (SecAgg+ on fedcare's exchange, `fedcare.privacy.secagg`)."""

    # t as a fraction of a round's clients (at least 2): a round finishes while t clients are
    # left; above one half, so two disjoint groups can never both rebuild a client's secrets
    threshold: float = Field(2 / 3, gt=0.5, le=1)


class MembershipAudit(Strict):
    """`[privacy.audit]`: after each federation's training, the loss attack of membership
    inference (`fedcare.privacy.audit`) on every client's training frames against frames of the
    same sessions it never trained on, from three views (its own model, a peer's, the server's).
    It runs while the run still holds the models (runs do not keep them), in this process only.
    Studies that offer it say so (`Experiment.offers_membership_audit`); docs/privacy.md."""

    max_per_set: int = Field(200, ge=10)  # members (and as many non-members) per client, at most
    server_epochs: int = Field(3, ge=1)  # epochs the server fits a split model's private part on its own data


class Privacy(Strict):
    """`[privacy]`: the protections a run applies, each off unless its table is given, and the
    membership audit (`[privacy.audit]`)."""

    dp_sgd: DPSGD | None = None
    client_dp: ClientDP | None = None
    secure_aggregation: SecureAggregation | None = None
    audit: MembershipAudit | None = None


class Attack(Strict):
    """`[robustness.attack]`: simulated poisoning, in process only (`fedcare run`): the listed
    clients train as usual, then send a poisoned update (`fedcare.algorithms.attack`).
    "sign_flip": the update reversed and multiplied by `scale` (default 1); "scaled_update":
    the update multiplied by `scale` (default 10); "label_flip": trained on flipped labels
    (binary and multi-label: 1 - y; multiclass: C - 1 - y), no scale."""

    clients: list[int | str] = Field(min_length=1)  # client ids as the study names them (pain: subjects)
    kind: Literal["sign_flip", "scaled_update", "label_flip"]
    scale: float | None = Field(None, gt=0)

    @property
    def effective_scale(self) -> float:
        return self.scale if self.scale is not None else {"sign_flip": 1.0, "scaled_update": 10.0}.get(self.kind, 1.0)

    @model_validator(mode="after")
    def _scale(self) -> "Attack":
        if self.kind == "label_flip" and self.scale is not None:
            raise ValueError('scale: a "label_flip" attack has no scale (it changes the labels, not the update)')
        if len(set(map(str, self.clients))) != len(self.clients):
            raise ValueError("clients: a client is listed twice")
        return self


RobustRule = Literal["mean", "median", "trimmed_mean", "krum", "multi_krum", "bulyan"]


class Robustness(Strict):
    """`[robustness]`: how the server of the FedAvg family combines the replies (docs/robustness.md),
    and simulated attackers (`[robustness.attack]`). Without the table: the weighted mean."""

    rule: RobustRule = "mean"  # "mean": the algorithm's own weighted mean, unchanged
    trim_fraction: float = Field(0.2, ge=0, lt=0.5)  # trimmed_mean: cut at each end (Flower's beta)
    byzantine: int = Field(0, ge=0)  # krum, multi_krum, bulyan: f, the attackers tolerated (num_malicious_nodes)
    multi_krum_keep: int | None = Field(None, ge=1)  # multi_krum: m, the replies averaged (num_nodes_to_select)
    attack: Attack | None = None

    @model_validator(mode="after")
    def _parameters_of_rule(self) -> "Robustness":
        # a value other than the default, for a rule that does not use it (the defaults are written
        # into every run's config.toml, which a resume reads back)
        if self.trim_fraction != 0.2 and self.rule != "trimmed_mean":
            raise ValueError(f'trim_fraction is for rule = "trimmed_mean", not {self.rule!r}')
        if self.byzantine != 0 and self.rule not in ("krum", "multi_krum", "bulyan"):
            raise ValueError(f'byzantine is for rule = "krum", "multi_krum" or "bulyan", not {self.rule!r}')
        if (self.multi_krum_keep is None) == (self.rule == "multi_krum"):
            raise ValueError('multi_krum_keep: give it for rule = "multi_krum" (the replies averaged), and only then')
        if self.rule == "bulyan" and self.byzantine < 1:
            raise ValueError('rule = "bulyan" needs byzantine >= 1 (with 0 it is the plain mean); it needs '
                             "4 x byzantine + 3 replies a round")
        return self


class Experiment(Strict):
    """What every study's experiment has; a study's config model extends it (and narrows
    `study` to its name, `methods` to its methods)."""

    title: str = "fedcare experiment"
    study: str
    seeds: list[int] = Field(min_length=1)
    methods: list[str] = Field(min_length=1)
    runtime: Runtime = Runtime()
    deployment: Deployment = Deployment()
    privacy: Privacy | None = None  # no [privacy] table: no protection beyond keeping data at the clients
    robustness: Robustness | None = None  # no [robustness] table: the weighted mean, no simulated attackers
    # a study whose protocol runs [privacy.audit] sets this (the pain study); others refuse the table
    offers_membership_audit: ClassVar[bool] = False
    # old dotted key -> its new name: an experiment file using the old one still loads, with a
    # warning naming both, for one release (then the old name is an unknown key)
    renamed: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, raw: Any, info: ValidationInfo) -> Any:
        if isinstance(raw, dict) and cls.renamed:
            return move_renamed(raw, cls.renamed, (info.context or {}).get("source"))
        return raw

    @field_validator("methods")
    @classmethod
    def _distinct_methods(cls, methods: list[str]) -> list[str]:
        twice = listed_twice(methods)
        if twice:
            raise ValueError(f"{', '.join(twice)} listed more than once (each method runs once per seed)")
        return methods

    @model_validator(mode="after")
    def _dp_sgd_precision(self) -> "Experiment":
        if self.privacy is not None and self.privacy.dp_sgd is not None and self.runtime.precision == "fp16":
            raise ValueError('privacy.dp_sgd: not with runtime.precision = "fp16": its gradient scaler scales the '
                             "loss, and Opacus's per-example gradients, computed from that scaled backward pass, are "
                             'not unscaled by it, so clipping would bound the wrong norm; use "bf16" (no scaling) or "fp32"')
        return self

    @model_validator(mode="after")
    def _robust_rule_and_privacy(self) -> "Experiment":
        r, p = self.robustness, self.privacy
        if r is None or r.rule == "mean" or p is None:
            return self
        if p.client_dp is not None:
            raise ValueError(f"robustness.rule = {r.rule!r} and privacy.client_dp: client-level DP's noise is "
                             "calibrated to the mean of clipped updates, not to a robust rule; use one or the other")
        if p.secure_aggregation is not None:
            raise ValueError(f"robustness.rule = {r.rule!r} and privacy.secure_aggregation: the server sees only "
                             "the sum of the updates, and a robust rule needs each one; use one or the other")
        return self

    @model_validator(mode="after")
    def _audit_offered(self) -> "Experiment":
        if self.privacy is not None and self.privacy.audit is not None and not self.offers_membership_audit:
            raise ValueError(f"privacy.audit: the {self.study} study has no membership audit "
                             f"(the pain, surgical and face studies have)")
        return self

    def relative_to(self, folder: Path) -> "Experiment":
        """The config with a relative `data.root` resolved against `folder` (the config
        file's folder). Studies whose data are found otherwise override this."""
        data = getattr(self, "data", None)
        root = getattr(data, "root", None)
        if root is None or Path(root).is_absolute():
            return self
        return self.model_copy(update={"data": data.model_copy(update={"root": folder / root})})


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Apply `a.b.c=value` to the raw TOML dict; the value is read as TOML, else as a string."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected key=value, e.g. train.max_rounds=3")
    key, text = assignment.split("=", 1)
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


def move_renamed(raw: dict[str, Any], renamed: Mapping[str, str], source: str | None = None) -> dict[str, Any]:
    """`raw` with each old key of `renamed` that it gives moved to the new name, logging a
    warning naming both (and `source`, the file); both given is an error."""
    raw = dict(raw)
    for old, new in renamed.items():
        *old_tables, old_key = old.split(".")
        *new_tables, new_key = new.split(".")
        node, path = raw, []
        for table in old_tables:  # copies of the tables on the way: the caller's dict is left as it was
            if not isinstance(node.get(table), dict):
                break
            node[table] = dict(node[table])
            node, path = node[table], [*path, table]
        if path != old_tables or old_key not in node:
            continue
        target = raw
        for table in new_tables:
            if not isinstance(target.get(table, {}), dict):
                return raw  # not a table: validation names it
            target[table] = dict(target.get(table, {}))
            target = target[table]
        value = node.pop(old_key)
        if new_key in target:
            raise ValueError(f"{old} and {new} are one option ({old} is its old name): give {new} only")
        target[new_key] = value
        log.warning("%s%s is now called %s; the old name is read until the next release",
                    f"{source}: " if source else "", old, new)
    return raw


def read_config(path: Path | str) -> str:
    """An experiment file's text; ConfigError naming the file when it cannot be read."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
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

"""`Experiment`: what every study's experiment file has; a study's config model extends it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, ValidationInfo, field_validator, model_validator

from fedcare.config.base import Strict, listed_twice
from fedcare.config.deployment import Deployment
from fedcare.config.privacy import Privacy
from fedcare.config.robustness import Robustness
from fedcare.config.runtime import Runtime
from fedcare.config.tracking import Tracking
log = logging.getLogger("fedcare.config")


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
    tracking: Tracking | None = None  # no [tracking] table: the run directory is the run's only record
    # a study whose protocol runs [privacy.audit]'s membership audit sets this (pain, surgical, face);
    # others refuse its membership keys (the one-run audits apply to every study)
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
        audit = self.privacy.audit if self.privacy is not None else None
        if audit is not None and audit.membership and not self.offers_membership_audit:
            raise ValueError(f"privacy.audit: the {self.study} study has no membership audit "
                             f"(the pain, surgical and face studies have); the one-run audits (canaries, "
                             f"canary_clients) apply to every study")
        return self

    def relative_to(self, folder: Path) -> "Experiment":
        """The config with a relative `data.root` resolved against `folder` (the config
        file's folder). Studies whose data are found otherwise override this."""
        data = getattr(self, "data", None)
        root = getattr(data, "root", None)
        if root is None or Path(root).is_absolute():
            return self
        return self.model_copy(update={"data": data.model_copy(update={"root": folder / root})})


def move_renamed(raw: dict[str, Any], renamed: Mapping[str, str], source: str | None = None) -> dict[str, Any]:
    """`raw` with each old key of `renamed` that it gives moved to the new name, logging a
    warning naming both (and `source`, the file); both given is an error. The caller's dict is
    left as it was: each table on the way is copied, once (an old and a new name may share it)."""
    raw = dict(raw)
    copied: set[int] = set()

    def table(path: list[str]) -> dict[str, Any] | None:
        """The table at `path`, copied (created if missing); None where a key on the way is no table."""
        node = raw
        for name in path:
            child = node.get(name, {})
            if not isinstance(child, dict):
                return None
            if id(child) not in copied:
                child = node[name] = dict(child)
                copied.add(id(child))
            node = child
        return node

    for old, new in renamed.items():
        *old_tables, old_key = old.split(".")
        *new_tables, new_key = new.split(".")
        given = raw
        for name in old_tables:
            given = given.get(name) if isinstance(given, dict) else None
        if not isinstance(given, dict) or old_key not in given:
            continue
        node, target = table(old_tables), table(new_tables)
        if target is None:
            return raw  # not a table: validation names it
        value = node.pop(old_key)
        if new_key in target:
            raise ValueError(f"{old} and {new} are one option ({old} is its old name): give {new} only")
        target[new_key] = value
        log.warning("%s%s is now called %s; the old name is read until the next release",
                    f"{source}: " if source else "", old, new)
    return raw

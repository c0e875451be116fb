"""`[robustness]`: the server's aggregation rule and simulated attackers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fedcare.config.base import Strict


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

"""What every experiment table is built from: `Strict` models (unknown keys, inf and nan are
errors), `ConfigError`, and the options of local training several studies share (`Train`,
the shared types, `DataSource`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedcare.errors import UserError


class ConfigError(UserError, ValueError):
    """A config file that cannot be used; the message names the file and the key."""


def listed_twice(items: list[str]) -> list[str]:
    """The items a config list names more than once, sorted."""
    return sorted({m for m in items if items.count(m) > 1})


class Strict(BaseModel):
    # unknown keys are errors; so are inf and nan (lr = 1e400 trained into nan), except where a
    # field says what infinity means
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# The options of local training, one name and one type each across studies: a study's `[train]`
# subclasses `Train` and declares those it has with these types, at its own defaults.
# Counts have upper bounds: past them a run would never finish (rounds = 2^62 allocates its
# round list, then runs for ever), so a mistyped exponent is an error naming the key.
MAX_ROUNDS = 100_000
MAX_EPOCHS = 10_000
MAX_CLIENTS = 10_000  # clients a study splits its data into (`clients`): more than one machine simulates
LearningRate = Annotated[float, Field(gt=0)]  # `lr`: the clients' local learning rate
BatchSize = Annotated[int, Field(ge=2, le=1 << 24)]  # `batch_size`: examples per local step (BatchNorm needs 2)
LocalEpochs = Annotated[int, Field(ge=1, le=MAX_EPOCHS)]  # `local_epochs`: passes over a client's data per round
# `rounds`: the rounds a federation trains (with early stopping: the most it trains); the
# rounds of a pretraining are `pretrain_rounds`. A pooled (centralized) round is one epoch.
Rounds = Annotated[int, Field(ge=1, le=MAX_ROUNDS)]
Aggregation = Literal["examples", "uniform"]  # `aggregation`: the server's weights, n_k / n or 1 / K
ProximalMu = Annotated[float, Field(ge=0)]  # `mu`: FedProx's proximal weight


class Train(Strict):
    """`[train]`: local training. Every study has `lr` and `batch_size`; the others it adds
    with the types above (`local_epochs`, `rounds`, `aggregation`, `mu`) or its own."""

    lr: LearningRate = 1e-3
    batch_size: BatchSize = 32


class DataSource(Strict):
    """A study's `[data]`: a copy of the dataset (`root`) or a synthetic one generated into the
    run directory (`[data.synthetic]`), exactly one of them. Subclasses give both fields."""

    @model_validator(mode="after")
    def _one_source(self) -> "DataSource":
        if (self.root is None) == (self.synthetic is None):
            raise ValueError("give exactly one of data.root (a copy of the dataset) or [data.synthetic]")
        return self

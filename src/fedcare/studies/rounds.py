"""A study that trains federations for rounds and evaluates every client on its own test data:
the protocol, the config and the study base that a simple study uses as they are
(`fedcare new study` writes one; examples/lung is one). Its report is
`fedcare.studies.rounds_report`.

Per seed, every method starts from the same initial weights (torch's default init drawn from
the run's (seed, "init")), runs the algorithm's setup exchange if it has one, and trains
`train.rounds` rounds on every client's training data. Every client is evaluated with its own
model on its own test data before training (round 0), after every `protocol.evaluate_every`-th
round and after the last. Two methods are more than an algorithm:

- `"single-site"`: for each site, a model trained at that site alone (FedAvg with one client,
  the others idle), then scored at every client: what one site could do without federating.
  Its records carry `model = <site>`; the report shows the best of them beside the methods.
- a method whose algorithm pools data (`"centralized"`): one participant holding every
  client's training data, in this process only (`check_deployable` refuses it across sites).

A site receives its data by reference: `data_ref("train", seed)` or `data_ref("test", seed)`
(a `SeededSplit`: the split to use for that run seed; a site lists `SeededSplit` in its
`data_refs`), read back with `parse_data_ref`; these two functions are the one place the
references are made and read. Units: one round of a method of a seed,
or one site's whole single-site model; `fedcare resume` continues after the last one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from pydantic import Field
from torch import nn

from fedcare.algorithms.base import Algorithm, ClientId
from fedcare.algorithms.catalogue import build
from fedcare.algorithms.training import TrainSettings
from fedcare.config import (
    Aggregation, BatchSize, ConfigError, Experiment, LearningRate, LocalEpochs, ProximalMu, Rounds, Strict, Train,
)
from fedcare.runtime.federation import POOLED, Federation
from fedcare.runtime.refs import DataRef, SeededSplit
from fedcare.seeding import derive_seed
from fedcare.studies.base import Study, StudyProtocol
from fedcare.tasks import BINARY, Task

SINGLE_SITE = "single-site"
SPLITS = ("train", "test")
# the metric a report leads with, by task (a study may name another: `RoundsStudy.metric`)
DEFAULT_METRIC = {"binary": "roc_auc", "multiclass": "accuracy", "multilabel": "macro_f1", "embedding": "tar"}


# -- data references --------------------------------------------------------------------
def data_ref(split: str, seed: int) -> SeededSplit:
    """The reference a site receives: which split of its data, for which run seed."""
    return SeededSplit(split, seed)


def parse_data_ref(ref: DataRef) -> tuple[str, int]:
    """(split, seed) of a reference `data_ref` made; ValueError for anything else."""
    if not isinstance(ref, SeededSplit) or ref.name not in SPLITS:
        raise ValueError(f"unknown data reference {ref!r}: expected SeededSplit('train' or 'test', seed)")
    return ref.name, ref.seed


# -- the experiment file ----------------------------------------------------------------
class RoundsTrain(Train):
    """`[train]`: every client's local training, and the rounds."""

    lr: LearningRate = 0.05
    batch_size: BatchSize = 16
    local_epochs: LocalEpochs = 1
    rounds: Rounds = 20
    aggregation: Aggregation = "examples"  # the server's weights: n_k / n ("examples") or 1 / K ("uniform")
    mu: ProximalMu = 0.01  # FedProx's proximal weight


class RoundsOptions(Strict):
    """`[protocol]`: when the clients are evaluated."""

    evaluate_every: int = Field(1, ge=1)  # every k-th round (round 0 and the last always)


class RoundsExperiment(Experiment):
    """What a rounds study's experiment has; the study's config model narrows `study` and
    `methods` and adds its `[data]`."""

    train: RoundsTrain = RoundsTrain()
    protocol: RoundsOptions = RoundsOptions()


# -- the protocol -----------------------------------------------------------------------
class RoundsProtocol(StudyProtocol):
    """Each seed x method: a federation trained for `train.rounds` rounds, every client
    evaluated on its own test data (see the module docstring). A study changes one step by
    overriding its method: `clients`, `data`, `prepare_seed`, `initial_model`, `start`,
    `before_round`."""

    metrics: ClassVar[str | None] = None  # the metric kind clients compute; None: the study's task's

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.rounds = self.config.train.rounds
        self.units_total = sum(len(self.units(seed, method, self.clients(seed)))
                               for seed in self.config.seeds for method in self.config.methods)

    # -- the steps a study may change ----------------------------------------------------
    def clients(self, seed: int) -> list[ClientId]:
        """The clients taking part for this seed (all of them by default)."""
        return sorted(self.runtime.summaries())

    def data(self, split: str, seed: int, clients: list[ClientId]) -> dict[ClientId, DataRef]:
        """Each client's reference to its `split` for this seed."""
        return {c: data_ref(split, seed) for c in clients}

    def prepare_seed(self, seed: int, clients: list[ClientId]) -> None:
        """Work a seed needs before its methods (e.g. a pretrained start); nothing by default."""

    def new_model(self, seed: int) -> nn.Module:
        """The model with torch's default init drawn from the run's derived seed, leaving the
        global generator as it was."""
        with torch.random.fork_rng():
            torch.manual_seed(derive_seed(seed, "init"))
            return self.study.composed.new_model()

    def initial_model(self, method: str, seed: int) -> nn.Module:
        """Where a method's federation starts (the same weights for every method by default)."""
        return self.new_model(seed)

    def start(self, federation: Federation, method: str, seed: int, train: Mapping[ClientId, Any]) -> None:
        """Before round 1: the algorithm's setup exchange (nothing happens without one)."""
        federation.run_setup("setup", train)

    def before_round(self, federation: Federation, method: str, seed: int, rnd: int,
                     train: Mapping[ClientId, Any]) -> None:
        """Before each round; nothing by default."""

    # -- the protocol ------------------------------------------------------------------
    @property
    def metric_kind(self) -> str:
        return self.metrics or self.study.task.metric_kinds[-1]

    def facts(self) -> dict:
        task = getattr(self.study, "task", BINARY)
        return {"clients": len(self.runtime.summaries()), "rounds": self.rounds,
                "metric": getattr(self.study, "metric", "") or DEFAULT_METRIC.get(task.name, "loss")}

    def units(self, seed: int, method: str, clients: list[ClientId]) -> list[tuple]:
        if method == SINGLE_SITE:
            return [(seed, method, site) for site in clients]
        return [(seed, method, rnd) for rnd in range(1, self.rounds + 1)]

    def evaluates(self, rnd: int) -> bool:
        every = getattr(getattr(self.config, "protocol", None), "evaluate_every", 1)  # a study's own [protocol]: 1
        return rnd == self.rounds or rnd % every == 0

    def evaluate(self, federation: Federation, method: str, seed: int, rnd: int, clients: list[ClientId],
                 **point: Any) -> None:
        self.evaluate_clients(federation, self.data("test", seed, clients), self.metric_kind, method=method,
                              seed=seed, round=rnd, **point)

    def run(self) -> None:
        for seed in self.config.seeds:
            clients = self.clients(seed)
            self.prepare_seed(seed, clients)
            for method in self.config.methods:
                units = self.units(seed, method, clients)
                run = self.run_single_sites if method == SINGLE_SITE else self.run_method
                self.stop_if_diverged(seed, method, units, lambda: run(method, seed, clients))

    def training_data(self, federation: Federation, seed: int, clients: list[ClientId]) -> dict[ClientId, Any]:
        """Each client's training data; one participant holding all of it for a pooled algorithm."""
        train = self.data("train", seed, clients)
        return {POOLED: self.runtime.pool(train)} if federation.algorithm.pooled else train

    def run_method(self, method: str, seed: int, clients: list[ClientId]) -> None:
        """The rounds; a resumed run takes the federation back after its last finished round."""
        done = [rnd for rnd in range(1, self.rounds + 1) if self.finished(seed, method, rnd)]
        if len(done) == self.rounds:
            return
        federation = self.runtime.federation(self.initial_model(method, seed), method, seed,
                                             label={"method": method, "seed": seed})
        train = self.training_data(federation, seed, clients)
        if done:
            federation.load_state_dict(self.checkpoint.state("federation"))
        else:
            self.start(federation, method, seed, train)
            self.evaluate(federation, method, seed, 0, clients)
        for rnd in range(len(done) + 1, self.rounds + 1):
            self.before_round(federation, method, seed, rnd, train)
            info = federation.run_round("train", rnd, train)
            self.record("round", method=method, seed=seed, phase="train", round=rnd, **info)
            if self.evaluates(rnd):
                self.evaluate(federation, method, seed, rnd, clients)
            self.finish_unit(f"seed {seed}: {method} round {rnd}", seed, method, rnd,
                             federation=federation.state_dict if rnd < self.rounds else None)

    def run_single_sites(self, method: str, seed: int, clients: list[ClientId]) -> None:
        """Each site's model trained there alone for the rounds, then scored at every client."""
        for site in clients:
            if self.finished(seed, method, site):
                continue
            federation = self.runtime.federation(self.initial_model(method, seed), method, seed,
                                                 label={"method": method, "seed": seed, "model": site})
            train = {site: self.data("train", seed, clients)[site]}
            self.start(federation, method, seed, train)
            for rnd in range(1, self.rounds + 1):
                info = federation.run_round("train", rnd, train)
                self.record("round", method=method, seed=seed, phase="train", round=rnd, model=site, **info)
            self.evaluate(federation, method, seed, self.rounds, clients, model=site)
            self.finish_unit(f"seed {seed}: {site}'s model alone", seed, method, site)


# -- the study --------------------------------------------------------------------------
class RoundsStudy(Study):
    """A study whose protocol is `RoundsProtocol`, whose report is
    `fedcare.studies.rounds_report`, and whose methods are the library's algorithms by name (`fedcare.algorithms.catalogue`)
    plus "single-site". A study sets `name`, `config_model` (a `RoundsExperiment`),
    `description`, `task` (and `metric`, the one its report leads with), and implements
    `new_model`, `local_runtime`, `clients` and `open_site`."""

    protocol_class = RoundsProtocol
    report_module = "fedcare.studies.rounds_report"
    task: ClassVar[Task] = BINARY
    metric: ClassVar[str] = ""  # a client_eval field, e.g. "roc_auc"; "": the task's (DEFAULT_METRIC)
    config: RoundsExperiment

    def sample_ref(self) -> DataRef:
        """The first seed's training split: the model's outputs are checked on a few of its examples."""
        return data_ref("train", self.config.seeds[0])

    def algorithm(self, name: str) -> Algorithm:
        privacy = self.config.privacy
        if name == SINGLE_SITE and privacy is not None and privacy.secure_aggregation is not None:
            raise ConfigError(f"methods: {SINGLE_SITE!r} trains at one site a round, and "
                              "privacy.secure_aggregation needs at least 2 clients a round: leave out one of them")
        t = self.config.train
        settings = TrainSettings(lr=t.lr, batch_size=t.batch_size, local_epochs=t.local_epochs, task=self.task)
        return build("fedavg" if name == SINGLE_SITE else name, settings, weighting=t.aggregation, mu=t.mu)

    def check_deployable(self, name: str) -> None:
        pooled = [m for m in self.config.methods if self.algorithm(m).pooled]
        if pooled:
            raise ConfigError(f"{name}: methods {pooled} pool every client's data, which sites do not share; "
                              "they run in one process only (fedcare run)")
        if not self.clients():
            raise ConfigError(f"{name}: name the clients the sites hold in [deployment.sites]")

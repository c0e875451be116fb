"""What a study is to fedcare: a `Study` (bound to one experiment) and its `StudyProtocol`.

A study is one folder under `studies/` (or anywhere, see `fedcare.studies.registry`) with

- a config model (a subclass of `fedcare.config.Experiment`),
- its data wiring: `local_runtime` reads (or generates) the data in this process and gives
  every client a `Site`; `open_site` reads one client's data at a site (Flower),
- its model and algorithms by name (`new_model`, `algorithm`, plain: both runtimes build them
  through `composed`, which puts the experiment's attack, robust rule, privacy and precision
  around them: `fedcare.studies.compose`),
- its protocol (a `StudyProtocol`: what runs between loading the data and the report),
- its report (`build_report`, `summary_markdown`, from a run directory alone),

and `STUDY = <the Study subclass>` in its `__init__.py`. Everything else (the run directory,
records, progress, the runtimes, Flower) is shared: `fedcare.studies.run.run_study` runs any
registered study. See docs/architecture.md, "How to add a study".
"""

from __future__ import annotations

import functools
import importlib
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any, ClassVar, Protocol

from torch import nn

from fedcare.algorithms.base import Algorithm, ClientId
from fedcare.algorithms.training import ClientData, TrainingDiverged
from fedcare.config import ConfigError, Experiment
from fedcare.device import Compute, DeviceUnavailable
from fedcare.progress import UNITS
from fedcare.runtime.clients import Data
from fedcare.runtime.federation import Federation
from fedcare.runtime.lineage import Lineage
from fedcare.runtime.local import LocalRuntime
from fedcare.runtime.preflight import Expectations
from fedcare.runtime.refs import DataRef
from fedcare.runtime.sites import Site, SiteError
from fedcare.studies.checkpoint import Checkpoint, NoCheckpoint
from fedcare.studies.compose import Composed
from fedcare.studies.rundir import Progress

# write(record): one JSON object appended to metrics.jsonl
Records = Callable[[dict], None]


class StudyRuntime(Protocol):
    """What a protocol (and the run sequence) sees of its clients, in process (`LocalRuntime`)
    or at their sites (`fedcare.runtime.flower.FlowerRuntime`)."""

    synthetic: bool
    local_data: Any  # the study's in-process data for pooled steps; None at sites
    sites: Mapping[ClientId, Site] | None  # every client's site, in this process; None across sites
    lineage: Lineage | None  # set by the run sequence: the runtime has it follow every federation it builds

    def summaries(self) -> Mapping[ClientId, dict]: ...

    def federation(self, model: nn.Module, algorithm: str, seed: int, client_fraction: float = 1.0,
                   label: Mapping[str, Any] | None = None) -> Federation: ...

    def pool(self, refs: Mapping[ClientId, DataRef]) -> ClientData:
        """The clients' data that `refs` name, in one (in this process only)."""

    def start_facts(self) -> dict:
        """What run.json says from the start (a run across sites: that it is one)."""

    def facts(self) -> dict:
        """What run.json says at the end (a run across sites: the sites, what each missed)."""

    def notes(self) -> list[str]:
        """What the report's notes say about the runtime (synthetic data, sites that missed rounds)."""


class Study(ABC):
    """A study bound to one experiment (`config`); the class is what the registry holds."""

    name: ClassVar[str]  # as in experiment files: study = "<name>"
    config_model: ClassVar[type[Experiment]]
    description: ClassVar[str] = ""  # one line, for `fedcare demo --help`
    protocol_class: ClassVar[type[StudyProtocol]]
    # the module with build_report(run_dir, run_info, notes) and summary_markdown(run_dir),
    # imported only when a report is made (a site never needs it, nor matplotlib)
    report_module: ClassVar[str]

    def __init__(self, config: Experiment):
        self.config = config

    @functools.cached_property
    def compute(self) -> Compute:
        """The experiment's `[runtime]` device (resolved on this machine), precision and
        determinism: where this process builds its models and how its clients train."""
        try:
            return Compute.of(self.config.runtime)
        except DeviceUnavailable as e:
            raise ConfigError(f"runtime.device: {e}") from None

    # -- model and algorithms ----------------------------------------------------------
    @abstractmethod
    def new_model(self) -> nn.Module:
        """A model of the study's architecture (at a site its weights come from the server),
        plain: runtimes and protocols build it through `composed`."""

    @abstractmethod
    def algorithm(self, name: str) -> Algorithm:
        """The algorithm the protocol calls `name`, configured from the experiment, plain:
        runtimes build it through `composed`."""

    @functools.cached_property
    def composed(self) -> Composed:
        """The study's model and algorithms with the experiment's stack (attack, robust rule,
        privacy, precision) around them, built in one place (`fedcare.studies.compose`): what a
        runtime builds from (`LocalRuntime(sites, self.composed.algorithm, ...)`) and what a
        protocol makes its models with (`self.study.composed.new_model()`)."""
        return Composed(self)

    # -- data --------------------------------------------------------------------------
    @abstractmethod
    def local_runtime(self, workdir: Path, progress: Progress | None) -> LocalRuntime:
        """Every client's site in this process: read the data (or generate it into `workdir`,
        the run directory), and keep what pooled steps need as `local_data`."""

    @abstractmethod
    def clients(self) -> list[ClientId]:
        """The clients a run across sites waits for, in protocol order (Flower's Simulation
        Engine runs partition i as the i-th)."""

    @abstractmethod
    def open_site(self, site: str, data_dir: Path, cache_dir: Path | None = None) -> Site:
        """One site's client (`site_client(site)`), its data read from its own `data_dir`;
        raises `SiteError` or a `DataError` naming the problem. What it caches goes to
        `cache_dir`, which the site chose (its --state-dir), else the user's cache: never where
        the experiment says (`data.cache` is the coordinator's machine's choice, not a site's)."""

    def site_client(self, site: str) -> ClientId:
        """The client a site holds: `[deployment.sites]` maps names to clients; without it a
        site's name is its client id (a number when the protocol's clients are numbers)."""
        expected = self.clients()
        sites = self.config.deployment.sites
        if sites:
            if site not in sites:
                raise SiteError(f"site {site!r} is not in the experiment's [deployment.sites] ({', '.join(sorted(sites))})")
            client = sites[site]
        elif expected and all(isinstance(c, int) for c in expected):
            try:
                client = int(site)
            except ValueError:
                raise SiteError(f"site {site!r}: the experiment has no [deployment.sites], so a site's name must be "
                                f"its client id (one of {expected})") from None
        else:
            client = site
        if client not in expected:
            raise SiteError(f"site {site!r} holds client {client!r}, which is not one of the experiment's clients "
                            f"{expected}")
        return client

    def preflight_expectations(self) -> Expectations:
        """What every site's data must hold, checked on the sites' aggregate summaries before
        the first round (`fedcare.runtime.preflight`); nothing by default."""
        return Expectations()

    def check_deployable(self, name: str) -> None:
        """Refuse, before any site is contacted, what cannot run across sites (methods that
        pool data); raise `fedcare.config.ConfigError` naming the experiment `name`."""

    def algorithm_names(self) -> list[str]:
        """The algorithms the experiment's methods use, by the names `algorithm` takes (the
        methods themselves by default). Each is built, with its stack, before any data are
        read and again before the first unit (`fedcare.studies.checks`): a method the study
        cannot build, or a protection that cannot cover it, stops the run up front."""
        return list(self.config.methods)

    def sample_ref(self) -> DataRef | None:
        """A reference every site resolves to some of its training data: before the first unit
        the model runs on a few of those examples, and its output must fit the task
        (`fedcare.studies.checks`). None: no such check."""
        return None

    # -- protocol ----------------------------------------------------------------------
    def protocol(self, runtime: StudyRuntime, write: Records, progress: Progress | None,
                 checkpoint: Checkpoint | None = None) -> StudyProtocol:
        """The protocol that runs this experiment on `runtime`'s clients."""
        return self.protocol_class(self, runtime, write, progress, checkpoint)

    # -- report (from a run directory alone) -------------------------------------------
    @classmethod
    def demo_config(cls) -> Path | None:
        """The experiment `fedcare demo <name>` runs: `demo.toml` in the study's own package
        (beside its modules; how a study from another package ships its demo), else
        `configs/<name>/demo.toml` in fedcare's (the built-in studies')."""
        spec = getattr(sys.modules.get(cls.__module__), "__spec__", None)
        own = [files(spec.parent) / "demo.toml"] if spec is not None and spec.parent else []
        for path in (*own, files("fedcare") / "configs" / cls.name / "demo.toml"):
            if path.is_file():
                return Path(str(path))
        return None

    @classmethod
    def build_report(cls, run_dir: Path, run_info: Mapping[str, Any], notes: list[str]) -> Path:
        """Write the tables, plots and report.html of a run from its metrics.jsonl; `run_info`
        is run.json, `notes` what reading it found. Returns report.html's path."""
        return importlib.import_module(cls.report_module).build_report(run_dir, run_info, notes)

    @classmethod
    def summary_markdown(cls, run_dir: Path) -> str:
        """The run's summary table in Markdown, printed after a run."""
        return importlib.import_module(cls.report_module).summary_markdown(run_dir)


class StudyProtocol(ABC):
    """What runs between loading the data and writing the report: the server's side of the
    study. It sees only `runtime` (its clients' summaries, federations) and writes records
    with `write`.

    Its work comes in units of its choice (a session, a round): it sets `units_total` in its
    constructor and calls `finish_unit` after each unit with the state continuing needs; a
    resumed run skips the units `finished` before and takes the state back from
    `self.checkpoint` (see `fedcare.studies.checkpoint`)."""

    def __init__(self, study: Study, runtime: StudyRuntime, write: Records, progress: Progress | None,
                 checkpoint: Checkpoint | NoCheckpoint | None = None):
        self.study = study
        self.config = study.config
        self.runtime = runtime
        self.write = write
        self.progress = progress or (lambda *_, **__: None)
        self.checkpoint = checkpoint or NoCheckpoint()
        self.units_total = 0
        self.units_done = self.checkpoint.units_done

    @abstractmethod
    def run(self) -> None:
        """The whole protocol, every seed and method."""

    def facts(self) -> dict:
        """What run.json says about this run besides the config (e.g. the test subjects)."""
        return {}

    def notes(self) -> list[str]:
        """What the report's notes must say about this run (e.g. a warning the config allowed)."""
        return []

    # -- helpers every protocol uses ---------------------------------------------------
    def finished(self, *key: Any) -> bool:
        """Whether unit `key` finished before this run was resumed."""
        return self.checkpoint.finished(*key)

    def finish_unit(self, description: str, *key: Any, **state: Any) -> None:
        """Unit `key` is done: commit it with the `state` continuing after it needs (None
        removes a piece), and show the progress."""
        self.checkpoint.units_total = self.units_total
        self.checkpoint.commit(*key, **state)
        self.advance(description)

    def advance(self, description: str) -> None:
        """One more unit done; `description` says which (e.g. "seed 5: FP(C) session 3")."""
        self.units_done += 1
        self.progress(description, self.units_done, self.units_total, task=UNITS)

    def record(self, kind: str, **fields: Any) -> None:
        self.write({"type": kind, "study": self.study.name, **fields})

    def stop_if_diverged(self, seed: int, method: str, units: list[tuple], train: Callable[[], None],
                         **point: Any) -> None:
        """Run one method's training (`train`, whose work is the units `units`). A loss that is
        not a number stops that method only: a "diverged" record says why, its units left are
        counted as finished (a resume does not train it again), and the other methods go on."""
        try:
            train()
        except TrainingDiverged as e:
            self.record("diverged", method=method, seed=seed, **point, reason=str(e))
            for key in units:
                if not self.finished(*key):
                    self.finish_unit(f"seed {seed}: {method} stopped (training diverged)", *key, federation=None)

    def evaluate_clients(self, federation: Federation, refs: Mapping[ClientId, Data], metrics: str, *, method: str,
                         seed: int, **point: Any) -> dict[ClientId, dict]:
        """Each client's own model on the data `refs` names, its `metrics` computed at the
        client; one "client_eval" record per client: method, seed, the point (e.g.
        session=3 or round=5), client and the metrics."""
        results = federation.evaluate(refs, metrics)
        for client, m in sorted(results.items()):
            self.record("client_eval", method=method, seed=seed, **point, client=client, **m)
        return results

"""A study's clients in this process: the in-process simulator's runtime.

Every client's `Site` is here; a federation's clients run on `LocalClients`, one after
another on a single working model. `local_data` is the study's in-process data for the steps
that pool clients' data (centralized pretraining, a Dirichlet split of one dataset): only
this runtime has it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import nn

from fedcare.algorithms.base import Algorithm, ClientId
from fedcare.algorithms.training import ClientData
from fedcare.runtime.clients import LocalClients
from fedcare.runtime.federation import Federation
from fedcare.runtime.lineage import Lineage
from fedcare.runtime.refs import DataRef
from fedcare.runtime.sites import Site


class LocalRuntime:
    lineage: Lineage | None = None  # set by the run sequence: every federation's aggregates are recorded

    def __init__(self, sites: Mapping[ClientId, Site], algorithm: Callable[[str], Algorithm], *, synthetic: bool,
                 local_data: Any = None, notes: Sequence[str] = ()):
        self.sites = dict(sites)
        self.algorithm = algorithm
        self.synthetic = synthetic
        self.local_data = local_data
        self._notes = list(notes)

    def summaries(self) -> dict[ClientId, dict]:
        return {c: self.sites[c].summary() for c in sorted(self.sites)}

    def federation(self, model: nn.Module, algorithm: str, seed: int, client_fraction: float = 1.0,
                   label: Mapping[str, Any] | None = None) -> Federation:
        """A federation of `algorithm` (the study's name for it) from `model`'s weights;
        `label` names it in the lineage (and in the records of a Flower run)."""
        algo = self.algorithm(algorithm)
        clients = LocalClients(model, algo.client, seed, resolve=lambda c, ref: self.sites[c].data(ref))
        federation = Federation(model, algo, seed, client_fraction=client_fraction, clients=clients)
        if self.lineage is not None:
            self.lineage.follow(federation, algorithm, label)
        return federation

    def pool(self, refs: Mapping[ClientId, DataRef]) -> ClientData:
        """The clients' data that `refs` name, in one (sorted client order): pooled steps only."""
        return ClientData.concat(self.sites[c].data(refs[c]) for c in sorted(refs))

    def start_facts(self) -> dict:
        return {}

    def facts(self) -> dict:
        return {}

    def notes(self) -> list[str]:
        return list(self._notes)

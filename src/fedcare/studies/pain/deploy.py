"""The pain study across sites on Flower: what a site does with its own data (`PainStudySite`)
and what the ServerApp runs the protocol with (`FlowerRuntime`).

Each site holds one subject (one client per patient, as in the thesis), read from its own
UNBC-McMaster copy; its frames never leave it. Methods that pool data (centralized training,
and the Group-1 pretraining behind the C and F inits, which draws one split across the whole
group) cannot run across sites and are refused before anything starts.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import torch

from fedcare.algorithms import Algorithm
from fedcare.config import ConfigError, PainExperiment
from fedcare.data.unbc import UnbcImageError, UnbcLayoutError
from fedcare.models.pain_cnn import PainCNN
from fedcare.runtime.flower.link import FlowerClients, FlowerRunError, SiteLink
from fedcare.runtime.flower.site import SiteError
from fedcare.runtime.simulation import Federation
from fedcare.studies.pain.cohort import PainDataError, PainSite, read_cohort
from fedcare.studies.pain.methods import Method, make_algorithm


def check_deployable(config: PainExperiment, name: str = "experiment") -> None:
    """Refuse, before any site is contacted, the methods that need pooled data."""
    pooled = [m for m in config.methods if Method.parse(m).algorithm == "centralized" or Method.parse(m).init != "N"]
    if pooled:
        raise ConfigError(
            f"{name}: methods {pooled} need pooled data (centralized training, or the Group-1 pretraining of the "
            f"C and F inits), which cannot run across sites; on Flower use RANDOM and F/FP/FL with init (N)")


def site_client(config: PainExperiment, site: str) -> int:
    """The subject a site holds: from [deployment.sites], else the site's name is the subject id."""
    sites = config.deployment.sites
    if sites:
        if site not in sites:
            raise SiteError(f"site {site!r} is not in the experiment's [deployment.sites] ({', '.join(sorted(sites))})")
        subject = sites[site]
    else:
        try:
            subject = int(site)
        except ValueError:
            raise SiteError(f"site {site!r}: the experiment has no [deployment.sites], so a site's name must be "
                            f"its subject id (one of {config.protocol.subjects})") from None
    if subject not in config.protocol.subjects:
        raise SiteError(f"site {site!r} holds subject {subject}, which is not in protocol.subjects "
                        f"{config.protocol.subjects}")
    return subject


class PainStudySite:
    """One site: its subject's sessions read from its own data directory."""

    def __init__(self, config: PainExperiment, site: str, data_dir: Path):
        if config.runtime.threads:  # torch's float sums depend on the thread count: the server's runs use it too
            torch.set_num_threads(config.runtime.threads)
        self.config = config
        self.client = site_client(config, site)
        if not Path(data_dir).is_dir():
            raise SiteError(f"site {site!r}: data directory {data_dir} does not exist")
        try:
            cohort = read_cohort(config, Path(data_dir), [self.client])
        except (PainDataError, UnbcLayoutError, UnbcImageError) as e:
            raise SiteError(f"site {site!r}: {e}") from None
        self.synthetic = cohort.synthetic
        self.site = PainSite(self.client, cohort.sessions[self.client], config.protocol.balance_per_class)

    def summary(self) -> dict:
        return self.site.summary()

    def data(self, ref: str):
        return self.site.data(ref)

    def new_model(self) -> PainCNN:
        return PainCNN(self.config.protocol.image_size)

    def algorithm(self, name: str) -> Algorithm:
        return make_algorithm(name, self.config)


class FlowerRuntime:
    """The pain study's clients at their sites, as `PainStudy` sees them."""

    def __init__(self, config: PainExperiment, link: SiteLink):
        self.config = config
        self.link = link
        self._namespaces = itertools.count()

    @property
    def synthetic(self) -> bool:
        return bool(self.link.synthetic) and all(self.link.synthetic.values())

    def summaries(self) -> dict[int, dict]:
        return self.link.summaries  # live: a site that joins late is taken from then on

    def federation(self, model: PainCNN, algorithm: str, seed: int, client_fraction: float = 1.0,
                   label: dict | None = None) -> Federation:
        clients = FlowerClients(self.link, f"federation-{next(self._namespaces)}", algorithm, seed, model, label)
        return Federation(model, make_algorithm(algorithm, self.config), seed, client_fraction=client_fraction,
                          clients=clients)

    def pretraining_sets(self, seed: int):
        raise FlowerRunError("Group-1 pretraining pools the pretraining subjects' data: it cannot run across sites")

    def facts(self) -> dict:
        """What run.json records about the deployment: sites and what each missed."""
        return {"runtime": "flower",
                "sites": {self.link.site_name(c): c for c in sorted(self.link.site_of)},
                "missed": self.link.missed}

    def notes(self) -> list[str]:
        """For the report: each site that missed something, and what (method, phase, round)."""
        by_site: dict[str, list[str]] = {}
        for m in self.link.missed:
            where = " ".join(str(m[k]) for k in ("method", "phase") if m.get(k) is not None)
            if m.get("round") is not None:
                where += f" round {m['round']}"
            by_site.setdefault(m["site"], []).append(f"{where} ({m['operation']})".strip())
        return [f"Site {site!r} did not answer: {'; '.join(what)}." for site, what in sorted(by_site.items())]

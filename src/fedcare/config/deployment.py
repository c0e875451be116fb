"""`[deployment]`: how an experiment runs across sites on Flower, and what a site's name may be."""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import Field, field_validator

from fedcare.config.base import Strict

# A site's name becomes file names (keys/<site>, keys/<site>.pub) and a SuperNode's identity:
# one pattern, checked wherever a name enters (config, `fedcare flower certs/site-key/supernode`).
SITE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def site_name_problem(name: str) -> str | None:
    """Why `name` cannot be a site's name (None: it can). A name ending in ".pub" would make site
    `a.pub`'s private key `keys/a.pub`, site `a`'s public key: no two sites' files may collide."""
    if not SITE_NAME.fullmatch(name):
        return (f"site name {name!r}: use 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit "
                "(a site's name becomes its key files' names)")
    if name.lower().endswith(".pub"):
        return (f"site name {name!r}: ends in '.pub', the suffix of a site's public key file (keys/<site>.pub); "
                "choose another name")
    return None


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

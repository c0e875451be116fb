"""A study's clients at their sites, as the protocol on the ServerApp sees them: the Flower
counterpart of `fedcare.runtime.local.LocalRuntime` (same methods, no pooled data)."""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from fedcare.algorithms.base import Algorithm, ClientId
from fedcare.algorithms.training import ClientData
from fedcare.compute import describe, same_arithmetic
from fedcare.runtime.federation import Federation
from fedcare.runtime.flower.link import FlowerClients, FlowerRunError, SiteLink, where
from fedcare.runtime.lineage import Lineage
from fedcare.runtime.preflight import Preflight
from fedcare.runtime.refs import DataRef


class FlowerRuntime:
    local_data = None  # the data stay at the sites: nothing can be pooled
    sites = None  # nor is any site here
    lineage: Lineage | None = None  # set by the run sequence: every federation's aggregates are recorded

    def __init__(self, link: SiteLink, algorithm: Callable[[str], Algorithm], run_key: str = "",
                 preflight: Preflight | None = None):
        self.link = link
        self.algorithm = algorithm
        self.run_key = run_key  # names the run's state folder at every site, kept across resumes
        self.preflight = preflight  # the sites' data summaries, checked before the first round
        self._namespaces = itertools.count()
        # federations are named per ServerApp process: a resumed run's new ones never take the
        # name of one its sites still hold (the continued one keeps its name: `FlowerClients.load_state_dict`)
        self._prefix = secrets.token_hex(4)

    @property
    def synthetic(self) -> bool:
        return bool(self.link.synthetic) and all(self.link.synthetic.values())

    def summaries(self) -> dict[ClientId, dict]:
        return self.link.summaries  # live: a site that joins late is taken from then on

    def federation(self, model: nn.Module, algorithm: str, seed: int, client_fraction: float = 1.0,
                   label: Mapping[str, Any] | None = None) -> Federation:
        clients = FlowerClients(self.link, f"federation-{self._prefix}-{next(self._namespaces)}", algorithm, seed, model, label)
        federation = Federation(model, self.algorithm(algorithm), seed, client_fraction=client_fraction, clients=clients)
        if self.lineage is not None:
            self.lineage.follow(federation, algorithm, label, why_missing=self._why_missing)
        return federation

    def _why_missing(self, client: ClientId) -> str:
        """Why a site asked to fit is not in a round's aggregate: its last fit's participation record."""
        name = self.link.site_name(client)
        last = next((r for r in reversed(self.link.participation) if r.get("operation") == "fit"), None)
        if last is not None and name in last["late"]:
            return f"late: no reply within round_timeout (late_sites = {last['policy']!r})"
        if last is not None and name in last["missing"]:
            return "missing: not connected, or gone (the SuperLink reported it unavailable)"
        return "no reply (it left during secure aggregation's exchanges)"

    def pool(self, refs: Mapping[ClientId, DataRef]) -> ClientData:
        raise FlowerRunError("pooling the clients' data cannot happen across sites")

    def start_facts(self) -> dict:
        """What run.json says from the start: a run across sites, and the key its sites' state is kept under."""
        return {"runtime": "flower", "flower_run": self.run_key}

    def facts(self) -> dict:
        """What run.json records about the deployment: sites, each site's arithmetic (torch,
        CPU kernels, threads), what each missed, and the SuperLink's faults the ServerApp survived."""
        return {"runtime": "flower",
                "sites": {self.link.site_name(c): c for c in sorted(self.link.site_of)},
                "site_compute": {self.link.site_name(c): f for c, f in sorted(self.link.compute.items())},
                "missed": self.link.missed, "refused": self.link.refused, **self._participation_facts(),
                # late_sites = "wait": the faults it waited out (a site gone and back, a reply asked for again)
                "rejoined": self.link.rejoined, "asked_again": self.link.asked_again,
                "coordinator_faults": self.link.grid.faults,  # the SuperLink's transient faults survived
                **({"preflight": self.preflight.as_json()} if self.preflight is not None else {})}

    def _participation_facts(self) -> dict:
        """Per site, of the rounds (fit and setup exchanges) it was asked to: how many it answered
        in, was late for, was missing from; `complete` is False when any listed site missed
        anything: the start (not running, failed, refused), a round, an evaluation (a dropped or
        late site never makes a complete run; with "wait", a late site that answered does)."""
        counts: dict[str, dict[str, int]] = {}
        for r in self.link.participation:
            for kind in ("answered", "late", "missing"):
                for site in r[kind]:
                    counts.setdefault(site, {"answered": 0, "late": 0, "missing": 0})[kind] += 1
        short = {site for r in self.link.participation for site in r["late"] + r["missing"]
                 if site not in r["answered"]}  # with "wait" a late site may have answered
        short |= {m["site"] for m in self.link.missed}
        return {"participation": counts, "incomplete_sites": sorted(short), "complete": not short}

    def notes(self) -> list[str]:
        """For the report: that the sites' data are synthetic; each site that missed something,
        what (method, phase, round) and why; each refused node; each site's participation."""
        notes = ["Data: synthetic copies generated by fedcare at every site, not real people."] if self.synthetic else []
        by_site: dict[str, list[dict]] = {}
        for m in self.link.missed:
            by_site.setdefault(m["site"], []).append(m)
        for site, missed in sorted(by_site.items()):
            notes += _missed_notes(site, missed)
        notes += [(f"A node claiming site {r['site']!r} was refused: {r['reason']}." if r["site"] != "?" else
                   f"Node {r['node']} was refused: {r['reason']}.") for r in self.link.refused]
        notes += self._participation_notes()
        return notes + (self.preflight.notes() if self.preflight is not None else []) + self._compute_notes()

    def _participation_notes(self) -> list[str]:
        """Per site that was ever late or missing: the rounds it answered, was late for, missed."""
        facts = self._participation_facts()
        notes = []
        for site, c in sorted(facts["participation"].items()):
            if c["late"] or c["missing"]:
                asked = len([r for r in self.link.participation if site in r["answered"] + r["late"] + r["missing"]])
                late = "; ".join(where(r) for r in self.link.participation if site in r["late"])
                notes.append(f"Participation of site {site!r}: answered in {c['answered']} of {asked} rounds, late in "
                             f"{c['late']} (late sites: {self.link.settings.late_sites}{': ' + late if late else ''}), "
                             f"missing from {c['missing']}.")
        if facts["incomplete_sites"]:
            notes.append(f"Not a complete federation: {', '.join(repr(s) for s in facts['incomplete_sites'])} did not "
                         "take part in everything (see above); the numbers are those of the sites that answered.")
        return notes

    def _compute_notes(self) -> list[str]:
        """A note when the sites do not all compute alike: then no single machine's simulator run
        gives this run's numbers bit for bit (they differ by float rounding)."""
        kinds: list[tuple[dict, list[str]]] = []  # one arithmetic, the sites that have it
        for cid, facts in sorted(self.link.compute.items()):
            for known, sites in kinds:
                if same_arithmetic(known, facts):
                    sites.append(self.link.site_name(cid))
                    break
            else:
                kinds.append((facts, [self.link.site_name(cid)]))
        if len(kinds) < 2:
            return []
        which = "; ".join(f"{', '.join(repr(s) for s in sites)}: {describe(facts)}" for facts, sites in kinds)
        return [(f"The sites do not compute alike ({which}): their float sums round differently, so a simulator run "
                 "of this experiment on one machine gives numbers that differ from these by rounding.")]


def _missed_notes(site: str, missed: list[dict]) -> list[str]:
    """One site's missed records as the report says them: from the start, then each exchange, and why."""
    notes = []
    start = [m for m in missed if m["operation"] == "start"]
    if start:  # a record of an older fedcare may give no reason
        notes.append(f"Site {site!r} was missing at the start: {start[-1].get('reason', 'not connected')}.")
    exchanges = [m for m in missed if m["operation"] != "start"]
    if exchanges:
        what = "; ".join(f"{where(m)} ({m['operation']})".strip() for m in exchanges)
        why = "; ".join(dict.fromkeys(m["reason"] for m in exchanges if m.get("reason")))  # each reason once
        notes.append(f"Site {site!r} did not answer: {what}" + (f". Why: {why}." if why else "."))
    return notes

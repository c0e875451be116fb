"""A site's own record of what its data touched, and its comparison with the coordinator's
lineage (`fedcare flower site-record STATE_DIR --lineage RUN_DIR`).

Each Flower site appends, in its own state folder, `run-<run key>/client-<id>.record.jsonl`:
one hash-chained entry (`fedcare.runtime.hashchain`) per operation that trained on its data,
computed at the site in the same canonical way as the coordinator's lineage
(`fedcare.runtime.digest.message_digest`):

- "fit": the digest of the global model it received (`received`; secure aggregation's own
  entries in the message are left out, they are not the model), of the update it sent
  (`sent`; under secure aggregation the masked vector) and its example count;
- "after_aggregation": the digest of the round's aggregate it received to fine-tune its own
  layers on (PFDL, FedRep);

each with `code_sha256`, the digest of the fedcare code the site ran
(`fedcare.runtime.digest.code_digest`).

`compare` reads it beside the coordinator's lineage and says, for the site's client: which
aggregates its updates went into (and which final models descend from them), which updates
the coordinator left out and why, and every disagreement: a model the site received that the
lineage does not list, an update the lineage attributes to the site that the site never sent,
or another update than the one it sent. Under secure aggregation the coordinator never sees
an update: the lineage lists the site in the sum, and the comparison can check only that it
took part from the model it received.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedcare.algorithms.base import NUM_EXAMPLES, ClientId
from fedcare.algorithms.messages import Message
from fedcare.runtime.clients import AfterAggregation, Fit
from fedcare.runtime.digest import code_digest, message_digest
from fedcare.runtime.hashchain import ChainWriter
from fedcare.runtime.lineage_verify import describe

RECORD_SUFFIX = ".record.jsonl"
# secure aggregation's protocol entries in a fit message (`fedcare.privacy.secagg.WIRE`, which
# this layer cannot import; a test holds them equal): the keys and shares, not the model
PROTOCOL_PREFIX = "secagg/"


def model_part(message: Message) -> Message:
    """The message without secure aggregation's protocol entries: the model the site received."""
    return Message({k: v for k, v in message.tensors.items() if not k.startswith(PROTOCOL_PREFIX)},
                   {k: v for k, v in message.scalars.items() if not k.startswith(PROTOCOL_PREFIX)})


def record_file(state_file: Path) -> Path:
    """Beside the site's state file `client-<id>.pt`: `client-<id>.record.jsonl`."""
    return Path(state_file).with_suffix(RECORD_SUFFIX)


def client_of(path: Path) -> str:
    """The client a record file is of, from its name (an empty record has no entry to say it)."""
    return Path(path).name.removeprefix("client-").removesuffix(RECORD_SUFFIX)


class SiteRecord:
    """The site `site` (its client `client`) appends one entry per fit and after-aggregation.
    The file exists from the site's first message of the run: a site that trained on nothing
    has an empty record, which says so."""

    def __init__(self, path: Path, site: str, client: ClientId):
        self.path = Path(path)
        self.site = site
        self.client = str(client)
        self._writer: ChainWriter | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch(mode=0o600, exist_ok=True)

    def note(self, namespace: str | None, algorithm: str, seed: int, op: Fit | AfterAggregation,
             reply: Any) -> None:
        """What operation `op` of federation `namespace` received and, for a fit, sent (`reply`)."""
        entry = {"type": "fit" if isinstance(op, Fit) else "after_aggregation", "site": self.site,
                 "client": self.client, "namespace": namespace, "algorithm": algorithm, "seed": seed,
                 "phase": op.phase, "round": op.round, "received": message_digest(model_part(op.message)),
                 "code_sha256": code_digest()}
        if isinstance(op, Fit):
            entry |= {"sent": message_digest(reply), "examples": int(reply.scalars.get(NUM_EXAMPLES, 0))}
        if self._writer is None:  # a record cut mid-line by a crash loses that line, not the site's run
            self._writer = ChainWriter(self.path, private=True, drop_cut_line=True)
        self._writer.append([entry])

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


@dataclass
class Comparison:
    """A site's record against the coordinator's lineage, for one client."""

    client: str
    fits: int = 0  # fit entries in the site's record
    used: list[tuple[dict, dict]] = field(default_factory=list)  # (entry, aggregate): its update is in it
    hidden: list[tuple[dict, dict]] = field(default_factory=list)  # secure aggregation: in the sum
    left_out: list[tuple[dict, str]] = field(default_factory=list)  # (entry, why) its update is in no aggregate
    problems: list[str] = field(default_factory=list)  # disagreements
    aggregates: list[dict] = field(default_factory=list)  # every aggregate the lineage says holds its data
    models: list[dict] = field(default_factory=list)  # the saved models descending from those
    site_code: set[str] = field(default_factory=set)  # the fedcare code the site ran (its digests)
    coordinator_code: set[str] = field(default_factory=set)  # and the coordinator

    @property
    def agrees(self) -> bool:
        return not self.problems


def _where(entry: dict) -> str:
    return f"{entry['type']} {entry['algorithm']} {entry['phase']} round {entry['round']}"


def compare(entries: list[dict], lineage: list[dict], client: ClientId) -> Comparison:
    """The site's record `entries` against the lineage's records, for `client` (see the module docstring)."""
    c = str(client)
    result = Comparison(c)
    aggregates = [r for r in lineage if r.get("type") == "aggregate"]
    known = {d for r in aggregates for d in (r["parent"], r["digest"], *r["received"].values(), *r["after"].values())}
    asked = defaultdict(list)  # (phase, round, the model this client was sent) -> aggregates it was asked for
    for r in aggregates:
        if c in r["clients"] or c in r["dropped"]:
            asked[(r["phase"], r["round"], r["received"].get(c, r["parent"]))].append(r)
    mine = [e for e in entries if e.get("client") == c]
    fits = [e for e in mine if e["type"] == "fit"]
    result.fits = len(fits)
    result.site_code = {e["code_sha256"] for e in mine if e.get("code_sha256")}
    result.coordinator_code = {r["code_sha256"] for r in aggregates if r.get("code_sha256")}
    for e in mine:
        if e["received"] not in known:
            result.problems.append(f"{_where(e)}: the site received model {e['received'][:12]}, which the "
                                   "coordinator's lineage does not list")
    for e in fits:
        candidates = asked[(e["phase"], e["round"], e["received"])]
        holding = [r for r in candidates if c in r["clients"]]
        secure = [r for r in holding if "secure_aggregation" in r]
        used = [r for r in holding if r["clients"][c].get("update") == e["sent"]]
        if used:
            result.used.append((e, used[0]))
        elif secure:
            result.hidden.append((e, secure[0]))
        elif holding:
            result.problems.append(f"{_where(e)}: the lineage's {describe(holding[0])} holds update "
                                   f"{holding[0]['clients'][c]['update'][:12]} from this site, which sent "
                                   f"{e['sent'][:12]}")
        else:
            why = next((r["dropped"][c] for r in candidates if c in r["dropped"]),
                       "in no aggregate of the coordinator's lineage (it answered too late, or the run stopped "
                       "before that unit finished)")
            result.left_out.append((e, why))
    sent = {e["sent"] for e in fits}
    took_part = {(e["phase"], e["round"], e["received"]) for e in fits}
    for r in aggregates:
        if c not in r["clients"]:
            continue
        result.aggregates.append(r)
        if "secure_aggregation" in r:
            if (r["phase"], r["round"], r["received"].get(c, r["parent"])) not in took_part:
                result.problems.append(f"the lineage's {describe(r)} counts this site in its secure sum, but the "
                                       "site has no fit of that round from that model")
        elif r["clients"][c]["update"] not in sent:
            result.problems.append(f"the lineage's {describe(r)} holds update {r['clients'][c]['update'][:12]} "
                                   "from this site, which it never sent")
    result.models = _descendants(lineage, result.aggregates)
    return result


def _descendants(lineage: list[dict], aggregates: list[dict]) -> list[dict]:
    """The saved models (the last record naming each file) descending from any of `aggregates`."""
    parent_of: dict[tuple[str, str], str] = {}
    for r in lineage:
        if r.get("type") == "aggregate":
            parent_of.setdefault((r["chain"], r["digest"]), r["parent"])
    touched = {(r["chain"], r["digest"]) for r in aggregates}
    saved = {r["file"]: r for r in lineage if r.get("type") == "model"}
    found = []
    for model in saved.values():
        key, seen = (model["chain"], model["digest"]), set()
        while key in parent_of and key not in touched and key not in seen:
            seen.add(key)
            key = (key[0], parent_of[key])
        if key in touched:
            found.append(model)
    return found

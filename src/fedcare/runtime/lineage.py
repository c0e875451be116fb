"""The lineage of a run's models: one record per aggregation, and the global models it saved.

Every study's aggregation passes `Federation.run_round`, in the simulator and in Flower's
ServerApp alike. A runtime that holds a `Lineage` (the run sequence gives every run one:
`fedcare.studies.run`) lets it `follow` each federation it builds; the federation then reports
each aggregation to its `Chain`. An "aggregate" record says:

- where: the federation (`chain`: a digest of its algorithm, seed, label and initial model;
  `algorithm`, `seed`, `label`: the protocol's method, seed and model), `phase`, `round`, and
  the protocol's `unit` it belongs to;
- what: `parent`, the digest of the global message the round started from (a federation's
  first round: its initial model's), and `digest`, that of the global message it made
  (`fedcare.runtime.digest.message_digest`); `received` / `after`: a client's own message
  before / after the round where it is not the global one (a per-client payload);
- who: `clients`, those whose replies went into it, with their example counts and the digest
  of each update; `dropped`, those asked who are not in it, with the reason (out of DP
  budget, a reply rejected, late or missing on Flower); under secure aggregation the server
  sees only the sum, so `clients` names the clients in it and `secure_aggregation` gives their
  total examples and the sum's digest, not each update;
- under what: `epsilon` (each client's DP-SGD or client-level-DP epsilon spent so far), `rule`
  (the robust rule, null without `[robustness]`) and `attackers` (simulated attackers among
  the contributors), `config_sha256`, `fedcare` (the version) and `code_sha256` (the fedcare
  code that ran; `study_code_sha256` for a study from another package).

Records wait in memory until their unit is committed (`commit`, which the checkpoint calls
before it writes): they are written with the unit's key, followed by a "model" record for each
federation that aggregated in the unit, whose global message is saved then as
`models/<method>_..._seed<seed>-<chain>.safetensors` (tensors, with the message's digest and
scalars in its metadata). A later unit of the same federation replaces the file: it ends
holding that federation's last global model, and the last "model" record naming a file is
the one it must match. The checkpoint keeps lineage.jsonl's size, and a resume cuts the file
back to it, so a resumed run's lineage ends as an uninterrupted run's. The records are
hash-chained (`fedcare.runtime.hashchain`); `seal` gives the head run.json keeps at the end.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch

from fedcare import __version__
from fedcare.algorithms.base import DP_EPSILON, NUM_EXAMPLES, ClientId
from fedcare.algorithms.messages import Message
from fedcare.files import atomic_write_bytes
from fedcare.runfiles import LINEAGE_FILE, MODELS_DIR
from fedcare.runtime.digest import code_digest, message_digest
from fedcare.runtime.hashchain import ChainWriter, strict

# a model file's metadata: one entry (safetensors writes its metadata map in no fixed order, so
# two entries would give files of the same model different bytes), JSON of the message's digest
# and its scalars, so the file holds the whole message
METADATA_KEY = "fedcare"
# the round info's per-client epsilons (`Federation.run_round`)
EPSILONS = {"dp_sgd": DP_EPSILON + "_clients", "client_dp": "client_dp_epsilon_clients"}


@dataclass(frozen=True)
class Aggregation:
    """What one aggregation saw and made, as `Federation.run_round` reports it."""

    phase: str
    round: int
    previous: Message  # the global message the round started from
    parent: str  # its digest, taken before the server half ran (it may update tensors in place)
    sent: Mapping[ClientId, Message]  # what each client asked to fit was sent
    replies: Mapping[ClientId, Message]  # what the server half aggregated (secure aggregation: the one sum)
    answered: Sequence[ClientId]  # the clients whose replies are in it
    secure: bool
    skipped: Sequence[ClientId]  # DP-SGD: no step left in the budget (replied without training)
    over_budget: Sequence[ClientId]  # client-level DP: the next round would cross the budget (not asked)
    info: Mapping[str, Any]  # the round's info: rejected replies, epsilons


def model_name(algorithm: str, seed: int, label: Mapping[str, Any]) -> str:
    """A model file's readable name: the method (else the algorithm), the label's other parts, the seed."""
    parts = [str(label.get("method") or algorithm)]
    parts += [f"{k}-{v}" for k, v in sorted(label.items()) if k not in ("method", "seed")]
    parts.append(f"seed{seed}")
    return "_".join(re.sub(r"[^A-Za-z0-9.+-]+", "-", p).strip("-.") or "x" for p in parts)


def model_bytes(message: Message, digest: str) -> bytes:
    """The message as a safetensors file: its tensors on the host, its digest and scalars as metadata."""
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in message.tensors.items()}
    meta = json.dumps({"digest": digest, "scalars": message.scalars}, sort_keys=True)
    return safetensors.torch.save(tensors, metadata={METADATA_KEY: meta})


class Lineage:
    """lineage.jsonl and models/ of the run directory `run_dir`; `truncate_to` (a resume: the
    checkpoint's offset) drops what an unfinished unit wrote. `robustness`: the experiment's
    `[robustness]` (rule, attack) as plain data, or None."""

    def __init__(self, run_dir: Path, *, config_sha256: str, robustness: Mapping[str, Any] | None = None,
                 study_code: str | None = None, truncate_to: int | None = None):
        self.run_dir = Path(run_dir)
        self.writer = ChainWriter(self.run_dir / LINEAGE_FILE, truncate_to)
        self.robustness = dict(robustness) if robustness else None
        self.run_fields = {"config_sha256": config_sha256, "fedcare": __version__, "code_sha256": code_digest(),
                           **({"study_code_sha256": study_code} if study_code else {})}
        self.pending: list[dict] = []  # aggregate records of the unit under way
        self.touched: dict[str, Chain] = {}  # the federations that aggregated in it, in order

    def follow(self, federation, algorithm: str, label: Mapping[str, Any] | None = None,
               why_missing: Callable[[ClientId], str] | None = None) -> None:
        """Record `federation`'s aggregations (it was built from `algorithm`, the study's name for
        it, with `label`: the protocol's method, seed, model). `why_missing(client)`: why an asked
        client did not answer (on Flower: late or missing)."""
        federation.lineage = Chain(self, federation, algorithm, label or {}, why_missing)

    def commit(self, unit: tuple) -> int:
        """The unit `unit` is finished: write its records and save its federations' global
        models; returns lineage.jsonl's size (durable), for the checkpoint."""
        records = [*self.pending, *(chain.save_model() for chain in self.touched.values())]
        self.pending, self.touched = [], {}
        return self.writer.append({**r, "unit": list(unit) if unit is not None else None} for r in records)

    def flush(self) -> None:
        """Write what no unit committed (aggregations after the protocol's last unit), unit null."""
        if self.pending or self.touched:
            self.commit(None)

    def seal(self) -> dict:
        """What run.json keeps of the finished lineage: how many records, the last one's hash, the model files."""
        models = sorted((self.run_dir / MODELS_DIR).glob("*.safetensors"))
        return {"records": self.writer.count, "head": self.writer.head, "models": len(models)}

    def close(self) -> None:
        self.writer.close()


class Chain:
    """One federation's line in the lineage (`Federation.lineage`)."""

    def __init__(self, lineage: Lineage, federation, algorithm: str, label: Mapping[str, Any],
                 why_missing: Callable[[ClientId], str] | None):
        self.lineage = lineage
        self.federation = federation
        self.why_missing = why_missing
        seed = federation.seed
        initial = message_digest(federation.global_message)
        named = json.dumps(strict([algorithm, seed, dict(label), initial]), sort_keys=True, default=str)
        self.id = hashlib.sha256(named.encode()).hexdigest()[:16]
        self.fields = {"chain": self.id, "algorithm": algorithm, "seed": seed, "label": strict(dict(label))}
        self.file = f"{MODELS_DIR}/{model_name(algorithm, seed, label)}-{self.id[:8]}.safetensors"

    def aggregated(self, a: Aggregation) -> None:
        self.lineage.pending.append(self.record(a))
        self.lineage.touched[self.id] = self

    def record(self, a: Aggregation) -> dict:
        digests = {id(a.previous): a.parent}  # messages shared by many clients are hashed once

        def digest_of(message: Message) -> str:
            if id(message) not in digests:
                digests[id(message)] = message_digest(message)
            return digests[id(message)]

        made = digest_of(self.federation.global_message)
        record: dict[str, Any] = {"type": "aggregate", **self.fields, "phase": a.phase, "round": a.round,
                                  "parent": a.parent, "digest": made}
        if a.secure:  # the server holds only the survivors' sum
            record["clients"] = {str(c): {} for c in a.answered}
            total = next(iter(a.replies.values()), None)
            record["secure_aggregation"] = ({"examples": int(total.scalars.get(NUM_EXAMPLES, 0)), "sum": digest_of(total)}
                                            if total is not None else {"examples": 0})
        else:
            record["clients"] = {str(c): {"examples": int(m.scalars[NUM_EXAMPLES]), "update": digest_of(m)}
                                 for c, m in a.replies.items()}
        record["received"] = {str(c): d for c, m in a.sent.items() if (d := digest_of(m)) != a.parent}
        record["after"] = {str(c): d for c in a.answered if (d := digest_of(self.federation.message_for(c))) != made}
        record["dropped"] = self.dropped(a)
        record["epsilon"] = {kind: a.info[key] for kind, key in EPSILONS.items() if key in a.info}
        robustness = self.lineage.robustness or {}
        record["rule"] = robustness.get("rule")
        record["attackers"] = sorted(c for c in robustness.get("attackers", []) if c in record["clients"])
        return {**record, **self.lineage.run_fields}

    def dropped(self, a: Aggregation) -> dict[str, str]:
        """Each client asked (or out of budget) whose reply is not in the aggregate, and why."""
        why = {str(c): "DP-SGD budget spent: it replied without training" for c in a.skipped}
        why |= {str(c): "client-level DP budget: its next round would cross it, so it was not asked"
                for c in a.over_budget}
        why |= {str(c): f"reply rejected: {reason}" for c, reason in (a.info.get("rejected") or {}).items()}
        answered = {str(c) for c in a.answered}
        for c in a.sent:
            if str(c) not in answered and str(c) not in why:
                why[str(c)] = self.why_missing(c) if self.why_missing is not None else "no reply"
        return why

    def save_model(self) -> dict:
        """Save the federation's global message now; its "model" record."""
        message = self.federation.global_message
        digest = message_digest(message)
        data = model_bytes(message, digest)
        atomic_write_bytes(self.lineage.run_dir / self.file, data)
        return {"type": "model", "chain": self.id, "file": self.file, "digest": digest,
                "sha256": hashlib.sha256(data).hexdigest(), **self.lineage.run_fields}

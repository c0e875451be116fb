"""`[privacy.audit]` for studies whose clients hold a training set and a held-out set: the
loss attack of membership inference (`fedcare.privacy.audit`) on every training client, once a
federation has finished its last round (the models the clients keep). The pain study has its
own (`fedcare.studies.pain.audit`: matched sessions and a server view); the surgical and face
studies use this one.

Members are a client's training examples, non-members its held-out ones, at most
`max_per_set` of each (drawn from (run seed, "membership-audit", client)). Views:
- own: the client's personal model (what a breach of its device exposes);
- peer: the next training client's personal model (FedAvg: the global model), left out when
  the study says a peer's model cannot score the victim's examples (a local ArcFace head: its
  rows are the peer's identities).
One `membership` record per (client, view), as the pain study's, so `fedcare.privacy.report`'s
membership table reads them.

In this process only (the peer view needs one client's model and another's data in one place).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from fedcare.algorithms.training import ClientData
from fedcare.config import ConfigError, MembershipAudit
from fedcare.privacy.audit import attack_scores
from fedcare.runtime.federation import Federation
from fedcare.seeding import numpy_rng

MEMBERSHIP = "membership"  # the record type in metrics.jsonl
Losses = Callable[[nn.Module, ClientData], np.ndarray]  # per-example losses of a model on a set


Sets = Callable[[object], tuple[ClientData, ClientData]]  # a client's (members, non-members)


class ClientMembershipAudit:
    """`run(federation, ...)` after a federation's last round."""

    def __init__(self, protocol, options: MembershipAudit):
        if protocol.runtime.sites is None:
            raise ConfigError("privacy.audit runs in this process only (it needs every client's model and data "
                              "in one place); remove [privacy.audit] to run across sites")
        self.protocol, self.options = protocol, options

    def run(self, federation: Federation, clients: list, method: str, seed: int, sets: Sets, losses: Losses,
            peer_view: bool = True, **labels) -> None:
        """Attack every client of `clients` (those that trained) from its own and a peer's model:
        `sets(client)` gives its (members, non-members), `losses(model, data)` the per-example
        losses the attack ranks by."""
        chosen = {c: self.subset(sets(c), c, seed) for c in clients}
        chosen = {c: s for c, s in chosen.items() if len(s[0]) and len(s[1])}
        order = sorted(chosen)
        for i, c in enumerate(order):
            peer = order[(i + 1) % len(order)]
            for view in ("own", "peer"):
                if view == "peer" and (not peer_view or peer == c):
                    continue
                model = federation.personal_model(c if view == "own" else peer)  # scored before the next load
                result = attack_scores(*(losses(model, data) for data in chosen[c]))
                extra = {"peer": peer} if view == "peer" else {}
                self.protocol.record(MEMBERSHIP, method=method, seed=seed, view=view, client=c, **extra, **labels,
                                     **result.as_dict())

    def subset(self, sets: tuple[ClientData, ClientData], client, seed: int) -> tuple[ClientData, ClientData]:
        """At most `max_per_set` members and at most as many non-members, drawn per (seed, client)."""
        members, non_members = sets
        rng = numpy_rng(seed, "membership-audit", client)

        def draw(data: ClientData) -> ClientData:
            if len(data) <= self.options.max_per_set:
                return data
            keep = torch.from_numpy(np.sort(rng.choice(len(data), self.options.max_per_set, replace=False)))
            return ClientData(data.x[keep], data.y[keep])

        return draw(members), draw(non_members)


def membership_caption(members: str, non_members: str, views: str) -> str:
    """The membership table's caption for a study using this audit."""
    return ("The loss attack (Yeom et al. 2018; fedcare.privacy.audit) calls an example a member when the model's "
            "loss on it is low: a lower bound on what an attacker can learn (LiRA, stronger, runs in the privacy "
            f"audit study only), never a proof of privacy. AUC 0.5 = the attacker guesses. Per client that trained: "
            f"members = {members}; non-members = {non_members}; at most privacy.audit.max_per_set of each. AUC: mean "
            "over clients ('subjects') and seeds ± its standard error across them; 'SE per subject': the mean "
            "Hanley-McNeil SE of one client's AUC. TPR at FPR 1% is the TPR at no false positive when a client has "
            f"under 100 non-members. Views: {views}; server: not audited in this study (n/a). epsilon: the largest "
            "DP-SGD epsilon spent (inf: no DP-SGD). See docs/privacy.md.")


def with_membership(run_dir, caption: str, tables: dict, figures: dict | None = None) -> tuple[dict, dict]:
    """A study's tables (and, when `figures` is given, its plots) with the membership audit's
    table and AUC plot added when [privacy.audit] ran; unchanged otherwise. No plot is drawn
    when no figures are asked for (a printed summary)."""
    from fedcare.privacy.report import membership_plot, membership_table  # the report stack: not at a site
    from fedcare.runfiles import read_run_records

    records, _ = read_run_records(run_dir)
    membership = membership_table(records, caption)
    if membership is None:
        return tables, figures or {}
    tables = {**tables, "membership": membership}
    return tables, ({**figures, "membership_auc": membership_plot(records)} if figures is not None else {})


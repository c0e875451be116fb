"""`[privacy.audit]` on the pain study: the loss attack of membership inference
(`fedcare.privacy.audit`) on every subject, from what three parties hold, once a (seed, method)
federation has finished its last training phase (the models the clients keep).

Why at the end and not after each session: it audits the models the clients go on using, and
it costs one attack per subject and view instead of one per session.

**Members and non-members** (`membership_items`), per subject: members are the distinct
(frame, variant) items of its last balanced training set (`TrainingSet(seed, last)`: what its
final model last trained on). Non-members are items of the *same sessions* whose frame had no
variant drawn into any of the subject's training sets of this seed (a rotated or flipped copy
of a member would be a member in all but name). Both are matched per (session, label): the
same number of members and non-members in each session and class, because the synthetic
sessions differ in appearance and the balanced set over-samples pain frames, so an unmatched
comparison would measure session or class rather than membership. Not chosen: the held-out
next session as non-members (a different session: the AUC would be inflated by its
appearance). Non-members were validation data for early stopping in an earlier phase (a
model choice on their mean loss, not a gradient step).

**Views** (the model the attacker scores the victim's items with):
- own: the subject's personal model (what a breach of its device exposes);
- peer: the next subject's personal model (FedAvg: the global model; FP/FBN: the shared layers
  with the peer's own private ones; FL: a model that never saw the victim);
- server: the shared tensors only. FedAvg: the global model. A split model (FP, FBN) has no
  private part at the server, so the server completes it the way it could: from the initial
  model, it fits the private tensors (FP: the dense head; FBN: the BatchNorm layers) for
  `server_epochs` on the data it legitimately holds, the pretraining subjects' frames (Group
  1, which the C and F inits already pool at the server), the shared tensors frozen. FL: n/a
  (the server receives nothing); n/a too when the experiment has no pretraining subject
  outside the test subjects.

In this process only: the peer view needs one client's model and another's frames in one
place, which on Flower would move one of them. `PainStudy.check_deployable` refuses it there.
"""

from __future__ import annotations

import numpy as np
from torch import nn

from fedcare.algorithms.split import load_tensors
from fedcare.algorithms.training import ClientData, TrainSettings, train_epochs
from fedcare.config import ConfigError, MembershipAudit
from fedcare.privacy.audit import attack_scores, per_example_losses
from fedcare.runtime.federation import Federation
from fedcare.seeding import numpy_rng, torch_generator
from fedcare.studies.pain.cohort import (
    PainSite,
    balance_items,
    items_data,
    pretraining_sets,
    session_items,
)
from fedcare.tasks import BINARY

VIEWS = ("own", "peer", "server")
MEMBERSHIP = "membership"  # the record type in metrics.jsonl


def membership_items(site: PainSite, seed: int, upto: int, max_per_set: int) -> tuple[np.ndarray, np.ndarray]:
    """(members, non-members) of one subject as (session, frame, variant) rows, equally many
    per (session, label) and at most `max_per_set` each; see the module's docstring. `upto`
    is the last training set's session (`PainSite.data(TrainingSet(seed, upto))`)."""
    sessions, subject, per_class = site.sessions, site.subject, site.per_class

    def drawn(u: int) -> np.ndarray | None:  # exactly the draw PainSite.data made for TrainingSet(seed, u)
        last = min(u, len(sessions) - 1)
        return balance_items(sessions, last, per_class, numpy_rng(seed, "balance", subject, last))

    final = drawn(upto)
    if final is None:
        return np.zeros((0, 3), np.int64), np.zeros((0, 3), np.int64)
    members = np.unique(final, axis=0)
    touched = {(s, f) for u in range(upto + 1) if (d := drawn(u)) is not None for s, f, _ in d}
    candidates = np.concatenate([session_items(s, len(sessions[s].labels)) for s in np.unique(members[:, 0])])
    outside = candidates[[(s, f) not in touched for s, f, _ in candidates]]
    rng = numpy_rng(seed, "membership-audit", subject)
    chosen_m, chosen_n = [], []
    for s in np.unique(members[:, 0]):
        in_m, in_n = members[members[:, 0] == s], outside[outside[:, 0] == s]
        for label in (0, 1):
            m = in_m[sessions[s].labels[in_m[:, 1]] == label]
            n = in_n[sessions[s].labels[in_n[:, 1]] == label]
            k = min(len(m), len(n))
            if k:
                chosen_m.append(m[rng.choice(len(m), k, replace=False)])
                chosen_n.append(n[rng.choice(len(n), k, replace=False)])
    if not chosen_m:
        return np.zeros((0, 3), np.int64), np.zeros((0, 3), np.int64)
    pairs_m, pairs_n = np.concatenate(chosen_m), np.concatenate(chosen_n)
    if len(pairs_m) > max_per_set:  # drop whole pairs: the strata stay matched
        keep = np.sort(rng.choice(len(pairs_m), max_per_set, replace=False))
        pairs_m, pairs_n = pairs_m[keep], pairs_n[keep]
    return pairs_m, pairs_n


class PainMembershipAudit:
    """The audit of one run: `run(federation, ...)` after a federation's last training phase."""

    def __init__(self, protocol, options: MembershipAudit):
        sites = protocol.runtime.sites
        if sites is None or protocol.runtime.local_data is None:
            raise ConfigError("privacy.audit runs in this process only (it needs every client's model and frames "
                              "in one place); remove [privacy.audit] to run across sites")
        self.protocol = protocol
        self.options = options
        self.sites: dict[int, PainSite] = sites
        p = protocol.config.protocol
        self.server_subjects = [k for k in p.pretrain_subjects if k not in p.subjects]

    def run(self, federation: Federation, method: str, seed: int, upto: int, init_state: dict) -> None:
        """Attack every subject with a training set up to `upto` from each view; one
        `membership` record per (subject, view)."""
        subjects = [k for k in self.protocol.training_sets(seed, upto) if k in self.sites]
        sets = {k: membership_items(self.sites[k], seed, upto, self.options.max_per_set) for k in subjects}
        subjects = [k for k in subjects if len(sets[k][0])]
        server = self.server_model(federation, seed, init_state)
        for i, k in enumerate(subjects):
            members, non_members = (items_data(self.sites[k].sessions, rows) for rows in sets[k])
            peer = subjects[(i + 1) % len(subjects)]
            for view in VIEWS:
                if view == "server":
                    model = server
                else:  # personal_model loads into the federation's working model: scored before the next load
                    model = federation.personal_model(k if view == "own" else peer)
                if model is None or (view == "peer" and peer == k):
                    continue
                result = attack_scores(per_example_losses(model, members, BINARY),
                                       per_example_losses(model, non_members, BINARY))
                extra = {"peer": peer} if view == "peer" else {}
                self.protocol.record(MEMBERSHIP, method=method, seed=seed, view=view, client=k, **extra,
                                     **result.as_dict())

    def server_model(self, federation: Federation, seed: int, init_state: dict) -> nn.Module | None:
        """What the server can score with: the shared tensors, a split model's private part
        fitted on the server's own frames; None when it has nothing (see the module)."""
        split = federation.algorithm.client.split
        model = self.protocol.new_model(init_state)
        shared = federation.global_message.tensors
        if not split.shared_keys(model):
            return None  # FL: nothing reaches the server
        load_tensors(model, shared)
        private = set(split.private_keys(model))
        if not private:
            return model  # FedAvg: the global model is the whole model
        data = self.server_data(seed)
        if data is None:
            return None
        params = [p for name, p in model.named_parameters() if name in private]
        t = self.protocol.config.train
        settings = TrainSettings(lr=t.lr, batch_size=t.batch_size, local_epochs=self.options.server_epochs,
                                 task=BINARY, precision=self.protocol.study.compute.precision)
        model.train()
        train_epochs(model, params, data, settings, generator=torch_generator(seed, "membership-audit", "server"))
        load_tensors(model, shared)  # shared BatchNorm statistics moved in train mode: back to what was sent
        return model

    def server_data(self, seed: int) -> ClientData | None:
        """The pretraining subjects' balanced training frames, as the C/F pretraining draws them."""
        if not self.server_subjects:
            return None
        p = self.protocol.config.protocol
        train, _ = pretraining_sets(self.protocol.runtime.local_data, self.server_subjects, p.pretrain_val_fraction,
                                    numpy_rng(seed, "pretrain-split"))
        return ClientData.concat(train[k] for k in sorted(train)) if train else None

"""The Hess protocol (reference note §3-§4): per seed and method, `rounds` federated rounds on
the training clients (every client not in `protocol.unseen`), then every client, unseen ones
included, evaluates the final model on `paths` evaluation paths: TAR@FAR of the global model
(with the client's own head) and of the model tuned on its training split, on the same pairs.

Units: one round of a method of a seed (the last one includes the evaluation); `fedcare
resume` continues after the last finished one. Every method of a seed starts from the same
random backbone (derived from the seed); a global head has one row per identity over all
clients, a local head is drawn per client (`FaceClient`)."""

from __future__ import annotations

import torch
from torch import nn

from fedcare.algorithms.training import ClientData
from fedcare.seeding import derive_seed
from fedcare.studies.base import StudyProtocol
from fedcare.studies.facerec.data import Evaluation, Training
from fedcare.studies.facerec.methods import labels_of

METRICS = "tuned-verification"


class FacerecProtocol(StudyProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.units_total = len(self.config.seeds) * len(self.config.methods) * self.config.train.rounds
        self.audit = None
        privacy = self.config.privacy
        # [privacy.audit]'s membership audit: after each method's last round
        if privacy is not None and privacy.audit is not None and privacy.audit.membership:
            from fedcare.privacy.client_audit import ClientMembershipAudit

            self.audit = ClientMembershipAudit(self, privacy.audit)

    def training_clients(self) -> list[int]:
        unseen = set(self.config.protocol.unseen)
        return [c for c, s in sorted(self.runtime.summaries().items()) if c not in unseen and s["train"] >= 2]

    def facts(self) -> dict:
        summaries = self.runtime.summaries()
        return {"partition": self.config.data.partition, "clients": len(summaries),
                "unseen": [c for c in self.config.protocol.unseen if c in summaries],
                "training_clients": self.training_clients(), "rounds": self.config.train.rounds,
                "impostors": self.config.protocol.impostors}

    def membership_sets(self, labels: str):
        """[privacy.audit]'s members (a client's training crops) and non-members (its test crops
        of the same identities), labelled for the method's head."""
        def sets(client: int):
            site = self.runtime.sites[client]
            test = site.data(Evaluation(labels, 1))
            return site.data(Training(labels)), ClientData(test.x, test.y)

        return sets

    def global_classes(self) -> int:
        return max(s["global_classes"] for s in self.runtime.summaries().values())

    def new_model(self, seed: int, method: str) -> nn.Module:
        """The seed's initial model: the backbone from (seed, "init") for every method; a
        global head over every client's identities, or an empty one for local heads (each
        client draws its own)."""
        classes = self.global_classes() if labels_of(method) == "global" else 0
        with torch.random.fork_rng():
            torch.manual_seed(derive_seed(seed, "init"))
            return self.study.composed.new_model(classes)

    def run(self) -> None:
        rounds = self.config.train.rounds
        clients = sorted(self.runtime.summaries())
        training = self.training_clients()
        for seed in self.config.seeds:
            for method in self.config.methods:
                units = [(seed, method, r) for r in range(1, rounds + 1)]
                if all(self.finished(*u) for u in units):
                    continue
                self.stop_if_diverged(seed, method, units, lambda: self.run_method(seed, method, clients, training))

    def run_method(self, seed: int, method: str, clients: list, training: list) -> None:
        """The rounds; a resumed run takes the federation back after its last finished round."""
        rounds, paths = self.config.train.rounds, self.config.protocol.paths
        done = [r for r in range(1, rounds + 1) if self.finished(seed, method, r)]
        labels = labels_of(method)
        federation = self.runtime.federation(self.new_model(seed, method), method, seed,
                                             label={"method": method, "seed": seed})
        if done:
            federation.load_state_dict(self.checkpoint.state("federation"))
        for rnd in range(len(done) + 1, rounds + 1):
            info = federation.run_round("train", rnd, {c: Training(labels) for c in training})
            self.record("round", method=method, seed=seed, phase="train", round=rnd, **info)
            if rnd == rounds:
                for path in range(1, paths + 1):
                    self.evaluate_clients(federation, {c: Evaluation(labels, path) for c in clients}, METRICS,
                                          method=method, seed=seed, round=rnd)
                if self.audit is not None:  # a local head's rows are its client's: no peer view
                    self.audit.run(federation, training, method, seed, self.membership_sets(labels),
                                   membership_losses(self.config), peer_view=labels == "global")
            self.finish_unit(f"seed {seed}: {method} round {rnd}", seed, method, rnd,
                             federation=federation.state_dict if rnd < rounds else None)


def membership_losses(config):
    """Per example, the ArcFace loss (margin included) with the client's head, over every class
    of the head (training masks a global head's classes absent from the client; unmasked, the
    loss is higher for members and non-members alike)."""
    from fedcare.algorithms.training import as_float
    from fedcare.device import device_of
    from fedcare.models.face_resnet import margin_logits

    t = config.train

    @torch.no_grad()
    def losses(model: nn.Module, data: ClientData):
        import numpy as np
        from torch.nn import functional as F

        was_training = model.training
        model.eval()
        out = []
        for start in range(0, len(data), 64):
            x, y = as_float(data.x[start : start + 64].to(device_of(model))), data.y[start : start + 64]
            cosine = model.head(model(x)).float().cpu()
            out.append(F.cross_entropy(margin_logits(cosine, y, t.arcface_scale, t.arcface_margin), y,
                                       reduction="none").numpy())
        model.train(was_training)
        return np.concatenate(out)

    return losses

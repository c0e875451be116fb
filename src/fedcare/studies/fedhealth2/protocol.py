"""The FedHealth 2 protocol (Chen et al. 2021; Lu et al., FedAP), as the server runs it.

Per seed, the clients with at least 2 training examples take part. Every method starts from
the same random init, except FedAP and d-FedAP, which start from a pretrained model (the
paper's f: trained on a random 20% of the pooled training data, or with
`protocol.pretrain = "federated"` by FedAvg on each client's own 20%) and run their
statistics exchange before round 1; f-FedAP runs `ffedap_warmup_rounds` FedBN rounds
first, then the exchange. After every round each client's personalized model is evaluated
on its own test set at the client (accuracy); round 0 is the starting point.
"""

from __future__ import annotations

import torch
from torch import nn

from fedcare.algorithms.training import ClientData
from fedcare.runtime.federation import Federation
from fedcare.runtime.refs import SeededSplit
from fedcare.seeding import derive_seed, numpy_rng
from fedcare.studies.base import StudyProtocol
from fedcare.studies.fedhealth2.config import PRETRAINED_METHODS
from fedcare.studies.fedhealth2.methods import PRETRAIN


class FedHealth2Protocol(StudyProtocol):
    """Units: FedAP's pretraining of a seed, and each round of a method of a seed (round 1
    with the setup exchange and the round-0 evaluation before it)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pretraining = bool(set(PRETRAINED_METHODS) & set(self.config.methods))
        self.units_total = len(self.config.seeds) * (len(self.config.methods) * self.config.train.rounds
                                                     + self.pretraining)

    def facts(self) -> dict:
        p = self.config.protocol
        return {"dataset": self.config.data.dataset, "split": p.split,
                "clients": p.clients if p.split == "dirichlet" else len(self.runtime.summaries()),
                "rounds": self.config.train.rounds}

    def new_model(self, seed: int) -> nn.Module:
        """The model with torch's default init drawn from the run's derived seed, leaving the
        global generator as it was."""
        with torch.random.fork_rng():
            torch.manual_seed(derive_seed(seed, "init"))
            return self.study.composed.new_model()

    def clients(self, seed: int) -> list:
        """The clients with at least 2 training examples for this seed."""
        return [c for c, s in sorted(self.runtime.summaries().items()) if s["train"][str(seed)] >= 2]

    # -- FedAP's pretrained start ------------------------------------------------------
    def pretrain(self, seed: int, clients: list) -> dict[str, torch.Tensor]:
        t = self.config.train
        model = self.new_model(seed)
        if self.config.protocol.pretrain == "pooled":
            # centralized training on a random share of the pooled training data
            pooled = self.runtime.pool({c: SeededSplit("train", seed) for c in clients})
            rng = numpy_rng(seed, "pretrain-share")
            share = rng.permutation(len(pooled))[: max(2, int(self.config.protocol.pretrain_fraction * len(pooled)))]
            data = ClientData(pooled.x[torch.from_numpy(share)], pooled.y[torch.from_numpy(share)])
            federation = self.runtime.federation(model, PRETRAIN, seed)
            federation.train_phase("pretrain", {0: data}, {}, max_rounds=t.pretrain_rounds, patience=t.pretrain_rounds)
        else:  # FedAvg on each client's own share, one round per pretraining epoch
            federation = self.runtime.federation(model, "fedavg", seed, label={"method": "pretrain", "seed": seed})
            for rnd in range(1, t.pretrain_rounds + 1):
                info = federation.run_round("pretrain", rnd, {c: SeededSplit("pretrain", seed) for c in clients})
                self.record("round", method="pretrain (federated)", seed=seed, phase="pretrain", round=rnd, **info)
        return federation.global_message.clone().tensors

    # -- the protocol -----------------------------------------------------------------
    def evaluate(self, federation: Federation, method: str, seed: int, rnd: int, clients: list) -> None:
        self.evaluate_clients(federation, {c: SeededSplit("test", seed) for c in clients}, "accuracy", method=method,
                              seed=seed, round=rnd)

    def run_method(self, method: str, seed: int, clients: list, pretrained: dict[str, torch.Tensor] | None) -> None:
        """The rounds; a resumed run takes the federation back after its last finished round."""
        rounds = self.config.train.rounds
        done = [rnd for rnd in range(1, rounds + 1) if self.finished(seed, method, rnd)]
        if len(done) == rounds:
            return
        model = self.new_model(seed)
        if method in PRETRAINED_METHODS:
            model.load_state_dict(pretrained)
        federation = self.runtime.federation(model, method, seed, label={"method": method, "seed": seed})
        train = {c: SeededSplit("train", seed) for c in clients}
        if done:
            federation.load_state_dict(self.checkpoint.state("federation"))
        else:
            if method in PRETRAINED_METHODS:
                federation.run_setup("setup", train)
            self.evaluate(federation, method, seed, 0, clients)
        for rnd in range(len(done) + 1, rounds + 1):
            if method == "f-fedap" and rnd == self.config.options.ffedap_warmup_rounds + 1:
                federation.run_setup("setup", train)  # weights from the model after the FedBN warm-up rounds
            info = federation.run_round("train", rnd, train)
            self.record("round", method=method, seed=seed, phase="train", round=rnd, **info)
            self.evaluate(federation, method, seed, rnd, clients)
            self.finish_unit(f"seed {seed}: {method} round {rnd}", seed, method, rnd,
                             federation=federation.state_dict if rnd < rounds else None)

    def run(self) -> None:
        for seed in self.config.seeds:
            clients = self.clients(seed)
            pretrained = None
            if self.pretraining and self.finished(seed, "pretrain"):
                pretrained = self.checkpoint.state("pretrained")
            elif self.pretraining:
                pretrained = self.pretrain(seed, clients)
                self.finish_unit(f"seed {seed}: pretrain", seed, "pretrain", pretrained=pretrained)
            for method in self.config.methods:
                units = [(seed, method, r) for r in range(1, self.config.train.rounds + 1)]
                self.stop_if_diverged(seed, method, units, lambda: self.run_method(method, seed, clients, pretrained))

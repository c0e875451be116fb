"""The FedHealth 2 protocol (Chen et al. 2021; Lu et al., FedAP), as the server runs it.

Per seed, the clients with at least 2 training examples take part. Every method starts from
the same random init, except FedAP and d-FedAP, which start from a pretrained model (the
paper's f: trained on a random 20% of the pooled training data, or with
`protocol.pretrain = "federated"` by FedAvg on each client's own 20%) and run their
statistics exchange before round 1; f-FedAP runs `ffedap_warmup_rounds` FedBN rounds
first, then the exchange. After every round each client's personalized model is evaluated
on its own test set at the client (accuracy); round 0 is the starting point. The rounds are
the library's (`fedcare.studies.rounds.RoundsProtocol`); this module adds the pretrained
start and FedAP's exchanges.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from fedcare.algorithms.training import ClientData
from fedcare.runtime.federation import Federation
from fedcare.seeding import numpy_rng
from fedcare.studies.fedhealth2.config import PRETRAINED_METHODS
from fedcare.studies.fedhealth2.methods import PRETRAIN
from fedcare.studies.rounds import RoundsProtocol


class FedHealth2Protocol(RoundsProtocol):
    """Units: FedAP's pretraining of a seed, and each round of a method of a seed (round 1
    with the setup exchange and the round-0 evaluation before it)."""

    metrics = "accuracy"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pretraining = bool(set(PRETRAINED_METHODS) & set(self.config.methods))
        self.units_total += len(self.config.seeds) * self.pretraining
        self.pretrained: dict[str, torch.Tensor] | None = None

    def facts(self) -> dict:
        p = self.config.protocol
        return {"dataset": self.config.data.dataset, "split": p.split,
                "clients": p.clients if p.split == "dirichlet" else len(self.runtime.summaries()),
                "rounds": self.config.train.rounds}

    def clients(self, seed: int) -> list:
        """The clients with at least 2 training examples for this seed."""
        return [c for c, s in sorted(self.runtime.summaries().items()) if s["train"][str(seed)] >= 2]

    # -- FedAP's pretrained start ------------------------------------------------------
    def prepare_seed(self, seed: int, clients: list) -> None:
        self.pretrained = None
        if self.pretraining and self.finished(seed, "pretrain"):
            self.pretrained = self.checkpoint.state("pretrained")
        elif self.pretraining:
            self.pretrained = self.pretrain(seed, clients)
            self.finish_unit(f"seed {seed}: pretrain", seed, "pretrain", pretrained=self.pretrained)

    def pretrain(self, seed: int, clients: list) -> dict[str, torch.Tensor]:
        t = self.config.train
        model = self.new_model(seed)
        if self.config.protocol.pretrain == "pooled":
            # centralized training on a random share of the pooled training data
            pooled = self.runtime.pool(self.data("train", seed, clients))
            rng = numpy_rng(seed, "pretrain-share")
            share = rng.permutation(len(pooled))[: max(2, int(self.config.protocol.pretrain_fraction * len(pooled)))]
            data = ClientData(pooled.x[torch.from_numpy(share)], pooled.y[torch.from_numpy(share)])
            federation = self.runtime.federation(model, PRETRAIN, seed)
            federation.train_phase("pretrain", {0: data}, {}, max_rounds=t.pretrain_rounds, patience=t.pretrain_rounds)
        else:  # FedAvg on each client's own share, one round per pretraining epoch
            federation = self.runtime.federation(model, "fedavg", seed, label={"method": "pretrain", "seed": seed})
            for rnd in range(1, t.pretrain_rounds + 1):
                info = federation.run_round("pretrain", rnd, self.data("pretrain", seed, clients))
                self.record("round", method="pretrain (federated)", seed=seed, phase="pretrain", round=rnd, **info)
        return federation.global_message.clone().tensors

    def initial_model(self, method: str, seed: int) -> nn.Module:
        model = self.new_model(seed)
        if method in PRETRAINED_METHODS:
            model.load_state_dict(self.pretrained)
        return model

    # -- FedAP's statistics exchanges ----------------------------------------------------
    def start(self, federation: Federation, method: str, seed: int, train: Mapping[Any, Any]) -> None:
        if method in PRETRAINED_METHODS:
            federation.run_setup("setup", train)

    def before_round(self, federation: Federation, method: str, seed: int, rnd: int, train: Mapping[Any, Any]) -> None:
        if method == "f-fedap" and rnd == self.config.options.ffedap_warmup_rounds + 1:
            federation.run_setup("setup", train)  # weights from the model after the FedBN warm-up rounds

"""The FedHealth 2 study (Chen et al. 2021; Lu et al., FedAP) end to end.

The data (PAMAP2 windows or chest X-rays) are split into `clients` by a Dirichlet label split
(α = 0.1), each client's share 50/50 into train and test. Every method starts from the same
random init, except FedAP and d-FedAP, which start from a model pretrained centrally on a
random 20% of the pooled training data (the paper's pretrained f) and run their statistics
exchange before round 1; f-FedAP runs `ffedap_warmup_rounds` FedBN rounds first, then the
exchange. After every round each client's personalized model is evaluated on its own test
set (accuracy); round 0 is the starting point.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedcare.algorithms import Algorithm, centralized, fedavg, local
from fedcare.algorithms.fedap import fedap
from fedcare.algorithms.fedbn import fedbn
from fedcare.algorithms.fedper import fedper
from fedcare.algorithms.fedprox import fedprox
from fedcare.algorithms.training import ClientData, TrainSettings
from fedcare.config import FedHealth2Experiment, to_toml
from fedcare.data.partition import dirichlet_label_split, train_test_split_per_client
from fedcare.report import build_report
from fedcare.runtime.simulation import Federation
from fedcare.seeding import derive_seed, numpy_rng
from fedcare.studies.fedhealth2.data import load_fedhealth2_data
from fedcare.studies.rundir import Progress, partial_run_directory, records_writer, start_run, write_run_info


def make_algorithm(method: str, config: FedHealth2Experiment) -> Algorithm:
    t, o = config.train, config.options
    settings = TrainSettings(lr=t.lr, batch_size=t.batch_size, local_epochs=t.local_epochs)
    if method == "local":
        return local(settings)
    if method == "fedavg":
        return fedavg(settings, t.aggregation)
    if method == "fedprox":
        return fedprox(settings, mu=o.fedprox_mu, squared=o.fedprox_squared, weighting=t.aggregation)
    if method == "fedbn":
        return fedbn(settings, weighting=t.aggregation)
    if method == "fedper":
        return fedper(settings, head_paths=tuple(o.fedper_private), weighting=t.aggregation)
    if method in ("fedap", "f-fedap"):
        return fedap(settings, lam=o.fedap_lambda, statistics="bn", weighting=t.aggregation)
    if method == "d-fedap":
        return fedap(settings, lam=o.fedap_lambda, statistics="classifier", weighting=t.aggregation)
    raise ValueError(f"unknown method {method!r}")


def new_model(model_fn: Callable[[], nn.Module], seed: int) -> nn.Module:
    """Build the model with torch's default init drawn from the run's derived seed, leaving the
    global generator as it was."""
    with torch.random.fork_rng():
        torch.manual_seed(derive_seed(seed, "init"))
        return model_fn()


def split_clients(y: np.ndarray, config: FedHealth2Experiment, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    p = config.protocol
    parts = dirichlet_label_split(y, p.clients, p.dirichlet_alpha, numpy_rng(seed, "partition"))
    rng = numpy_rng(seed, "train-test")
    return [train_test_split_per_client(idx, p.test_fraction, rng) for idx in parts]


class FedHealth2Study:
    def __init__(self, config: FedHealth2Experiment, x: torch.Tensor, y: torch.Tensor,
                 model_fn: Callable[[], nn.Module], write: Callable[[dict], None], progress: Progress | None):
        self.config, self.x, self.y, self.model_fn = config, x, y, model_fn
        self.write = write
        self.progress = progress or (lambda *_: None)
        self.units_done = 0
        self.units_total = len(config.seeds) * len(config.methods) * config.train.rounds

    def subset(self, idx: np.ndarray) -> ClientData:
        index = torch.from_numpy(np.asarray(idx, dtype=np.int64))
        return ClientData(self.x[index], self.y[index])

    def pretrain(self, seed: int, train: dict[int, ClientData]) -> dict[str, torch.Tensor]:
        """The paper's pretrained f: centralized training on a random share of the pooled training data."""
        pooled = ClientData.concat(train[c] for c in sorted(train))
        rng = numpy_rng(seed, "pretrain-share")
        share = rng.permutation(len(pooled))[: max(2, int(self.config.protocol.pretrain_fraction * len(pooled)))]
        data = ClientData(pooled.x[torch.from_numpy(share)], pooled.y[torch.from_numpy(share)])
        t = self.config.train
        settings = TrainSettings(lr=t.lr, batch_size=t.batch_size, local_epochs=1)
        federation = Federation(new_model(self.model_fn, seed), centralized(settings), seed)
        federation.train_phase("pretrain", {0: data}, {}, max_rounds=t.pretrain_epochs, patience=t.pretrain_epochs)
        return federation.global_message.clone().tensors

    def evaluate(self, federation: Federation, method: str, seed: int, rnd: int, test: dict[int, ClientData]) -> None:
        for cid in sorted(test):
            probabilities, loss = federation.predict(cid, test[cid])
            accuracy = (probabilities.argmax(dim=1) == test[cid].y).float().mean().item() if len(test[cid]) else float("nan")
            self.write({"type": "client_eval", "study": "fedhealth2", "method": method, "seed": seed, "round": rnd,
                        "client": cid, "n": len(test[cid]), "accuracy": accuracy, "loss": loss})

    def run_method(self, method: str, seed: int, train: dict[int, ClientData], test: dict[int, ClientData],
                   pretrained: dict[str, torch.Tensor] | None) -> None:
        model = new_model(self.model_fn, seed)
        if method in ("fedap", "d-fedap"):
            model.load_state_dict(pretrained)
        federation = Federation(model, make_algorithm(method, self.config), seed)
        if method in ("fedap", "d-fedap"):
            federation.run_setup("setup", train)
        self.evaluate(federation, method, seed, 0, test)
        for rnd in range(1, self.config.train.rounds + 1):
            if method == "f-fedap" and rnd == self.config.options.ffedap_warmup_rounds + 1:
                federation.run_setup("setup", train)  # weights from the model after the FedBN warm-up rounds
            info = federation.run_round("train", rnd, train)
            self.write({"type": "round", "study": "fedhealth2", "method": method, "seed": seed, "phase": "train",
                        "round": rnd, **info})
            self.evaluate(federation, method, seed, rnd, test)
            self.units_done += 1
            self.progress(f"seed {seed}: {method} round {rnd}", self.units_done, self.units_total)

    def run(self) -> None:
        for seed in self.config.seeds:
            splits = split_clients(self.y.numpy(), self.config, seed)
            train = {c: self.subset(tr) for c, (tr, te) in enumerate(splits) if len(tr) >= 2}
            test = {c: self.subset(te) for c, (tr, te) in enumerate(splits) if c in train}
            pretrained = self.pretrain(seed, train) if {"fedap", "d-fedap"} & set(self.config.methods) else None
            for method in self.config.methods:
                self.run_method(method, seed, train, test, pretrained)


def run_fedhealth2_experiment(
    config: FedHealth2Experiment, out: Path, *, config_file: str = "", progress: Progress | None = None,
    keep_partial: bool = False,
) -> Path:
    with partial_run_directory(out, keep_partial) as partial:
        started = start_run(partial, config, to_toml(config))
        data = load_fedhealth2_data(config, partial, progress)
        with records_writer(partial / "metrics.jsonl") as write:
            study = FedHealth2Study(config, data.x, data.y, data.model_fn, write, progress)
            t0 = time.perf_counter()
            study.run()
            seconds = time.perf_counter() - t0
        notes = [f"Data: {data.description}"]
        write_run_info(
            partial, out, study="fedhealth2", title=config.title, dataset=config.data.dataset, synthetic=data.synthetic,
            config_file=config_file, seeds=config.seeds, methods=config.methods, clients=config.protocol.clients,
            rounds=config.train.rounds, started=started, training_seconds=round(seconds, 2), notes=notes,
        )
        build_report(partial)
    return Path(out)

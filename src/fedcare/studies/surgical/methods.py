"""The surgical study's methods (config `methods`) and the algorithms behind them.

| method | algorithm |
|---|---|
| fedavg, fedprox, feddyn, feddg, fedrep | the library's algorithm, local SGD one-cycle (max `train.lr`), the server's AdamW (`train.server_lr`) on the pseudo-gradient |
| <method>-uniform | the same with unweighted aggregation (c_k = 1/K): the thesis's ablation |
| cent | one participant holding every client's training frames, AdamW one-cycle (max `train.cent_lr`) |
| lot | client k alone, AdamW one-cycle (max `train.lot_lr`); its model is the federation's message |

Choices where the thesis is silent:

- Aggregation is the thesis's WAVG by training frames (c_k = n_k / n) for every FL method,
  FedDyn included (its eq. 4.14 prints 1/K, the original paper's; that is `feddyn-uniform`).
  FedDyn's h update is always the unweighted sum / K, as in Acar et al.
- CENT and LOT keep their AdamW moments across epochs (a `fit` is one epoch): what a plain
  PyTorch loop over 50 epochs does. The moments are the client's private state
  (`extra/adamw/...`): they never leave the client.
- FedRep's head is the `classifier` block (the three fully-connected layers); both phases run
  at the local learning rate with the one-cycle schedule.
- FedDG's bank holds `train.feddg_bank` amplitude spectra of each *other* client (the library's
  default), an image is augmented with probability `train.feddg_p`.

AlexNet's and VGG-13's Dropout draws from torch's global generator, which the library's
training loop does not seed (it draws batch orders and augmentations from generators derived
from the run seed). Every client half here therefore runs with the global generator seeded
from (run seed, phase, client, round) and restored afterwards (`SeededClient`): the same
numbers in any runtime, after a resume, and whatever ran before in the process.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import torch
from torch import nn

from fedcare.algorithms import Algorithm, with_server_optimizer
from fedcare.algorithms.base import EXTRA, ClientHalf, DelegatingClient, ServerHalf
from fedcare.algorithms.catalogue import build
from fedcare.algorithms.messages import ClientState, Message
from fedcare.algorithms.server_optimizers import CosineAnneal
from fedcare.algorithms.split import SHARE_ALL
from fedcare.algorithms.training import AdamW, ClientData, OneCycle, Randomness, SGD, TrainSettings, train_epochs
from fedcare.data.surgical.clients import TOOLS
from fedcare.seeding import derive_seed
from fedcare.studies.surgical.config import UNIFORM, SurgicalExperiment
from fedcare.studies.surgical.models import HEAD
from fedcare.tasks import MultilabelTask

MOMENTS = EXTRA + "adamw/"  # client-state prefix of a persistent AdamW's per-parameter state


def base_method(method: str) -> tuple[str, str]:
    """("fedavg", "uniform") for "fedavg-uniform", ("fedavg", "examples") for "fedavg"."""
    if method.endswith(UNIFORM):
        return method[: -len(UNIFORM)], "uniform"
    return method, "examples"


class PersistentAdamWClient(ClientHalf):
    """FedAvg's client whose optimizer state survives from one `fit` (epoch) to the next: the
    AdamW moments and step count of every parameter are kept in the client's private state
    and put back into a fresh optimizer at the start of the next epoch (the learning rate comes
    from the one-cycle schedule, which knows the round)."""

    batched_fit = False  # a fit of its own: not the library's to batch over clients

    def fit(self, model: nn.Module, message: Message, state: ClientState, data: ClientData, rng: Randomness):
        self.load(model, message, state).train()
        params = list(model.parameters())
        made: list[torch.optim.Optimizer] = []

        def optimizer(ps: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
            opt = self.settings.optimizer(ps, lr)
            for i, p in enumerate(ps):
                saved = {k[len(f"{MOMENTS}{i}/"):]: v for k, v in state.items() if k.startswith(f"{MOMENTS}{i}/")}
                if saved:  # the moments on the parameter's device; torch keeps AdamW's step count on the CPU
                    opt.state[p] = {k: v.clone() if k == "step" else v.to(p.device, copy=True) for k, v in saved.items()}
            made.append(opt)
            return opt

        loss = train_epochs(model, params, data, replace(self.settings, optimizer=optimizer),
                            generator=rng.torch("fit-order"), round=rng.round)
        reply, private = self.outgoing(model, len(data), loss)
        new_state = {**{k: v for k, v in state.items() if k.startswith(EXTRA) and not k.startswith(MOMENTS)}, **private}
        if made:
            opt = made[-1]
            for i, p in enumerate(params):
                for name, value in opt.state.get(p, {}).items():
                    if isinstance(value, torch.Tensor):
                        new_state[f"{MOMENTS}{i}/{name}"] = value.detach().to("cpu", copy=True)  # state rests on the host
        return reply, new_state


@contextmanager
def seeded_global_generator(rng: Randomness, operation: str):
    """torch's global generator seeded from (run seed, phase, client, round, operation) within
    the block, and as it was after it."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(rng.seed, rng.phase, rng.client, rng.round, "global-generator", operation))
        yield


class SeededClient(DelegatingClient):
    """Another client half whose training operations run under `seeded_global_generator` (Dropout)."""

    def fit(self, model, message, state, data, rng):
        with seeded_global_generator(rng, "fit"):
            return self.inner.fit(model, message, state, data, rng)

    def after_aggregation(self, model, message, state, data, rng):
        with seeded_global_generator(rng, "after-aggregation"):
            return self.inner.after_aggregation(model, message, state, data, rng)

    def setup(self, model, message, state, data, rng):
        with seeded_global_generator(rng, "setup"):
            return self.inner.setup(model, message, state, data, rng)


def task(config: SurgicalExperiment, global_weight: torch.Tensor | None) -> MultilabelTask:
    """BCE with the configured positive weights (per client, a pooled tensor, or none)."""
    mode = config.train.pos_weight
    if mode == "global":
        if global_weight is None:
            raise RuntimeError("train.pos_weight = 'global' needs the weights computed over every client's training "
                               "labels first (in this process only)")
        weight: str | torch.Tensor = global_weight
    else:
        weight = mode
    return MultilabelTask(labels=tuple(TOOLS), pos_weight=weight, threshold=config.train.threshold)


def server_schedule(config: SurgicalExperiment) -> CosineAnneal | None:
    """`train.server_anneal`: the FL server's rate factor per round, held for the clients'
    one-cycle warm-up share of the rounds, then annealed to 0 (None: constant, the thesis)."""
    t = config.train
    return CosineAnneal(hold=round(t.pct_start * t.rounds), steps=t.rounds) if t.server_anneal else None


def make_algorithm(method: str, config: SurgicalExperiment, global_weight: torch.Tensor | None = None) -> Algorithm:
    t = config.train
    schedule = OneCycle(pct_start=t.pct_start, rounds=t.rounds, cycle_momentum=t.cycle_momentum)
    common = dict(batch_size=t.batch_size, task=task(config, global_weight), scheduler=schedule)
    if method in ("cent", "lot"):
        lr = t.cent_lr if method == "cent" else t.lot_lr
        settings = TrainSettings(lr=lr, local_epochs=1, optimizer=AdamW(weight_decay=t.weight_decay), **common)
        return Algorithm(method, SeededClient(PersistentAdamWClient(settings, SHARE_ALL)), ServerHalf(SHARE_ALL),
                         pooled=method == "cent")
    name, weighting = base_method(method)
    settings = TrainSettings(lr=t.lr, local_epochs=t.local_epochs, optimizer=SGD(), **common)
    inner = build(name, settings, weighting=weighting, mu=t.mu, alpha=t.mu,  # the thesis's mu is FedDyn's alpha too
                  bank_per_client=t.feddg_bank, p=t.feddg_p,
                  head_paths=(HEAD,), head_epochs=t.head_epochs, body_epochs=t.body_epochs)
    algorithm = with_server_optimizer(inner, "adamw", lr_factor=server_schedule(config), lr=t.server_lr,
                                      weight_decay=t.server_weight_decay)
    return replace(algorithm, name=method, client=SeededClient(algorithm.client))

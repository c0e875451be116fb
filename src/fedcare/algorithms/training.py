"""Local training and prediction on one client's data: the one training loop every client
half uses.

`TrainSettings` carries what a study chooses about local training: the learning rate, batch
size and epochs, the task (its loss and scores, `fedcare.tasks`), the optimizer and an
optional learning-rate schedule, and an optional per-step gradient hook (DP-SGD clips and
noises gradients there). The defaults are the papers' plain minibatch SGD without momentum.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from fedcare.client_data import ClientData  # here for the many modules that import it from the training loop
from fedcare.device import autocast, device_of
from fedcare.errors import UserError
from fedcare.seeding import torch_generator
from fedcare.tasks import BINARY, BatchLoss, Task

# (parameters, learning rate) -> optimizer
OptimizerFactory = Callable[[list[nn.Parameter], float], torch.optim.Optimizer]
# (optimizer, optimizer steps this run will take, its federated round) -> a scheduler stepped after every batch
SchedulerFactory = Callable[[torch.optim.Optimizer, int, int], torch.optim.lr_scheduler.LRScheduler]
# (model, examples in the batch): called after backward, before the optimizer's step
GradientHook = Callable[[nn.Module, int], None]
# (the client's training data) -> the batch loss (a task's, or a study's own)
LossFactory = Callable[["ClientData"], BatchLoss]


def as_float(x: torch.Tensor) -> torch.Tensor:
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x


@dataclass(frozen=True)
class SGD:
    """torch.optim.SGD (the papers' local optimizer: no momentum by default)."""

    momentum: float = 0.0
    weight_decay: float = 0.0

    def __call__(self, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=lr, momentum=self.momentum, weight_decay=self.weight_decay)


@dataclass(frozen=True)
class AdamW:
    """torch.optim.AdamW with torch's defaults (the surgical thesis's CENT and LOT)."""

    weight_decay: float = 1e-2

    def __call__(self, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=lr, weight_decay=self.weight_decay)


@dataclass(frozen=True)
class OneCycle:
    """torch's OneCycleLR peaking at the optimizer's learning rate, stepped every batch (the
    surgical thesis's one-cycle schedule; pct_start is not given there: torch's 0.3).

    `rounds` = 1: one cycle per local training run. `rounds` = R: one cycle over R runs of the
    same length, round r (1-based) continuing where round r - 1 ended, so a client's learning
    rate rises and decays over the whole federated training (or over a centralized run of R
    epochs). Rounds after R stay at the cycle's last round.

    `cycle_momentum` is torch's option: True (torch's default) also cycles the momentum
    between 0.95 and 0.85 (SGD's `momentum`, Adam's beta1), which turns SGD(momentum=0) into
    momentum SGD; False leaves the optimizer's momentum as it was built."""

    pct_start: float = 0.3
    rounds: int = 1
    cycle_momentum: bool = True

    def __call__(self, optimizer: torch.optim.Optimizer, steps: int, round: int = 1) -> torch.optim.lr_scheduler.LRScheduler:
        peaks = [group["lr"] for group in optimizer.param_groups]
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=peaks, total_steps=steps * self.rounds,
                                                        pct_start=self.pct_start,
                                                        cycle_momentum=self.cycle_momentum)
        with warnings.catch_warnings():  # moving to this round's start before any optimizer step
            warnings.simplefilter("ignore", UserWarning)
            for _ in range((min(max(round, 1), self.rounds) - 1) * steps):
                scheduler.step()
        return scheduler


class BatchSampler(Protocol):
    """Draws a training run's batches in place of shuffling: index tensors, possibly empty."""

    def steps_per_epoch(self, n: int, batch_size: int) -> int: ...

    def epoch(self, n: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]: ...


@dataclass(frozen=True)
class TrainSettings:
    lr: float = 1e-3
    batch_size: int = 32
    local_epochs: int = 5
    task: Task = BINARY
    loss: LossFactory | None = None  # None: the task's batch loss
    optimizer: OptimizerFactory = SGD()
    scheduler: SchedulerFactory | None = None
    gradient_hook: GradientHook | None = None
    # None: shuffled batches of `batch_size` (below); DP-SGD's Poisson sampling sets one
    # (`fedcare.privacy.dp_sgd.PoissonBatches`): every batch it yields is one step, empty ones too
    batches: BatchSampler | None = None
    eval_batch_size: int = 512  # examples per forward pass when evaluating: bounds its activations' memory
    # "fp32", or "bf16"/"fp16": forward passes under torch.autocast (fp16 with a gradient scaler);
    # set from the experiment's [runtime] precision for every algorithm (`fedcare.studies.base`)
    precision: str = "fp32"

    def batch_loss(self, data: ClientData) -> BatchLoss:
        return self.loss(data) if self.loss is not None else self.task.batch_loss(data)


@dataclass(frozen=True)
class Randomness:
    """Hands out generators derived from (run seed, phase, client, round, purpose)."""

    seed: int
    phase: str
    client: object
    round: int

    def torch(self, purpose: str) -> torch.Generator:
        return torch_generator(self.seed, self.phase, self.client, self.round, purpose)


class _Optimisation:
    """One local training run: the settings' optimizer over `params` (and its schedule), the
    batch loss for this client's data, the gradient hook; `step(idx)` trains on one batch."""

    def __init__(self, model: nn.Module, params: Iterable[nn.Parameter], data: ClientData, settings: TrainSettings,
                 lr: float, steps: int, generator: torch.Generator,
                 batch_transform: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None,
                 penalty: Callable[[], torch.Tensor | None] | None, round: int = 1):
        self.model, self.data, self.settings = model, data, settings
        self.generator, self.batch_transform, self.penalty = generator, batch_transform, penalty
        self.params = list(params)
        self.optimizer = settings.optimizer(self.params, lr)
        self.scheduler = settings.scheduler(self.optimizer, steps, round) if settings.scheduler and steps > 0 else None
        self.loss = settings.batch_loss(data)
        self.device = device_of(model)  # batches go where the model is; the data stay on the host
        # fp16's small range: the loss is scaled for backward, the gradients unscaled before the hook and step
        self.scaler = torch.amp.GradScaler(self.device.type) if settings.precision == "fp16" else None

    def step(self, idx: torch.Tensor) -> float:
        """One optimizer step on the examples `idx`; returns the batch's task loss."""
        self.optimizer.zero_grad(set_to_none=True)
        if len(idx) == 0:
            return self._empty_step()
        x = as_float(self.data.x[idx].to(self.device))
        if self.batch_transform is not None:
            x = self.batch_transform(x, self.generator)
        with autocast(self.device, self.settings.precision):
            loss = self.loss(self.model, x, self.data.y[idx].to(self.device))
            extra = self.penalty() if self.penalty is not None else None
        total = loss if extra is None else loss + extra
        if self.scaler is None:
            total.backward()
        else:
            self.scaler.scale(total).backward()
            self.scaler.unscale_(self.optimizer)
        if self.settings.gradient_hook is not None:
            self.settings.gradient_hook(self.model, len(idx))
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)  # skipped when the scaled gradients overflowed
            self.scaler.update()
        if self.scheduler is not None:
            self.scheduler.step()
        value = loss.item()
        if not math.isfinite(value):
            raise TrainingDiverged(f"training diverged: a batch's loss is {value} (a learning rate too high for this "
                                   "model, or gradients that grow without bound); its numbers would mean nothing")
        return value

    def check_weights(self, when: str) -> None:
        """The weights the steps produced are finite: a step can overflow them while the batch
        loss, computed before it, still was (a learning rate or DP-SGD noise out of range)."""
        check_finite([*self.params, *(b for b in self.model.buffers() if b.is_floating_point())], when)

    def _empty_step(self) -> float:
        """A Poisson-sampled batch with no example: the step still happens (skipping it would
        tell which batches were empty); the gradient hook (DP-SGD) makes it noise alone."""
        extra = self.penalty() if self.penalty is not None else None
        if extra is not None:
            extra.backward()
        if self.settings.gradient_hook is not None:
            self.settings.gradient_hook(self.model, 0)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        return 0.0


class TrainingDiverged(UserError, ValueError):
    """A training loss or weights that are not finite numbers: the method stops (what finished
    is kept) instead of reporting metrics of a model that no longer means anything."""


def check_finite(tensors: Iterable[torch.Tensor], when: str) -> None:
    """Raise TrainingDiverged unless every value of `tensors` is finite (one check on the device)."""
    flags = [torch.isfinite(t).all() for t in tensors if t.numel()]
    if flags and not bool(torch.stack(flags).all()):
        raise TrainingDiverged(f"training diverged: the weights after {when} are not finite (a learning rate too high "
                               "for this model, or DP-SGD's noise or clipping out of range); its numbers would mean "
                               "nothing")


def batches_per_epoch(n: int, batch_size: int) -> int:
    """Batches of `train_epochs` per epoch: a trailing batch of one example is skipped."""
    return n // batch_size + (1 if n % batch_size >= 2 else 0)


def train_epochs(
    model: nn.Module,
    params: Iterable[nn.Parameter],
    data: ClientData,
    settings: TrainSettings,
    *,
    generator: torch.Generator,
    epochs: int | None = None,
    lr: float | None = None,
    batch_transform: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None,
    penalty: Callable[[], torch.Tensor | None] | None = None,
    round: int = 1,
) -> float:
    """`epochs` (default the settings' local epochs) passes over `data` in a fresh random
    order each, at learning rate `lr` (default the settings'), optimizing `params`; returns
    the mean task loss of the last epoch. `round` (the federated round) tells a schedule
    spanning rounds where it stands.

    `batch_transform` (e.g. FedDG's amplitude augmentation) maps each float batch before use;
    `penalty` (FedProx's proximal term, FedDyn's regulariser) is called once per batch on the
    current weights and added to the objective (None: no term on this batch); the returned
    loss is the task loss alone. A trailing batch of one example is skipped: BatchNorm cannot
    train on it."""
    epochs = settings.local_epochs if epochs is None else epochs
    n, batch_size = len(data), settings.batch_size
    sampler = settings.batches
    per_epoch = batches_per_epoch(n, batch_size) if sampler is None else sampler.steps_per_epoch(n, batch_size)
    run = _Optimisation(model, params, data, settings, settings.lr if lr is None else lr,
                        epochs * per_epoch, generator, batch_transform, penalty, round)
    last_loss = float("nan")
    if sampler is not None:
        for epoch in range(epochs):
            total, count = 0.0, 0
            for idx in sampler.epoch(n, batch_size, generator):
                total += run.step(idx) * len(idx)
                count += len(idx)
            last_loss = total / count if count else last_loss
            run.check_weights(f"epoch {epoch + 1}")
        return last_loss
    for epoch in range(epochs):
        order = torch.randperm(n, generator=generator, device=generator.device)  # drawn per epoch: batch transforms share the generator
        total, count = 0.0, 0
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            if len(idx) < 2:
                continue
            total += run.step(idx) * len(idx)
            count += len(idx)
        last_loss = total / max(count, 1)
        run.check_weights(f"epoch {epoch + 1}")
    return last_loss


def train_steps(
    model: nn.Module,
    params: Iterable[nn.Parameter],
    data: ClientData,
    settings: TrainSettings,
    *,
    steps: int,
    generator: torch.Generator,
    lr: float | None = None,
) -> float:
    """`steps` optimizer steps on consecutive batches of a random permutation of `data`,
    reshuffled when the data are used up (a pass that would leave a batch of one example
    reshuffles instead: BatchNorm cannot train on it); returns the mean task loss."""
    n, batch_size = len(data), settings.batch_size
    if steps <= 0:
        return float("nan")
    if n < 2:
        raise ValueError(f"training needs at least 2 examples, got {n}")
    run = _Optimisation(model, params, data, settings, settings.lr if lr is None else lr, steps, generator, None, None)
    if settings.batches is not None:  # epochs of the sampler's batches until `steps` are taken (or it stops)
        taken, total = 0, 0.0
        while taken < steps:
            drawn = 0
            for idx in settings.batches.epoch(n, batch_size, generator):
                total, taken, drawn = total + run.step(idx), taken + 1, drawn + 1
                if taken == steps:
                    break
            if not drawn:  # the sampler has stopped (DP-SGD's budget is spent)
                break
        run.check_weights("local training")
        return total / taken if taken else float("nan")
    order, start, total = torch.randperm(n, generator=generator, device=generator.device), 0, 0.0
    for _ in range(steps):
        if n - start < 2:
            order, start = torch.randperm(n, generator=generator, device=generator.device), 0
        total += run.step(order[start : start + batch_size])
        start += batch_size
    run.check_weights("local training")
    return total / steps


@torch.no_grad()
def predict(model: nn.Module, data: ClientData, task: Task, batch_size: int = 512,
            precision: str = "fp32") -> tuple[torch.Tensor, float]:
    """The task's per-example scores (probabilities, or normalised embeddings) and the mean
    evaluation loss, with the model in inference mode; the forward passes run on the model's
    device (under autocast for bf16/fp16), the scores and loss are computed in fp32 on the CPU."""
    was_training = model.training
    model.eval()
    device = device_of(model)
    with autocast(device, precision):
        outputs = torch.cat([model(as_float(data.x[i : i + batch_size].to(device)))
                             for i in range(0, len(data), batch_size)])
    outputs = outputs.float().cpu()
    model.train(was_training)
    return task.scores(outputs), task.evaluation_loss(outputs, data.y)

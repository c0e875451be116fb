"""Per-FedAvg with Hessian-free MAML (HF-MAML), and its first-order variant (FO-MAML).

Sources: Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with Theoretical
Guarantees: A Model-Agnostic Meta-Learning Approach" (NeurIPS 2020), as the facerec thesis
runs it (reference/facerec-thesis.md §2.2–2.3: Algorithm 5, Eq. 2.12/2.14, Table 4.5).

Client k receives w (and the head a when it is global) and runs `steps_per_round` steps; each
step draws three different batches D, D′, D″ of `settings.batch_size` examples and does

    w̃  = w − α ∇f(w; D)                                        (inner step)
    g  = ∇f(w̃; D′)                                             (outer gradient)
    Hg ≈ [∇f(w + δg; D″) − ∇f(w − δg; D″)] / (2δ)              (Eq. 2.14, `finite_difference_hvp`)
    w  ← w − β (g − α Hg)                                       (HF-MAML meta step)

or, with `first_order=True` (FO-MAML, Eq. 2.11), w ← w − β g. The server averages the
shared tensors weighted by example count (the thesis's n_k / Σ n_i), as FedAvg does.
Defaults are the thesis's Table 4.5: α = 0.01, β = 0.1, δ = 0.001, and 50 steps per round
(its 50 "epochs" of three batches of 64, §3 [inferred there]); the batch size comes from
`settings.batch_size` (64 in the thesis). `settings.lr` and `settings.local_epochs` are not
used: α, β and `steps_per_round` take their place.

With `head_paths` (e.g. ("classifier",), the thesis's private ArcFace head) every module
under those paths stays on the client (its parameters and buffers live in the client state)
and everything else is shared. The meta step updates the head too (the thesis steps (w, a)
together); only the shared part is sent.

Choices where the thesis (and the paper) are silent
---------------------------------------------------
- **Batches.** Each step draws one fresh permutation of the client's data from the client's
  "perfedavg-batches" generator; D, D′, D″ are its first three blocks of `batch_size`
  examples, so they are disjoint. A client with fewer than 3 × batch_size examples cannot
  have three disjoint full batches: each of D, D′, D″ is then an independent random draw of
  min(batch_size, n) examples (they may overlap). At least 2 examples are needed (BatchNorm
  in training mode).
- **Plain steps.** α and β are plain gradient steps, no momentum (Per-FedAvg's algorithm;
  the thesis's "SGD with momentum 0.9" does not say it applies to α/β, §2.3 ambiguity).
- **Train mode and BatchNorm.** Every evaluation runs in training mode (BatchNorm normalizes
  with the batch statistics, so f(·; D) is the training loss). Running statistics are
  updated only by the two "real" forward passes of a step, at w on D and at w̃ on D′, as two
  ordinary training batches would update them. The ± δ evaluations on D″ run through
  `torch.func.functional_call` with *copies* of every buffer, so they leave no trace in the
  running statistics or `num_batches_tracked`.
- **Reported loss.** `train_loss` is the mean over the round's steps of f(w̃; D′), the
  meta-objective that the step descends.
- **Personalization.** `adapt` is Per-FedAvg's adaptation at evaluation: a few steps of the
  training loop on the client's own data (plain SGD at α as Per-FedAvg; the thesis tunes for
  10 batches of 64 with SGD lr 0.01, momentum 0.9: `SGD(momentum=0.9)` reproduces that).
- **Loss.** Every gradient is of the settings' batch loss (the study's task, or its own loss
  such as an ArcFace margin head), evaluated at other weights with `functional_call`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn
from torch.func import functional_call

from fedcare.algorithms.base import Algorithm, ClientHalf, ServerHalf
from fedcare.algorithms.messages import ClientState, Message
from fedcare.algorithms.split import SHARE_ALL, ParameterSplit
from fedcare.algorithms.training import ClientData, Randomness, TrainSettings, as_float, check_finite, train_steps
from fedcare.device import device_of
from fedcare.tasks import BatchLoss

DEFAULT_ALPHA = 0.01  # Table 4.5
DEFAULT_BETA = 0.1  # Table 4.5
DEFAULT_DELTA = 0.001  # Table 4.5
DEFAULT_STEPS = 50  # §3: 50 "epochs" of three batches each [inferred in the reference note]
BATCH_PURPOSE = "perfedavg-batches"

Params = dict[str, torch.Tensor]


def _trainable(model: nn.Module) -> Params:
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


class _UnderLoss(nn.Module):
    """`model` with the batch loss as its forward, so that `functional_call` can evaluate the
    loss (which calls the model, and may apply a margin head with the labels) at other weights."""

    def __init__(self, model: nn.Module, loss: BatchLoss):
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss(self.model, x, y)


def _gradient(
    model: nn.Module, params: Mapping[str, torch.Tensor], batch: ClientData, loss_fn: BatchLoss,
    buffers: Mapping[str, torch.Tensor] | None = None,
) -> tuple[list[torch.Tensor], float]:
    """∇f(params; batch) in `params` order, and the loss f = `loss_fn`. `buffers=None` runs with
    the model's own buffers (BatchNorm running statistics are updated in place, as in
    training); pass copies to leave no trace."""
    leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    tensors = {**leaves, **buffers} if buffers is not None else leaves
    device = device_of(model)  # the meta step runs in fp32 whatever the run's precision
    loss = functional_call(_UnderLoss(model, loss_fn), {f"model.{k}": v for k, v in tensors.items()},
                           (as_float(batch.x.to(device)), batch.y.to(device)))
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    return [torch.zeros_like(v) if g is None else g.detach() for v, g in zip(leaves.values(), grads)], float(loss.detach())


def finite_difference_hvp(
    model: nn.Module,
    params: Mapping[str, torch.Tensor],
    vector: Sequence[torch.Tensor],
    batch: ClientData,
    delta: float,
    *,
    loss: BatchLoss,
) -> list[torch.Tensor]:
    """Hessian-vector product ∇²f(w; batch) v by central finite differences (Eq. 2.12/2.14):
    [∇f(w + δv; batch) − ∇f(w − δv; batch)] / (2δ), returned in `params` order.

    `params` maps parameter names of `model` to the point w (parameters not named keep the
    model's values and are not perturbed); `vector` holds one tensor per entry of `params`.
    The model runs in whatever mode it is in (training mode: BatchNorm normalizes with the
    batch statistics). Both evaluations get copies of every buffer through
    `torch.func.functional_call`, so running statistics and `num_batches_tracked` are left
    exactly as they were, and the model's parameters are never touched.
    """
    if not delta > 0:
        raise ValueError(f"delta must be positive, got {delta}")
    names = list(params)
    if len(vector) != len(names):
        raise ValueError(f"{len(vector)} vector tensors for {len(names)} parameters")

    def grad_at(sign: float) -> list[torch.Tensor]:
        point = {k: params[k].detach() + sign * delta * v for k, v in zip(names, vector)}
        buffers = {k: b.detach().clone() for k, b in model.named_buffers()}
        return _gradient(model, point, batch, loss, buffers)[0]

    plus, minus = grad_at(1.0), grad_at(-1.0)
    return [(p - m) / (2 * delta) for p, m in zip(plus, minus)]


def sample_step_batches(data: ClientData, batch_size: int, generator: torch.Generator) -> tuple[ClientData, ClientData, ClientData]:
    """D, D′, D″ for one step: disjoint blocks of one fresh permutation when the client holds
    at least 3 × batch_size examples, else three independent draws of min(batch_size, n)."""
    n = len(data)
    if n < 2:
        raise ValueError(f"Per-FedAvg needs at least 2 examples per client, got {n}")
    if batch_size < 2:
        raise ValueError(f"batch_size must be at least 2 (BatchNorm), got {batch_size}")
    if n >= 3 * batch_size:
        order = torch.randperm(n, generator=generator, device=generator.device)
        blocks = [order[i * batch_size : (i + 1) * batch_size] for i in range(3)]
    else:
        k = min(batch_size, n)
        blocks = [torch.randperm(n, generator=generator, device=generator.device)[:k] for _ in range(3)]
    return tuple(ClientData(data.x[idx], data.y[idx]) for idx in blocks)  # type: ignore[return-value]


def meta_step(
    model: nn.Module,
    params: Mapping[str, torch.Tensor],
    batches: tuple[ClientData, ClientData, ClientData],
    *,
    alpha: float,
    beta: float,
    delta: float,
    loss: BatchLoss,
    first_order: bool = False,
) -> tuple[Params, float]:
    """One HF-MAML (or FO-MAML) step from `params` on batches (D, D′, D″); returns the new
    parameters and f(w̃; D′). Running statistics are updated by the forward passes at w on D
    and at w̃ on D′ only (see the module docstring)."""
    d, d1, d2 = batches
    names = list(params)
    w = {k: params[k].detach() for k in names}
    grad_d, _ = _gradient(model, w, d, loss)
    w_tilde = {k: w[k] - alpha * gk for k, gk in zip(names, grad_d)}
    g, query_loss = _gradient(model, w_tilde, d1, loss)
    if first_order:
        return {k: w[k] - beta * gk for k, gk in zip(names, g)}, query_loss
    hg = finite_difference_hvp(model, w, g, d2, delta, loss=loss)
    return {k: w[k] - beta * (gk - alpha * hk) for k, gk, hk in zip(names, g, hg)}, query_loss


class PerFedAvgClient(ClientHalf):
    batched_fit = False  # a fit of its own: not the library's to batch over clients
    trains_in_loop = False  # the meta step's gradients come from functional_call, not the loop

    def __init__(
        self,
        settings: TrainSettings,
        split: ParameterSplit,
        *,
        alpha: float,
        beta: float,
        delta: float,
        steps_per_round: int,
        first_order: bool,
    ):
        super().__init__(settings, split)
        if steps_per_round < 1:
            raise ValueError(f"steps_per_round must be at least 1, got {steps_per_round}")
        self.alpha, self.beta, self.delta = float(alpha), float(beta), float(delta)
        self.steps_per_round = int(steps_per_round)
        self.first_order = bool(first_order)

    def fit(
        self, model: nn.Module, message: Message, state: ClientState, data: ClientData, rng: Randomness
    ) -> tuple[Message, ClientState]:
        self.load(model, message, state).train()
        generator = rng.torch(BATCH_PURPOSE)
        params = _trainable(model)
        loss_fn = self.settings.batch_loss(data)
        losses = []
        for _ in range(self.steps_per_round):
            batches = sample_step_batches(data, self.settings.batch_size, generator)
            params, loss = meta_step(
                model, params, batches, alpha=self.alpha, beta=self.beta, delta=self.delta, loss=loss_fn,
                first_order=self.first_order,
            )
            losses.append(loss)
        check_finite(params.values(), "its meta steps")  # as the training loop checks its steps
        named = dict(model.named_parameters())
        with torch.no_grad():
            for k, v in params.items():
                named[k].copy_(v)
        return self.outgoing(model, len(data), sum(losses) / len(losses))


def adapt(model: nn.Module, data: ClientData, settings: TrainSettings, *, steps: int,
          generator: torch.Generator) -> nn.Module:
    """Per-FedAvg's personalization before evaluation: `steps` steps of the settings' optimizer
    (plain SGD at `settings.lr` by default, as Per-FedAvg adapts) on the client's own data,
    every trainable parameter, in training mode (BatchNorm running statistics update as in
    any training), batches of `settings.batch_size` (`train_steps`). The facerec thesis tunes
    for 10 batches of 64 with SGD lr 0.01 and momentum 0.9:
    ``TrainSettings(lr=0.01, batch_size=64, optimizer=SGD(momentum=0.9))``, ``steps=10``.
    Modifies `model` in place, restores its train/eval mode, and returns it."""
    if steps <= 0:
        return model
    was_training = model.training
    model.train()
    train_steps(model, [p for p in model.parameters() if p.requires_grad], data, settings, steps=steps,
                generator=generator)
    model.train(was_training)
    return model


def perfedavg(
    settings: TrainSettings,
    alpha: float = DEFAULT_ALPHA,
    beta: float = DEFAULT_BETA,
    delta: float = DEFAULT_DELTA,
    steps_per_round: int = DEFAULT_STEPS,
    first_order: bool = False,
    head_paths: tuple[str, ...] | None = None,
    weighting: str = "examples",
) -> Algorithm:
    """Per-FedAvg (HF-MAML; FO-MAML with `first_order=True`). `head_paths=None` shares the
    whole model; e.g. ("classifier",) keeps that head private."""
    if head_paths and any(not h for h in head_paths):
        raise ValueError("head_paths must name modules; use local training to keep the whole model private")
    split = SHARE_ALL if not head_paths else ParameterSplit(private_paths=tuple(head_paths))
    client = PerFedAvgClient(
        settings, split, alpha=alpha, beta=beta, delta=delta, steps_per_round=steps_per_round, first_order=first_order
    )
    name = "perfedavg-fo" if first_order else "perfedavg"
    return Algorithm(name, client, ServerHalf(split, weighting))

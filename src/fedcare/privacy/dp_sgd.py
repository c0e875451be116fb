"""Sample-level DP-SGD at each client (Abadi et al. 2016) on fedcare's one training loop.

Opacus computes per-example gradients (`GradSampleModule`'s hooks on the model's layers);
the training loop's gradient hook (`PerExampleClipNoise`) clips each example's gradient to
C, adds Gaussian noise N(0, (sigma C)^2) to the batch's sum and divides by the batch size.
Every training step of a client (its fit, and fine-tuning after aggregation such as PFDL's)
goes through it and is counted; the client's accountant (Opacus's RDP or PRV) turns the
steps into epsilon for the target delta.

Choices written down:
- Sampling (`sampling`). "poisson", the default: each step takes every example independently
  with probability q = batch_size / n (Opacus's UniformWithReplacementSampler, as its
  DPDataLoader does), int(1/q) steps an epoch, batches of variable size and sometimes empty;
  the sum of clipped gradients plus noise is divided by the configured batch size, a public
  constant (not the drawn size, which depends on the data, nor q n, which is the client's
  example count when it holds fewer than a batch: Opacus #819), and an empty batch is a step of
  noise alone. This is
  the sampling the accountants analyse. "shuffle": the loop's fixed-size shuffled batches; the
  accountant is given q = batch/n all the same, so the epsilon is an approximation of the
  guarantee, not a proof of it (the report says "approximate").
- Budget (`target_epsilon`). At its first training the client calibrates sigma (Opacus's
  get_noise_multiplier) so that `budget_epochs` passes over its data, at its q, spend exactly
  the target at `delta`. Before each training run it computes how many more steps fit under
  the target; the sampler stops there, mid-epoch if need be. A client with no step left does
  not train: its fit replies "skipped" (`DP_SKIPPED`, no tensors of its own, weight 0) and the
  server leaves it out of the aggregate and the round's record lists it.
- The ledger (`extra/privacy/dp_sgd`, rows of (sigma, q, steps)) is client state and is never
  rolled back: early stopping that restores an earlier round does not undo released updates.
- BatchNorm mixes examples; it is replaced by GroupNorm (`private_model`). A frozen,
  inference-mode BatchNorm would be per-example, but its statistics came from the private
  data without noise, so it is not offered.
- A weight-only penalty (FedProx's proximal term, FedDyn's regulariser) depends on no example:
  its gradient (what backward produced beyond the per-example gradients) is added unclipped.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch
from torch import nn

from fedcare.algorithms.base import (
    DP_EPSILON, DP_SKIPPED, NUM_EXAMPLES, PRIVACY_METRICS, TRAIN_LOSS, ClientHalf, DelegatingClient,
)
from fedcare.algorithms.fedbn import BATCHNORM
from fedcare.algorithms.messages import ClientState, Message
from fedcare.algorithms.split import STANDS_IN_FOR
from fedcare.algorithms.training import ClientData, Randomness
from fedcare.config import DPSGD
from fedcare.errors import UserError
from fedcare.runtime.clients import PRIVACY_LEDGER

LEDGER = PRIVACY_LEDGER + "dp_sgd"  # rows (noise multiplier, sample rate, steps)
SIGMA = PRIVACY_LEDGER + "dp_sgd_sigma"  # the calibrated noise multiplier (target_epsilon), fixed at first training



class PrivacyError(UserError, ValueError):
    """A protection that cannot apply to this model or algorithm; the message says why."""


def private_model(model: nn.Module, config: DPSGD) -> nn.Module:
    """The model with every BatchNorm replaced by GroupNorm (Opacus's ModuleValidator), or an
    error naming the layers when `batchnorm = "refuse"` (or another layer Opacus cannot handle).
    Each GroupNorm says which BatchNorm it stands in for (`split.STANDS_IN_FOR`), so a split that
    keeps BatchNorm private (FedBN, FedAP) keeps it private too, rather than sharing it."""
    from opacus.validators import ModuleValidator

    if config.batchnorm == "groupnorm":
        replaced = {path: type(m) for path, m in model.named_modules() if isinstance(m, BATCHNORM)}
        model = ModuleValidator.fix(model)
        modules = dict(model.named_modules())
        for path, kind in replaced.items():
            setattr(modules[path], STANDS_IN_FOR, kind)
    problems = ModuleValidator.validate(model, strict=False)
    if problems:
        raise PrivacyError("privacy.dp_sgd: the model has layers without per-example gradients: "
                           + "; ".join(str(p) for p in problems[:3])
                           + ('; set privacy.dp_sgd.batchnorm = "groupnorm"' if config.batchnorm == "refuse" else ""))
    return model


class PerExampleClipNoise:
    """The gradient hook: after backward, each example's gradient (Opacus's `grad_sample`) is
    clipped to `max_grad_norm` over all trained parameters together, the clipped gradients are
    summed, noised and divided by the batch size into `.grad`."""

    def __init__(self, config: DPSGD):
        self.config = config
        self.noise_multiplier = config.noise_multiplier  # the calibrated one under target_epsilon
        self.generator: torch.Generator | None = None
        self.steps = 0
        self.batch_size = 0  # the largest batch seen (the accountant's sample rate when shuffling)
        self.divisor: float | None = None  # Poisson: the configured batch size, what every step divides by
        self.canaries = None  # the one-run audit's gradient canaries (`fedcare.privacy.canaries`), while they train

    def __call__(self, model: nn.Module, batch_size: int) -> None:
        if batch_size == 0:  # an empty Poisson batch: noise alone, on every trained parameter
            named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
            for _, p in named:
                p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        else:
            named = [(n, p) for n, p in model.named_parameters() if p.requires_grad and p.grad is not None]
        missing = [n for n, p in named if getattr(p, "grad_sample", None) is None]
        if missing:
            raise PrivacyError(f"privacy.dp_sgd: no per-example gradient for {missing[:3]}")
        params = [p for _, p in named]
        for p in params:  # under autocast Opacus computes them in the activations' dtype (bf16): clip in the weights'
            p.grad_sample = p.grad_sample.to(p.dtype)
        per_example = torch.stack([p.grad_sample.flatten(1).norm(2, dim=1) for p in params], 1) \
            if params else torch.zeros(batch_size, 0)
        norms = per_example.norm(2, dim=1)
        factor = (self.config.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
        std = self.noise_multiplier * self.config.max_grad_norm
        divisor = batch_size if self.divisor is None else self.divisor
        # the canaries' gradients (norm C each, already within the clipping) join the clipped sum before the noise
        canaries = self.canaries.step(dict(named)) if self.canaries is not None else {}
        for name, p in named:
            examples = p.grad_sample.sum(0)
            penalty = p.grad - examples / max(batch_size, 1)  # weight-only terms: no example in it
            clipped = torch.einsum("i,i...->...", factor, p.grad_sample)
            if name in canaries:
                clipped = clipped + canaries[name]
            noise = (torch.normal(0.0, std, p.shape, generator=self.generator, device=self.generator.device).to(p.device)
                     if std > 0 else 0.0)  # drawn on the host: the same noise on every device
            p.grad = (clipped + noise) / divisor + penalty
            p.grad_sample = None
        self.steps += 1
        self.batch_size = max(self.batch_size, batch_size)


def epsilon(ledger: torch.Tensor, delta: float, accountant: str = "rdp") -> float:
    """Epsilon at `delta` of the steps in `ledger` (rows sigma, q, steps), by Opacus's accountant."""
    rows = tuple((float(s), float(q), int(k)) for s, q, k in ledger.tolist() if k > 0)
    return _epsilon(rows, float(delta), accountant)


@functools.lru_cache(maxsize=4096)  # every round asks it for each client, whose ledgers are often alike
def _epsilon(rows: tuple[tuple[float, float, int], ...], delta: float, accountant: str) -> float:
    from opacus.accountants import PRVAccountant, RDPAccountant

    if not rows:
        return 0.0
    if any(s == 0 for s, _, _ in rows):
        return math.inf
    acc = RDPAccountant() if accountant == "rdp" else PRVAccountant()
    acc.history = list(rows)
    try:
        return float(acc.get_epsilon(delta))
    except (OverflowError, ValueError, FloatingPointError, ZeroDivisionError):
        return math.inf  # noise so small (sigma = 1e-300) the accountant's sums overflow: no guarantee


class PoissonBatches:
    """Poisson sampling (as Opacus's UniformWithReplacementSampler): int(1/q) batches an epoch,
    each taking every example with probability q = batch_size / n; at most `remaining` batches
    in all (None: no limit), the steps DP-SGD's budget still allows."""

    def __init__(self) -> None:
        self.remaining: int | None = None

    @staticmethod
    def rate(n: int, batch_size: int) -> float:
        return min(1.0, batch_size / n)

    def steps_per_epoch(self, n: int, batch_size: int) -> int:
        return int(1 / self.rate(n, batch_size))

    def epoch(self, n: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
        """Opacus's UniformWithReplacementSampler's draws (the same batches from the same
        generator, tests/privacy/test_dp_sgd_budget.py), on the generator's device: torch's default
        device is not assumed."""
        q = self.rate(n, batch_size)
        for _ in range(self.steps_per_epoch(n, batch_size)):
            if self.remaining is not None:
                if self.remaining <= 0:
                    return
                self.remaining -= 1
            mask = torch.rand(n, generator=generator, device=generator.device) < q
            yield mask.nonzero(as_tuple=False).reshape(-1)


class ShuffledBatches:
    """The loop's shuffled batches of fixed size, a trailing one of one example skipped, as
    `train_epochs` draws them (an epsilon that is approximate), with the step limit of
    `PoissonBatches`; used only under a budget (without one the loop draws them itself)."""

    def __init__(self) -> None:
        self.remaining: int | None = None

    def steps_per_epoch(self, n: int, batch_size: int) -> int:
        from fedcare.algorithms.training import batches_per_epoch

        return batches_per_epoch(n, batch_size)

    def epoch(self, n: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
        order = torch.randperm(n, generator=generator, device=generator.device)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            if len(idx) < 2:
                continue
            if self.remaining is not None:
                if self.remaining <= 0:
                    return
                self.remaining -= 1
            yield idx


def calibrated_sigma(config: DPSGD, n: int, batch_size: int) -> float:
    """The noise multiplier with which `budget_epochs` passes over n examples spend exactly
    `target_epsilon` at `delta` (Opacus's get_noise_multiplier, the config's accountant)."""
    return _calibrated(config.target_epsilon, config.delta, config.accountant, config.budget_epochs,
                       min(1.0, batch_size / n))


def calibrate(key: str, target: float, delta: float, accountant: str, q: float, steps: int) -> float:
    """Opacus's get_noise_multiplier for the budget `key` (e.g. "privacy.dp_sgd"); a budget it
    cannot reach is a PrivacyError naming the key, not Opacus's words alone."""
    from opacus.accountants.utils import get_noise_multiplier

    try:
        return float(get_noise_multiplier(target_epsilon=target, target_delta=delta, sample_rate=q, steps=steps,
                                          accountant=accountant))
    except (ValueError, RuntimeError, OverflowError) as e:
        raise PrivacyError(f"{key}.target_epsilon = {target:g}: no noise multiplier spends exactly it at delta = "
                           f"{delta:g} over {steps} steps at sampling rate {q:.3g} ({accountant} accountant: {e}); "
                           "raise target_epsilon or delta") from None


def budget_problem(key: str, target: float, delta: float, accountant: str) -> str | None:
    """Why no noise reaches the budget `target` at `delta` (None: some does). An accountant proves
    no epsilon below its conversion's floor, whatever the noise: Opacus's calibration tries noise
    up to its MAX_SIGMA, then gives up ("The privacy budget is too low"). Checked when the methods
    are built, before any data are read."""
    from opacus.accountants.utils import MAX_SIGMA

    with warnings.catch_warnings():  # Opacus's remarks on its orders at extreme noise
        warnings.simplefilter("ignore")
        floor = _epsilon(((float(MAX_SIGMA), 1.0, 1),), float(delta), accountant)
    if target > floor:
        return None
    return (f"{key}.target_epsilon = {target:g}: below what the {accountant} accountant can prove at delta = "
            f"{delta:g} with any noise (about {floor:.3g}); raise target_epsilon or delta")


@functools.lru_cache(maxsize=64)  # clients of one size share it; the search takes seconds
def _calibrated(target: float, delta: float, accountant: str, epochs: float, q: float) -> float:
    steps = max(1, math.ceil(epochs * int(1 / q)))
    return calibrate("privacy.dp_sgd", target, delta, accountant, q, steps)


def steps_within_budget(ledger: torch.Tensor, sigma: float, q: float, target: float, delta: float,
                        accountant: str = "rdp", most: int = 1 << 24) -> int:
    """The most steps at (sigma, q) that, after those in `ledger`, keep epsilon <= target.
    RDP: closed form (RDP adds up over steps, epsilon is the best order's RDP plus a constant);
    PRV: a binary search over the accountant (epsilon grows with the steps)."""
    if sigma == 0:  # no noise: no step has a finite epsilon
        return 0
    if accountant == "rdp":
        return _rdp_steps_within_budget(ledger, sigma, q, target, delta, most)

    def fits(k: int) -> bool:
        rows = torch.cat([ledger, torch.tensor([[sigma, q, k]], dtype=torch.float64)])
        return epsilon(rows, delta, accountant) <= target

    if not fits(0):
        return 0
    lo, hi = 0, 1
    while hi < most and fits(hi):
        lo, hi = hi, hi * 2
    if hi >= most and fits(most):
        return most
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


@functools.lru_cache(maxsize=1024)  # every fit asks it again for the same (q, sigma); each call takes ~0.2 s
def _one_step_rdp(q: float, sigma: float) -> tuple[float, ...]:
    """One DP-SGD step's RDP at Opacus's default orders (the RDP of k steps is k times it)."""
    import numpy as np
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp

    orders = np.array(RDPAccountant.DEFAULT_ALPHAS, dtype=float)
    return tuple(float(v) for v in compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=orders))


def _rdp_steps_within_budget(ledger: torch.Tensor, sigma: float, q: float, target: float, delta: float,
                             most: int) -> int:
    """Opacus's RDP accountant's epsilon at order a is R_a + c_a (its get_privacy_spent), R_a
    the ledger's RDP plus k times one step's: the largest k with some order under target."""
    import numpy as np
    from opacus.accountants import RDPAccountant

    orders = np.array(RDPAccountant.DEFAULT_ALPHAS, dtype=float)
    spent = sum((int(k) * np.array(_one_step_rdp(float(qq), float(s))) for s, qq, k in ledger.tolist() if k > 0),
                np.zeros_like(orders))
    step = np.array(_one_step_rdp(float(q), float(sigma)))
    constant = -(np.log(delta) + np.log(orders)) / (orders - 1) + np.log((orders - 1) / orders)
    with np.errstate(divide="ignore", invalid="ignore"):
        room = np.floor((target - constant - spent) / step)
    room = room[np.isfinite(room)]
    best = int(min(max(room.max(), 0), most)) if len(room) else 0
    # float rounding at the boundary: settle it with the accountant itself
    rows = lambda k: torch.cat([ledger, torch.tensor([[sigma, q, k]], dtype=torch.float64)])  # noqa: E731
    while best > 0 and epsilon(rows(best), delta) > target:
        best -= 1
    while best < most and epsilon(rows(best + 1), delta) <= target:
        best += 1
    return best


class DPSGDClient(DelegatingClient):
    """Any client half with every one of its training steps under DP-SGD. It delegates to
    `inner` (whose settings get the clipping hook and the batch sampler) and keeps the privacy
    ledger in the state."""

    reports_privacy = True  # `evaluate` with PRIVACY_METRICS answers what the client has spent

    def __init__(self, inner: ClientHalf, config: DPSGD):
        if config.target_epsilon is not None and (why := budget_problem("privacy.dp_sgd", config.target_epsilon,
                                                                         config.delta, config.accountant)):
            raise PrivacyError(why)
        super().__init__(inner)
        self.config = config
        self.hook = PerExampleClipNoise(config)
        self.batches = PoissonBatches() if config.sampling == "poisson" else ShuffledBatches()
        # reaches the half that trains; shuffled without a budget: the loop's own batches, as before Poisson
        plain = config.sampling == "shuffle" and config.target_epsilon is None
        self.settings = replace(inner.settings, gradient_hook=self.hook, batches=None if plain else self.batches)

    def fit(self, model, message, state, data, rng):
        state = self._calibrate(state, len(data))
        if self._allowed(state, len(data)) == 0:  # the budget is spent: no training, no update of its own
            reply = Message(dict(message.tensors), {NUM_EXAMPLES: 0.0, TRAIN_LOSS: math.nan, DP_SKIPPED: 1.0,
                                                    DP_EPSILON: self._epsilon(state)})
            return reply, state
        with self._private(model, state, data, rng, "fit") as ledger:
            reply, new_state = self.inner.fit(model, message, state, data, rng)
        new_state = {**new_state, LEDGER: ledger(), **({SIGMA: state[SIGMA]} if SIGMA in state else {})}
        reply.scalars[DP_EPSILON] = self._epsilon(new_state)
        return reply, new_state

    def after_aggregation(self, model, message, state, data, rng):
        state = self._calibrate(state, len(data))
        if self._allowed(state, len(data)) == 0:
            return state
        with self._private(model, state, data, rng, "after-aggregation") as ledger:
            new_state = self.inner.after_aggregation(model, message, state, data, rng)
        return {**new_state, LEDGER: ledger(), **({SIGMA: state[SIGMA]} if SIGMA in state else {})}

    def evaluate(self, model, message, state, data, metrics, rng=None):
        if metrics == PRIVACY_METRICS:
            return self.spent(state)
        return self.inner.evaluate(model, message, state, data, metrics, rng)

    def spent(self, state: ClientState) -> dict:
        """What this client has spent over the whole run (every fit and fine-tuning): numbers
        only, as evaluation metrics travel (Flower's MetricRecord)."""
        ledger = state.get(LEDGER, torch.zeros(0, 3, dtype=torch.float64))
        return {DP_EPSILON: self._epsilon(state), "dp_steps": int(ledger[:, 2].sum().item()) if len(ledger) else 0,
                "dp_sigma": self._sigma(state)}

    # -- the budget ------------------------------------------------------------------------
    def _sigma(self, state: ClientState) -> float:
        return float(state[SIGMA]) if SIGMA in state else self.config.noise_multiplier

    def _epsilon(self, state: ClientState) -> float:
        return epsilon(state.get(LEDGER, torch.zeros(0, 3, dtype=torch.float64)), self.config.delta,
                       self.config.accountant)

    def _calibrate(self, state: ClientState, n: int) -> ClientState:
        """Under target_epsilon: sigma fixed at the client's first training, kept in its state."""
        if self.config.target_epsilon is None or SIGMA in state:
            return state
        sigma = calibrated_sigma(self.config, n, self.settings.batch_size)
        return {**state, SIGMA: torch.tensor([sigma], dtype=torch.float64)}  # 1-d: every runtime stores it

    def _allowed(self, state: ClientState, n: int) -> int | None:
        """Steps the budget still allows (None: no budget); sets the sampler's limit."""
        if self.config.target_epsilon is None:
            self.batches.remaining = None
            return None
        ledger = state.get(LEDGER, torch.zeros(0, 3, dtype=torch.float64))
        q = min(1.0, self.settings.batch_size / n)
        self.batches.remaining = steps_within_budget(ledger, self._sigma(state), q, self.config.target_epsilon,
                                                     self.config.delta, self.config.accountant)
        return self.batches.remaining

    @contextmanager
    def _private(self, model: nn.Module, state: ClientState, data: ClientData, rng: Randomness, purpose: str):
        """Per-example gradient hooks on `model` while the inner half trains; yields a function
        returning the ledger with the steps taken appended."""
        from opacus import GradSampleModule

        self.hook.generator = rng.torch(f"dp-sgd-noise/{purpose}")
        self.hook.steps = self.hook.batch_size = 0
        self.hook.noise_multiplier = self._sigma(state)
        # Poisson: every step divides by the configured batch size, a public constant (dividing by
        # q n = min(batch, n) would divide by the client's private example count when it holds
        # fewer than a batch: Opacus #819, #571)
        poisson = isinstance(self.batches, PoissonBatches)
        self.hook.divisor = self.settings.batch_size if poisson else None
        with warnings.catch_warnings():  # Opacus's full backward hooks on a first layer whose input needs no gradient
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            grad_sample = GradSampleModule(model, strict=False)
            try:
                yield lambda: self._ledger(state, len(data))
            finally:
                grad_sample.cleanup()

    def _ledger(self, state: ClientState, n: int) -> torch.Tensor:
        old = state.get(LEDGER, torch.zeros(0, 3, dtype=torch.float64, device="cpu"))
        if self.hook.steps == 0:
            return old
        # the accountant's q: the sampling rate (Poisson), or batch / n for shuffled batches
        q = min(1.0, self.settings.batch_size / n) if isinstance(self.batches, PoissonBatches) \
            else min(1.0, self.hook.batch_size / n)
        row = torch.tensor([[self._sigma(state), q, self.hook.steps]], dtype=torch.float64, device="cpu")
        if len(old) and torch.equal(old[-1, :2], row[0, :2]):  # same sigma and rate: one row
            return torch.cat([old[:-1], old[-1:] + torch.tensor([[0.0, 0.0, self.hook.steps]], dtype=torch.float64,
                                                                 device="cpu")])
        return torch.cat([old, row])

"""Sample-level DP-SGD at each client (Abadi et al. 2016) on fedcare's one training loop.

Opacus computes per-example gradients (`GradSampleModule`'s hooks on the model's layers);
the training loop's gradient hook (`PerExampleClipNoise`) clips each example's gradient to
C, adds Gaussian noise N(0, (sigma C)^2) to the batch's sum and divides by the batch size.
Every training step of a client (its fit, and fine-tuning after aggregation such as PFDL's)
goes through it and is counted; the client's accountant (Opacus's RDP or PRV) turns the
steps into epsilon for the target delta.

Choices written down:
- Sampling. The loop draws batches by shuffling (fixed size), while the accountants assume
  Poisson sampling at rate batch/n. This is common practice (and what most DP-SGD papers
  report) but the epsilon is then an approximation of the guarantee, not a proof of it.
- The ledger (`extra/privacy/dp_sgd`, rows of (sigma, q, steps)) is client state and is never
  rolled back: early stopping that restores an earlier round does not undo released updates.
- BatchNorm mixes examples; it is replaced by GroupNorm (`private_model`). A frozen,
  inference-mode BatchNorm would be per-example, but its statistics came from the private
  data without noise, so it is not offered.
- A weight-only penalty (FedProx's proximal term, FedDyn's regulariser) depends on no example:
  its gradient (what backward produced beyond the per-example gradients) is added unclipped.
"""

from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from dataclasses import replace

import torch
from torch import nn

from fedcare.algorithms.base import DP_EPSILON, ClientHalf, DelegatingClient
from fedcare.algorithms.messages import ClientState
from fedcare.algorithms.training import ClientData, Randomness
from fedcare.config import DPSGD
from fedcare.runtime.clients import PRIVACY_LEDGER

LEDGER = PRIVACY_LEDGER + "dp_sgd"  # rows (noise multiplier, sample rate, steps)


class PrivacyError(ValueError):
    """A protection that cannot apply to this model or algorithm; the message says why."""


def private_model(model: nn.Module, config: DPSGD) -> nn.Module:
    """The model with every BatchNorm replaced by GroupNorm (Opacus's ModuleValidator), or an
    error naming the layers when `batchnorm = "refuse"` (or another layer Opacus cannot handle)."""
    from opacus.validators import ModuleValidator

    if config.batchnorm == "groupnorm":
        model = ModuleValidator.fix(model)
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
        self.generator: torch.Generator | None = None
        self.steps = 0
        self.batch_size = 0  # the largest batch seen (the accountant's sample rate)

    def __call__(self, model: nn.Module, batch_size: int) -> None:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad and p.grad is not None]
        missing = [n for n, p in named if getattr(p, "grad_sample", None) is None]
        if missing:
            raise PrivacyError(f"privacy.dp_sgd: no per-example gradient for {missing[:3]}")
        params = [p for _, p in named]
        for p in params:  # under autocast Opacus computes them in the activations' dtype (bf16): clip in the weights'
            p.grad_sample = p.grad_sample.to(p.dtype)
        per_example = torch.stack([p.grad_sample.reshape(batch_size, -1).norm(2, dim=1) for p in params], 1)
        norms = per_example.norm(2, dim=1)
        factor = (self.config.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
        std = self.config.noise_multiplier * self.config.max_grad_norm
        for p in params:
            examples = p.grad_sample.sum(0)
            penalty = p.grad - examples / batch_size  # weight-only terms: no example in it
            clipped = torch.einsum("i,i...->...", factor, p.grad_sample)
            noise = (torch.normal(0.0, std, p.shape, generator=self.generator, device=self.generator.device).to(p.device)
                     if std > 0 else 0.0)  # drawn on the host: the same noise on every device
            p.grad = (clipped + noise) / batch_size + penalty
            p.grad_sample = None
        self.steps += 1
        self.batch_size = max(self.batch_size, batch_size)


def epsilon(ledger: torch.Tensor, delta: float, accountant: str = "rdp") -> float:
    """Epsilon at `delta` of the steps in `ledger` (rows sigma, q, steps), by Opacus's accountant."""
    from opacus.accountants import PRVAccountant, RDPAccountant

    rows = [(float(s), float(q), int(k)) for s, q, k in ledger.tolist() if k > 0]
    if not rows:
        return 0.0
    if any(s == 0 for s, _, _ in rows):
        return math.inf
    acc = RDPAccountant() if accountant == "rdp" else PRVAccountant()
    acc.history = rows
    try:
        return float(acc.get_epsilon(delta))
    except (OverflowError, ValueError, FloatingPointError, ZeroDivisionError):
        return math.inf  # noise so small (sigma = 1e-300) the accountant's sums overflow: no guarantee


class DPSGDClient(DelegatingClient):
    """Any client half with every one of its training steps under DP-SGD. It delegates to
    `inner` (whose settings get the clipping hook) and keeps the privacy ledger in the state."""

    def __init__(self, inner: ClientHalf, config: DPSGD):
        super().__init__(inner)
        self.config = config
        self.hook = PerExampleClipNoise(config)
        self.settings = replace(inner.settings, gradient_hook=self.hook)  # reaches the half that trains

    def fit(self, model, message, state, data, rng):
        with self._private(model, state, data, rng, "fit") as ledger:
            reply, new_state = self.inner.fit(model, message, state, data, rng)
        new_state = {**new_state, LEDGER: ledger()}
        reply.scalars[DP_EPSILON] = epsilon(new_state[LEDGER], self.config.delta, self.config.accountant)
        return reply, new_state

    def after_aggregation(self, model, message, state, data, rng):
        with self._private(model, state, data, rng, "after-aggregation") as ledger:
            new_state = self.inner.after_aggregation(model, message, state, data, rng)
        return {**new_state, LEDGER: ledger()}

    @contextmanager
    def _private(self, model: nn.Module, state: ClientState, data: ClientData, rng: Randomness, purpose: str):
        """Per-example gradient hooks on `model` while the inner half trains; yields a function
        returning the ledger with the steps taken appended."""
        from opacus import GradSampleModule

        self.hook.generator = rng.torch(f"dp-sgd-noise/{purpose}")
        self.hook.steps = self.hook.batch_size = 0
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
        row = torch.tensor([[self.config.noise_multiplier, min(1.0, self.hook.batch_size / n), self.hook.steps]],
                           dtype=torch.float64, device="cpu")
        if len(old) and torch.equal(old[-1, :2], row[0, :2]):  # same sigma and rate: one row
            return torch.cat([old[:-1], old[-1:] + torch.tensor([[0.0, 0.0, self.hook.steps]], dtype=torch.float64,
                                                                 device="cpu")])
        return torch.cat([old, row])

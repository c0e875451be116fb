"""Server optimizers on the pseudo-gradient (FedOpt, Reddi et al. 2021; FedAvgM, Hsu et al.
2019; and the server AdamW the surgical thesis runs under every algorithm).

`OptimizedServer` wraps any server half whose `aggregate` returns an average. The inner
server's new global message is the *target*; the wrapper forms the pseudo-gradient

    Δ_t = avg_t − w_t          (per tensor: the averaged message minus the current one)

and moves w_t with an optimizer instead of jumping to avg_t. Everything else (initial
message, setup exchange, per-client payloads, weighting) is the inner server's.

Which tensors the optimizer moves
---------------------------------
- Floating-point **parameters** of the model: always.
- Integer tensors (BatchNorm's `num_batches_tracked`): never; they take the inner average.
- Floating-point **buffers** (BatchNorm running mean/var): `buffers="average"` (default)
  takes the inner average, as FedAvg would; `buffers="optimize"` treats them like parameters.
  Flower sees only anonymous arrays and optimizes all of them; we default to averaging
  because running statistics are not trained by gradients and an adaptive step of size
  ~eta (FedAdam's default eta = 0.1) can push a running variance below zero.
  Buffers are recognised by module structure (`model.named_buffers()` of the model handed to
  `initial_message`), never by name. The simulator calls `initial_message` for the first
  global message and a Flower adapter must do the same; `aggregate` refuses to guess if it
  was never called.

The optimizers (t = 1, 2, ... counts this server's aggregation steps; state lives on the
wrapper, so the simulator's snapshot/restore of the server also restores the moments)
-------------------------------------------------------------------------------------
``fedadam`` (hyper: eta=0.1, eta_l=0.1, beta_1=0.9, beta_2=0.99, tau=1e-3,
bias_correction="flower", initial_accumulator=0.0 — Flower 1.41's defaults)::

    m_t = β1 m + (1 − β1) Δ;  v_t = β2 v + (1 − β2) Δ²
    w_{t+1} = w_t + α_t m_t / (√v_t + τ)

  with α_t by `bias_correction`: "flower" (default) α_t = η √(1 − β2^{t+1}) / (1 − β1^{t+1}),
  exactly what Flower 1.41's FedAdam computes (it uses `server_round + 1` with server rounds
  counted from 1, i.e. one step ahead of Kingma & Ba); "adam" uses the exponent t as Kingma
  & Ba's α_t does; "none" is Reddi et al.'s Algorithm 2, which has no bias correction.
``fedyogi`` (eta=1e-2, eta_l=0.0316, beta_1=0.9, beta_2=0.99, tau=1e-3 — Flower's)::

    v_t = v − (1 − β2) Δ² sign(v − Δ²);  w_{t+1} = w_t + η m_t / (√v_t + τ)
``fedadagrad`` (eta=0.1, eta_l=0.1, tau=1e-3, beta_1=0.0 — Flower's; Flower fixes β1 = 0)::

    v_t = v + Δ²;  w_{t+1} = w_t + η m_t / (√v_t + τ)

  For all three Flower starts v at 0 (`initial_accumulator=0.0`, our default); Reddi et al.'s
  Algorithm 2 asks v_{−1} ≥ τ², available as `initial_accumulator=tau**2`. `eta_l` is the
  client learning rate; Flower accepts it for the record and so do we: the server never uses it.
``fedavgm`` (server_learning_rate=1.0, server_momentum=0.9): with g = −Δ (updates are the
  opposite of gradients), torch.optim.SGD's momentum convention as Flower's FedAvgM::

    b_1 = g_1;  b_t = μ b_{t−1} + g_t;  w_{t+1} = w_t − lr · b_t

  **Default differs from Flower**: Flower's `server_momentum` defaults to 0.0, which makes
  FedAvgM plain FedAvg; we default to μ = 0.9, the value Hsu et al. found best. Pass
  `server_momentum=0.0` for Flower's default.
``adamw`` (lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2 — torch's defaults,
  which the surgical thesis most likely used with lr 1e-3): torch.optim.AdamW applied to
  the current global tensor as a parameter whose gradient is g = −Δ (the pseudo-gradient
  read as a gradient: moving along −g is moving towards the average)::

    w ← w (1 − lr·λ);  m = β1 m + (1 − β1) g;  v = β2 v + (1 − β2) g²
    w ← w − (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + eps)

  amsgrad, maximize and the foreach/fused variants are not offered.

Learning-rate schedule: `lr_factor(t)` (default none: constant) multiplies each optimizer's
rate at step t (`eta`, `server_learning_rate` or `lr`; AdamW's decoupled decay uses the scaled
`lr`, as a torch scheduler's would). `CosineAnneal` is the annealing half of a one-cycle
schedule. No paper fedcare reproduces schedules its server; the surgical study offers it
(`train.server_anneal`) to show what the thesis's constant server rate does to convergence.

Numerics: the update runs in the tensor's dtype (float32 for float32 models, like Flower's
numpy arithmetic and like torch optimizers), moments are stored in that dtype too.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import torch
from torch import nn

from fedcare.algorithms.base import Algorithm, ClientId, DelegatingServer, Needs, ServerHalf
from fedcare.algorithms.messages import Message

# Every optimizer's hyper-parameters and defaults. Unknown names are an error.
DEFAULTS: dict[str, dict[str, object]] = {
    "fedadam": {"eta": 1e-1, "eta_l": 1e-1, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-3,
                "bias_correction": "flower", "initial_accumulator": 0.0},
    "fedyogi": {"eta": 1e-2, "eta_l": 0.0316, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-3,
                "initial_accumulator": 0.0},
    "fedadagrad": {"eta": 1e-1, "eta_l": 1e-1, "beta_1": 0.0, "tau": 1e-3, "initial_accumulator": 0.0},
    "fedavgm": {"server_learning_rate": 1.0, "server_momentum": 0.9},
    "adamw": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2},
}
OPTIMIZERS = tuple(DEFAULTS)
BIAS_CORRECTIONS = ("flower", "adam", "none")


def _resolve(optimizer: str, hyper: Mapping[str, object]) -> dict[str, object]:
    if optimizer not in DEFAULTS:
        raise ValueError(f"unknown server optimizer {optimizer!r}; choose one of {OPTIMIZERS}")
    unknown = set(hyper) - set(DEFAULTS[optimizer])
    if unknown:
        raise TypeError(f"{optimizer} takes {sorted(DEFAULTS[optimizer])}, not {sorted(unknown)}")
    h = {**DEFAULTS[optimizer], **hyper}
    if optimizer == "fedadam" and h["bias_correction"] not in BIAS_CORRECTIONS:
        raise ValueError(f"bias_correction must be one of {BIAS_CORRECTIONS}, got {h['bias_correction']!r}")
    if optimizer == "adamw":
        h["betas"] = tuple(float(b) for b in h["betas"])  # type: ignore[union-attr]
        if len(h["betas"]) != 2:
            raise ValueError(f"betas must be two numbers, got {h['betas']}")
    for name in ("eta", "lr", "server_learning_rate"):
        if name in h and not float(h[name]) > 0:  # type: ignore[arg-type]
            raise ValueError(f"{name} must be positive, got {h[name]}")
    return h


@dataclass(frozen=True)
class CosineAnneal:
    """A learning-rate factor: 1 for the first `hold` steps, then cosine from 1 down to 0 at
    step `steps` (0 after), as torch's OneCycleLR anneals after its warm-up."""

    hold: int
    steps: int

    def __call__(self, t: int) -> float:
        if t <= self.hold:
            return 1.0
        if t >= self.steps:
            return 0.0
        return (1 + math.cos(math.pi * (t - self.hold) / (self.steps - self.hold))) / 2


class OptimizedServer(DelegatingServer):
    """`inner`'s average as the target of a server optimizer step (see the module docstring)."""

    steps_from_inner = True  # its step reads the inner's aggregate alone: a robust rule or client DP goes inside

    @property
    def needs(self) -> Needs:  # type: ignore[override]
        """No longer the mean itself but a step from it: it reads what its inner reads, at least the sum."""
        return "sum" if self.inner.needs == "mean" else self.inner.needs

    def __init__(self, inner: ServerHalf, optimizer: str, *, buffers: str = "average",
                 lr_factor: Callable[[int], float] | None = None, **hyper: object):
        if buffers not in ("average", "optimize"):
            raise ValueError(f"buffers must be 'average' or 'optimize', got {buffers!r}")
        super().__init__(inner)
        self.optimizer = optimizer
        self.hyper = _resolve(optimizer, hyper)
        self.lr_factor = lr_factor  # step t -> multiplier of the rate (None: constant)
        self.buffers = buffers
        self.buffer_names: frozenset[str] | None = None  # learnt in initial_message
        self.step = 0  # optimizer steps taken (t)
        self.moments: dict[str, dict[str, torch.Tensor]] = {}  # e.g. {"m": {name: tensor}, "v": {...}}

    # --- the inner server's business (split, weighting, setup, per-client messages: DelegatingServer) --
    def initial_message(self, model: nn.Module) -> Message:
        self.buffer_names = frozenset(name for name, _ in model.named_buffers())
        return self.inner.initial_message(model)

    # --- the optimizer step ----------------------------------------------------------------
    def optimized(self, name: str, current: torch.Tensor, target: torch.Tensor) -> bool:
        if not (current.is_floating_point() and target.is_floating_point()) or current.shape != target.shape:
            return False
        if self.buffers == "optimize":
            return True
        if self.buffer_names is None:
            raise RuntimeError(
                "OptimizedServer needs initial_message(model) first: it tells parameters from buffers "
                "(or construct it with buffers='optimize')"
            )
        return name not in self.buffer_names

    def aggregate(self, current: Message, replies: Mapping[ClientId, Message]) -> Message:
        target = self.inner.aggregate(current, replies)
        if not replies or target is current:
            return target  # nothing arrived: no step, moments untouched
        names = [n for n, t in target.tensors.items() if n in current.tensors and self.optimized(n, current.tensors[n], t)]
        if not names:
            return target
        self.step += 1
        out = dict(target.tensors)
        for name in names:
            old = current.tensors[name]
            dtype = torch.promote_types(old.dtype, torch.float32)
            w = old.detach().to(dtype)
            delta = target.tensors[name].detach().to(dtype) - w
            out[name] = self._update(name, w, delta).to(old.dtype)
        return Message(out, dict(target.scalars))

    def _moment(self, kind: str, name: str, like: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        store = self.moments.setdefault(kind, {})
        if name not in store or store[name].shape != like.shape:
            store[name] = torch.full_like(like, fill)
        return store[name]

    def _update(self, name: str, w: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        t = self.step
        h = dict(self.hyper)
        if self.lr_factor is not None:
            rate = {"fedavgm": "server_learning_rate", "adamw": "lr"}.get(self.optimizer, "eta")
            h[rate] = float(h[rate]) * self.lr_factor(t)
        if self.optimizer in ("fedadam", "fedyogi", "fedadagrad"):
            b1, tau, eta = float(h["beta_1"]), float(h["tau"]), float(h["eta"])
            m = self._moment("m", name, w).mul_(b1).add_(delta, alpha=1 - b1)
            v = self._moment("v", name, w, float(h["initial_accumulator"]))
            d2 = delta * delta
            if self.optimizer == "fedadam":
                b2 = float(h["beta_2"])
                v.mul_(b2).add_(d2, alpha=1 - b2)
                k = {"flower": t + 1, "adam": t}.get(str(h["bias_correction"]))
                if k is not None:
                    eta = eta * math.sqrt(1 - b2**k) / (1 - b1**k)
            elif self.optimizer == "fedyogi":
                v.sub_((1 - float(h["beta_2"])) * d2 * torch.sign(v - d2))
            else:
                v.add_(d2)
            return w + eta * m / (v.sqrt() + tau)
        if self.optimizer == "fedavgm":
            g = -delta
            mu, lr = float(h["server_momentum"]), float(h["server_learning_rate"])
            store = self.moments.setdefault("momentum", {})
            if mu != 0.0:
                if name not in store or store[name].shape != g.shape:
                    store[name] = g.clone()  # first step: the buffer is the gradient (torch SGD, Flower)
                else:
                    store[name].mul_(mu).add_(g)
                g = store[name]
            return w - lr * g
        # adamw, in torch.optim.AdamW's single-tensor order of operations
        g = -delta
        lr, (b1, b2), eps, wd = float(h["lr"]), h["betas"], float(h["eps"]), float(h["weight_decay"])
        w = w.mul(1 - lr * wd)
        m = self._moment("m", name, w).lerp_(g, 1 - b1)
        v = self._moment("v", name, w).mul_(b2).addcmul_(g, g, value=1 - b2)
        bc1, bc2 = 1 - b1**t, 1 - b2**t
        denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
        return w.addcdiv(m, denom, value=-lr / bc1)


def with_server_optimizer(algorithm: Algorithm, name: str, *, buffers: str = "average",
                          lr_factor: Callable[[int], float] | None = None, **hyper: object) -> Algorithm:
    """A new Algorithm: the same client half, its server half wrapped in `OptimizedServer`.

    Meant for algorithms whose server averages (FedAvg, FedProx, FedDG, PFDL, FedBN, ...).
    Only the global message is optimized: per-client payloads a server hands out through
    `message_for` (FedAP's personalised aggregates) pass through untouched. The inner server
    is a deep copy, so the original algorithm keeps its own, unshared state.
    """
    server = OptimizedServer(copy.deepcopy(algorithm.server), name, buffers=buffers, lr_factor=lr_factor, **hyper)
    return replace(algorithm, name=f"{algorithm.name}+{name}", server=server)

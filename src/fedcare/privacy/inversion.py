"""Gradient inversion: what an honest-but-curious server rebuilds from one client's update.

The attack is "inverting gradients" (Geiping et al. 2020): dummy images are optimised (Adam on
the signed gradient, step decay, pixels boxed to [0, 1]) until the gradient they produce on the
same model matches the observed one in cosine distance, with a total-variation prior that
favours smooth images. The attacker knows the model (it sent it), the batch size and the
labels (assumed known: the worst case for the client; in a binary task a guess would cost at
most 2^B tries).

The observed update is FedSGD-style: the gradient of one step on one batch of B frames
(`observed_gradient`: of every parameter, or of the ones a split shares,
`shared_parameter_names`), or what fedcare's DP-SGD releases for it (`dp_sgd_gradient`:
each example's gradient clipped to C, summed, Gaussian noise of std sigma * C added, divided
by B, by `fedcare.privacy.dp_sgd`'s own hook). FedAvg's multi-step updates mix many gradients
and are harder to invert; they are not attacked here. The attacker runs its dummy batch
through the model in the same mode (BatchNorm in train mode normalises with the batch's own
statistics), so it faces exactly the function the client differentiated. The cases the
privacy audit study attacks are in `fedcare.studies.privacy_audit.inversion`.

Scores: PSNR and SSIM (scikit-image) of each reconstruction against its true frame, matched
by the best assignment (the attacker does not know the order); the baseline is a flat image
at each true frame's mean intensity, what "nothing recovered" scores.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from skimage.metrics import peak_signal_noise_ratio, structural_similarity
from torch import nn

from fedcare.algorithms import pfdl
from fedcare.algorithms.training import TrainSettings
from fedcare.config import DPSGD
from fedcare.privacy.dp_sgd import PerExampleClipNoise
from fedcare.tasks import BINARY


@dataclass(frozen=True)
class InversionSettings:
    steps: int = 300  # about 45 s for the demo's five cases on one thread
    lr: float = 0.1
    tv: float = 1e-2  # weight of the total-variation prior
    batch: int = 2
    image_size: int = 32  # the pain demo's frames
    sigma: float = 1.0  # DP-SGD's noise multiplier
    max_grad_norm: float = 1.0  # DP-SGD's C


@dataclass(frozen=True)
class Scores:
    psnr: float
    ssim: float


# -- what the server observes ---------------------------------------------------------------
def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return BINARY.loss(model(x), y)


def observed_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor, names: list[str]) -> dict[str, torch.Tensor]:
    """The batch's mean-loss gradient of the parameters `names`: one FedSGD step's update."""
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(loss_of(model, x, y), [params[n] for n in names])
    return {n: g.detach() for n, g in zip(names, grads)}


def dp_sgd_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: DPSGD,
                    generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The gradient fedcare's DP-SGD releases for this batch: Opacus's per-example gradients,
    clipped, summed and noised by the training loop's own hook (`PerExampleClipNoise`)."""
    from opacus import GradSampleModule

    hook = PerExampleClipNoise(config)
    hook.generator = generator
    model.zero_grad(set_to_none=True)
    with warnings.catch_warnings():  # Opacus's full backward hook on a first layer whose input needs no gradient
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        wrapped = GradSampleModule(model, strict=False)
        try:
            loss_of(model, x, y).backward()
            hook(model, len(x))
        finally:
            wrapped.cleanup()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


def shared_parameter_names(model: nn.Module, shared_paths: tuple[str, ...] | None = None) -> list[str]:
    """The parameters PFDL sends (its ParameterSplit over `shared_paths`, default PFDL's own:
    the pain CNN's conv blocks), in model order."""
    paths = {} if shared_paths is None else {"shared_paths": shared_paths}
    shared = set(pfdl(TrainSettings(task=BINARY), **paths).client.split.shared_keys(model))
    return [n for n, _ in model.named_parameters() if n in shared]


# -- the attack ---------------------------------------------------------------------------
def total_variation(x: torch.Tensor) -> torch.Tensor:
    return (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., :, 1:] - x[..., :, :-1]).abs().mean()


def cosine_distance(a: list[torch.Tensor], b: list[torch.Tensor]) -> torch.Tensor:
    """1 - cos between the concatenated gradients (Geiping et al.'s matching loss)."""
    dot = sum((u * v).sum() for u, v in zip(a, b))
    norm_a = torch.sqrt(sum(u.pow(2).sum() for u in a))
    norm_b = torch.sqrt(sum(v.pow(2).sum() for v in b))
    return 1 - dot / (norm_a * norm_b + 1e-12)


def invert(model: nn.Module, observed: dict[str, torch.Tensor], y: torch.Tensor, shape: tuple[int, ...],
           settings: InversionSettings, generator: torch.Generator) -> torch.Tensor:
    """Dummy images in [0, 1] whose gradient on `model` (same mode, labels `y`) matches `observed`."""
    params = dict(model.named_parameters())
    names = list(observed)
    targets = [observed[n] for n in names]
    dummy = torch.rand(shape, generator=generator).requires_grad_(True)
    optimiser = torch.optim.Adam([dummy], lr=settings.lr)
    milestones = [int(settings.steps * f) for f in (3 / 8, 5 / 8, 7 / 8)]
    schedule = torch.optim.lr_scheduler.MultiStepLR(optimiser, milestones, gamma=0.1)
    for _ in range(settings.steps):
        optimiser.zero_grad()
        grads = torch.autograd.grad(loss_of(model, dummy, y), [params[n] for n in names], create_graph=True)
        objective = cosine_distance(list(grads), targets) + settings.tv * total_variation(dummy)
        dummy.grad, = torch.autograd.grad(objective, [dummy])
        dummy.grad.sign_()  # Geiping et al.'s signed gradient: steadier steps
        optimiser.step()
        schedule.step()
        with torch.no_grad():
            dummy.clamp_(0, 1)
    return dummy.detach()


# -- scores -------------------------------------------------------------------------------
def _pair(true: np.ndarray, guess: np.ndarray) -> Scores:
    return Scores(float(peak_signal_noise_ratio(true, guess, data_range=1.0)),
                  float(structural_similarity(true, guess, data_range=1.0)))


def match(true: torch.Tensor, recon: torch.Tensor) -> tuple[list[int], Scores]:
    """The reconstruction order that best fits the true frames (highest total SSIM) and the
    mean PSNR / SSIM of the matched pairs. Images (B, 1, S, S) in [0, 1]."""
    t, r = true[:, 0].double().numpy(), recon[:, 0].double().numpy()
    pairs = [[_pair(t[i], r[j]) for j in range(len(r))] for i in range(len(t))]
    rows, cols = linear_sum_assignment(-np.array([[p.ssim for p in row] for row in pairs]))
    chosen = [pairs[i][j] for i, j in zip(rows, cols)]
    return [int(j) for j in cols], Scores(float(np.mean([p.psnr for p in chosen])),
                                          float(np.mean([p.ssim for p in chosen])))


def flat_baseline(true: torch.Tensor) -> Scores:
    """A flat image at each true frame's mean intensity: what recovering nothing scores."""
    return match(true, true.mean(dim=(2, 3), keepdim=True).expand_as(true).clone())[1]

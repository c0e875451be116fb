"""Gradient inversion: what an honest-but-curious server rebuilds from one client's update.

The attack is "inverting gradients" (Geiping et al. 2020): dummy images are optimised (Adam on
the signed gradient, step decay, pixels boxed to [0, 1]) until the gradient they produce on the
same model matches the observed one in cosine distance, with a total-variation prior that
favours smooth images. The attacker knows the model (it sent it), the batch size and the
labels (assumed known: the worst case for the client; in a binary task a guess would cost at
most 2^B tries).

The observed update is FedSGD-style: the gradient of one step on one batch of B frames.
FedAvg's multi-step updates (several epochs of steps) mix many gradients and are harder to
invert; they are not attacked here. Three things the server may see:

- "full": every parameter's gradient (FedAvg, FedSGD);
- "conv-only": only the tensors PFDL shares (its `ParameterSplit` decides: the pain study's
  conv blocks), the dense layers' gradients stay at the client;
- "DP-SGD": what fedcare's DP-SGD releases: each example's gradient clipped to C, summed,
  Gaussian noise of std sigma * C added, divided by B (`fedcare.privacy.dp_sgd`'s hook).
  DP-SGD replaces BatchNorm by GroupNorm, so this case attacks the GroupNorm model;
  "full, GroupNorm" (the same model without clipping and noise) separates the two effects.

BatchNorm: the client trains in train mode, where BatchNorm normalises with the batch's own
statistics (the examples of the batch mix). The attacker runs its dummy batch through the
same train-mode model, so it faces exactly the function the client differentiated.

Scores: PSNR and SSIM (scikit-image) of each reconstruction against its true frame, matched
by the best assignment (the attacker does not know the order); the baseline is a flat image
at each true frame's mean intensity, what "nothing recovered" scores.
"""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from skimage.metrics import peak_signal_noise_ratio, structural_similarity
from torch import nn

from fedcare.algorithms import pfdl
from fedcare.algorithms.training import TrainSettings, as_float
from fedcare.config import DPSGD
from fedcare.privacy.dp_sgd import PerExampleClipNoise, private_model
from fedcare.seeding import numpy_rng, torch_generator
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


# -- the frames ---------------------------------------------------------------------------
def synthetic_frames(count: int, image_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` synthetic pain frames (B, 1, S, S) in [0, 1] and their labels, drawn from one
    subject written by fedcare's generator and read back by the UNBC loader with the pain
    study's preprocessing (histogram equalisation, centre crop: `fedcare.data.transforms`)."""
    from fedcare.data.unbc.synthetic import generate_pain_cohort
    from fedcare.data.transforms import centre_crop, preprocess
    from fedcare.data.unbc.reader import load_unbc, read_grey

    subject, pain_from = 42, 1.0  # pain = PSPI >= 1, the pain study's threshold
    sessions: dict[int, list[tuple[np.ndarray, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="fedcare-inversion-") as tmp:
        root = Path(tmp) / "cohort"
        generate_pain_cohort(root, seed=seed, subjects=[subject], frame_scale=0.01, image_size=2 * image_size,
                             min_frames_per_sequence=2)
        for frame in load_unbc(root).frames:  # read and preprocessed as the pain study does (black frames dropped)
            grey = read_grey(frame.image)
            if frame.subject == subject and grey.mean() >= 1.0:
                image = centre_crop(preprocess(grey, image_size), image_size)
                sessions.setdefault(frame.session, []).append((image, float(frame.pspi >= pain_from)))
    items = [item for s in sorted(sessions) for item in sessions[s]]
    images, labels = np.stack([i for i, _ in items]), np.array([y for _, y in items])
    if len(images) < count:
        raise ValueError(f"the synthetic subject has {len(images)} frames, fewer than the batch of {count}")
    pick = np.sort(numpy_rng(seed, "inversion-frames").choice(len(images), count, replace=False))
    x = as_float(torch.from_numpy(images[pick]).unsqueeze(1).contiguous())
    return x, torch.from_numpy(labels[pick].astype(np.float32))


# -- the demo's cases -----------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    name: str
    observed: str  # "full": every parameter; "conv-only": PFDL's shared tensors; "dp-sgd": DP-SGD's release
    norm: str  # "batchnorm-train": as the client trains; "batchnorm-eval": running statistics; "groupnorm": DP-SGD's model


CASES = (
    Case("full, BatchNorm as trained", "full", "batchnorm-train"),
    Case("full, BatchNorm inference", "full", "batchnorm-eval"),
    Case("conv-only (PFDL), BatchNorm inference", "conv-only", "batchnorm-eval"),
    Case("full, GroupNorm (DP-SGD's model, no noise)", "full", "groupnorm"),
    Case("DP-SGD", "dp-sgd", "groupnorm"),
)


def pain_model(case: Case, settings: InversionSettings, seed: int) -> nn.Module:
    """The pain study's CNN as its protocol initialises it (Glorot, round 1's global model), in
    the case's normalisation; under DP-SGD, BatchNorm becomes GroupNorm as fedcare's DP-SGD does."""
    from fedcare.models.pain_cnn import PainCNN, glorot_init

    model = PainCNN(settings.image_size)
    glorot_init(model, torch_generator(seed, "init"))
    if case.norm == "groupnorm":
        model = private_model(model, _dp_config(settings))
    return model.train(case.norm != "batchnorm-eval")


def _dp_config(settings: InversionSettings) -> DPSGD:
    return DPSGD(noise_multiplier=settings.sigma, max_grad_norm=settings.max_grad_norm)


def attack_case(case: Case, x: torch.Tensor, y: torch.Tensor, settings: InversionSettings,
                seed: int) -> tuple[torch.Tensor, Scores, int]:
    """(the reconstructions in the true frames' order, their scores, the tensors observed)."""
    model = pain_model(case, settings, seed)
    if case.observed == "dp-sgd":
        observed = dp_sgd_gradient(model, x, y, _dp_config(settings), torch_generator(seed, "inversion-dp-noise"))
    else:
        names = ([n for n, _ in model.named_parameters()] if case.observed == "full"
                 else shared_parameter_names(model))
        observed = observed_gradient(model, x, y, names)
    recon = invert(model, observed, y, tuple(x.shape), settings, torch_generator(seed, "inversion-dummy", case.name))
    order, scores = match(x, recon)
    return recon[order], scores, len(observed)


def case_label(case: Case, settings: InversionSettings) -> str:
    if case.observed == "dp-sgd":
        return f"DP-SGD (sigma={settings.sigma:g}, C={settings.max_grad_norm:g})"
    return case.name


def run_inversion(seed: int = 0, settings: InversionSettings = InversionSettings(),
                  progress=None) -> tuple[torch.Tensor, list[dict], dict[str, torch.Tensor]]:
    """Every case on one batch of synthetic frames: (the true frames, one row per case plus
    the flat baseline, the reconstructions by case label)."""
    x, y = synthetic_frames(settings.batch, settings.image_size, seed)
    base = flat_baseline(x)
    rows = [{"case": "baseline: flat image (nothing recovered)", "observed_tensors": 0,
             "psnr": base.psnr, "ssim": base.ssim}]
    recons = {}
    for i, case in enumerate(CASES, start=1):
        label = case_label(case, settings)
        recon, scores, observed = attack_case(case, x, y, settings, seed)
        recons[label] = recon
        rows.append({"case": label, "observed_tensors": observed, "psnr": scores.psnr, "ssim": scores.ssim})
        if progress:
            progress(f"gradient inversion, {label}", i, len(CASES))
    return x, rows, recons


def save_picture(path: Path, true: torch.Tensor, rows: list[dict], recons: dict[str, torch.Tensor]) -> Path:
    """One row per image set (true frames first), one column per frame of the batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scores = {r["case"]: r for r in rows}
    sets = [("true frames (synthetic)", true), *recons.items()]
    batch = len(true)
    fig, axes = plt.subplots(len(sets), batch, figsize=(1.9 * batch + 2.6, 1.9 * len(sets)), squeeze=False)
    for r, (label, images) in enumerate(sets):
        for c in range(batch):
            ax = axes[r][c]
            ax.imshow(images[c, 0].numpy(), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
        text = label if label not in scores else f"{label}\nPSNR {scores[label]['psnr']:.1f} dB, SSIM {scores[label]['ssim']:.2f}"
        axes[r][0].set_ylabel(text, rotation=0, ha="right", va="center", fontsize=8)
    fig.suptitle("Gradient inversion of one FedSGD step of the pain CNN", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

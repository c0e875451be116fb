"""The gradient inversion's cases: what an honest-but-curious server observes of one client's
FedSGD step on the pain CNN, attacked with `fedcare.privacy.inversion`.

- "full": every parameter's gradient (FedAvg, FedSGD);
- "conv-only": only the tensors PFDL shares (its `ParameterSplit` decides: the pain CNN's
  conv blocks); the dense layers' gradients stay at the client;
- "DP-SGD": what fedcare's DP-SGD releases (each example's gradient clipped, summed, noised).
  DP-SGD replaces BatchNorm by GroupNorm, so this case attacks the GroupNorm model; "full,
  GroupNorm" (the same model without clipping and noise) separates the two effects.

BatchNorm "as trained" runs the model in train mode (the batch's own statistics, as the
client differentiated it); "inference" uses running statistics (per example).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedcare.config import DPSGD
from fedcare.privacy.dp_sgd import private_model
from fedcare.privacy.inversion import (
    InversionSettings,
    Scores,
    dp_sgd_gradient,
    invert,
    match,
    observed_gradient,
    shared_parameter_names,
)
from fedcare.seeding import torch_generator


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
BASELINE = "baseline: flat image (nothing recovered)"


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

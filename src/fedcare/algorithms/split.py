"""Which tensors leave a client: declared by module path and module type, never by name guessing."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


# A module put in the place of another by a protection (DP-SGD's GroupNorm for a BatchNorm,
# `fedcare.privacy.dp_sgd.private_model`) carries the type it replaced under this attribute:
# a split that keeps that type private keeps the replacement private (FedBN under DP-SGD keeps
# its normalisation layers), and so does every rule that looks for the type (FedAP's statistics).
STANDS_IN_FOR = "fedcare_stands_in_for"


def is_kind(module: nn.Module, types: tuple[type[nn.Module], ...]) -> bool:
    """Whether `module` is one of `types`, or stands in for one (`STANDS_IN_FOR`)."""
    return isinstance(module, types) or issubclass(getattr(module, STANDS_IN_FOR, type(None)), types)


def _under(path: str, prefix: str) -> bool:
    return prefix == "" or path == prefix or path.startswith(prefix + ".")


@dataclass(frozen=True)
class ParameterSplit:
    """A tensor is shared when its module lies under one of `shared_paths` ("" = the whole
    model), not under one of `private_paths` (a personal head, e.g. "classifier") and is not an
    instance of `private_types` (e.g. BatchNorm for FedBN), nor stands in for one (`is_kind`).
    Parameters and buffers (BatchNorm running statistics) follow their module."""

    shared_paths: tuple[str, ...] = ("",)
    private_types: tuple[type[nn.Module], ...] = ()
    private_paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if "" in self.private_paths:
            raise ValueError("private_paths cannot contain '' (that is the whole model: use SHARE_NOTHING)")

    def in_private_path(self, path: str) -> bool:
        return any(_under(path, p) for p in self.private_paths)

    def is_shared(self, path: str, module: nn.Module) -> bool:
        return (
            not is_kind(module, self.private_types)
            and any(_under(path, p) for p in self.shared_paths)
            and not self.in_private_path(path)
        )

    def shared_modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        modules = dict(model.named_modules())
        missing = [p for p in self.private_paths if p not in modules]
        if missing:  # a typo would otherwise share the head it meant to keep
            raise ValueError(f"private paths {missing} are not modules of {type(model).__name__}")
        return [(path, module) for path, module in modules.items() if self.is_shared(path, module)]

    def shared_keys(self, model: nn.Module) -> list[str]:
        """The state-dict keys of the shared modules' parameters and buffers; non-persistent
        buffers (constants such as a normalisation's mean and std) are not in the state dict
        and never travel."""
        keys = []
        for path, module in self.shared_modules(model):
            skip = module._non_persistent_buffers_set
            for name, _ in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
                if name not in skip:
                    keys.append(f"{path}.{name}" if path else name)
        return keys

    def private_keys(self, model: nn.Module) -> list[str]:
        shared = set(self.shared_keys(model))
        return [k for k in model.state_dict() if k not in shared]

    def shared_tensors(self, model: nn.Module) -> dict[str, torch.Tensor]:
        state = model.state_dict()
        return {k: host_copy(state[k]) for k in self.shared_keys(model)}

    def private_tensors(self, model: nn.Module) -> dict[str, torch.Tensor]:
        state = model.state_dict()
        return {k: host_copy(state[k]) for k in self.private_keys(model)}


def host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy on the CPU, in the standard layout: what leaves a model (a message, a client's
    state) does not depend on the device or memory format it was computed in."""
    return tensor.detach().to("cpu", memory_format=torch.contiguous_format, copy=True)


SHARE_ALL = ParameterSplit(("",))
SHARE_NOTHING = ParameterSplit(())


def load_tensors(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy named tensors into the model in place; unknown names are an error. Keys the model
    lists in `client_sized` (e.g. a local ArcFace head) take the tensor's shape."""
    state = model.state_dict()
    unknown = set(tensors) - set(state)
    if unknown:
        raise KeyError(f"tensors not in the model: {sorted(unknown)[:5]}")
    with torch.no_grad():
        for k, v in tensors.items():
            if k in getattr(model, "client_sized", ()) and v.shape != state[k].shape:
                # a tensor sized per client (a local head over the client's own classes): take its shape
                model.get_parameter(k).data = v.detach().to(state[k].device, state[k].dtype, copy=True)
                continue
            if v.is_floating_point() and not state[k].is_floating_point():
                v = v.round()  # an averaged integer buffer (num_batches_tracked) from another runtime: round, not truncate
            state[k].copy_(v)

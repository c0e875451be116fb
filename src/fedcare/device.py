"""Where a run computes, and in what precision: `[runtime] device`, `precision`, `deterministic`.

The rule (docs/running-at-scale.md): a model, its batches, its optimizer and an algorithm's
per-fit state (FedProx's anchor, FedDyn's gradient term, DP-SGD's noise) are on the run's
device while a client computes; what crosses a boundary is on the CPU: messages, a client's
state between operations, checkpoints and records. The server's halves (aggregation, server
optimizers, client-level DP, secure aggregation) work on messages, so on the CPU, in fp64
where they sum. A model is always built on the CPU and then moved, so its initial weights
are the same on every device. A tensor a client creates takes its device from what it
computes with (`device_of(model)`, `like.device`), never from torch's default device:
tests/test_device.py runs every study with the default device set to "meta" to check it.
"""

from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fedcare.errors import UserError

HOST = torch.device("cpu")
# precision -> the dtype torch.autocast computes in (fp32: no autocast)
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class DeviceUnavailable(UserError, ValueError):
    """The device an experiment asks for is not on this machine; the message names it."""


def resolve_device(spec: str) -> torch.device:
    """"auto": CUDA, else Apple's MPS, else the CPU; "cuda", "cuda:N", "mps", "cpu" as given,
    if this machine has it (else `DeviceUnavailable`)."""
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps") if _mps_available() else HOST
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailable(f"device {spec!r}: this machine has no CUDA GPU that torch can use "
                                    f"(torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none'})")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise DeviceUnavailable(f"device {spec!r}: this machine has {count} CUDA GPU(s) (cuda:0..cuda:{count - 1})")
    elif device.type == "mps" and not _mps_available():
        raise DeviceUnavailable(f"device {spec!r}: Apple's MPS is not available on this machine")
    return device


def _mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


def device_of(model: nn.Module) -> torch.device:
    """The device a model computes on (its first parameter's or buffer's; the CPU if it has none)."""
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return HOST


def to_host(value: Any) -> Any:
    """`value` with every tensor in it (in dicts, lists, tuples) on the CPU: what crosses a
    boundary (a checkpoint) does not depend on the device it was computed on. What is already
    on the CPU is returned as it is (the same object: no copy, a state dict keeps its metadata)."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        moved = {k: to_host(v) for k, v in value.items()}
        if all(moved[k] is v for k, v in value.items()):
            return value
        out = type(value)(moved) if type(value) in (dict, OrderedDict) else moved
        if hasattr(value, "_metadata"):  # a module's state dict: its version information
            out._metadata = value._metadata
        return out
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        moved = [to_host(v) for v in value]
        return value if all(m is v for m, v in zip(moved, value)) else type(value)(moved)
    return value


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The forward pass's context: torch.autocast to bf16 or fp16 on `device`; nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AUTOCAST_DTYPES[precision])


@dataclass(frozen=True)
class Compute:
    """An experiment's `[runtime]` device (resolved), precision and determinism."""

    device: torch.device = HOST
    precision: str = "fp32"
    deterministic: bool = False
    channels_last: bool = False

    @staticmethod
    def of(runtime: Any) -> "Compute":
        """From a `[runtime]` table (`fedcare.config.Runtime`); `DeviceUnavailable` if its device is not here."""
        return Compute(resolve_device(runtime.device), runtime.precision, runtime.deterministic, runtime.channels_last)

    def place(self, model: nn.Module) -> nn.Module:
        """`model` (built on the host) on this device, in channels-last layout if asked. A batch
        needs no conversion: a convolution with channels-last weights gives channels-last outputs."""
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        return model.to(self.device)

    def apply(self) -> None:
        """Process-wide settings this compute needs: on CUDA with `deterministic`, torch's
        deterministic algorithms and the cuBLAS workspace they need (set before the first
        cuBLAS call; a user's own CUBLAS_WORKSPACE_CONFIG is kept)."""
        if self.deterministic and self.device.type == "cuda":
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
            torch.backends.cudnn.benchmark = False

    def facts(self) -> dict:
        """What run.json's `compute` records about it."""
        facts = {"device": str(self.device), "precision": self.precision, "deterministic": self.deterministic}
        if self.channels_last:
            facts["channels_last"] = True
        if self.device.type == "cuda":
            facts["device_name"] = torch.cuda.get_device_name(self.device)
        return facts

    def reproducible(self) -> str | None:
        """None when a rerun on this machine gives the same numbers bit for bit; else why not."""
        if self.device.type == "cuda" and not self.deterministic:
            return ("computed on CUDA without [runtime] deterministic = true: some GPU kernels (cuDNN's "
                    "convolution algorithms, atomic additions) add in a varying order, so a rerun's numbers may "
                    "differ by float rounding")
        if self.device.type == "mps":
            return "computed on Apple's MPS, where torch does not guarantee deterministic kernels"
        return None

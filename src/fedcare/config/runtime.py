"""`[runtime]`: where and how a process computes."""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import Field, field_validator

from fedcare.config.base import Strict

DEVICE_PATTERN = r"auto|cpu|mps|cuda(:\d+)?"  # [runtime] device, and a SuperNode's --device


class Runtime(Strict):
    """`[runtime]`: where and how this process computes (docs/running-at-scale.md). Numbers are
    bit-identical only on the same device, precision, threads and kernels (`fedcare.compute`)."""

    # torch CPU threads; default: torch's choice; "auto": the cores left free by other work
    # (cores this process may use - 1-minute load average, at least 1: `fedcare.threads`)
    threads: int | Literal["auto"] | None = None
    # "auto": the first of CUDA, Apple's MPS, the CPU that this machine has; "cuda:N" a given GPU.
    # A Flower site may choose its own (`fedcare flower supernode --device`).
    device: str = "cpu"
    # training arithmetic: "fp32", or "bf16"/"fp16" under torch.autocast (fp16 with a gradient
    # scaler); aggregation and privacy accounting stay in fp32/fp64 on the CPU
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    # CUDA only: deterministic kernels (torch.use_deterministic_algorithms, cuBLAS workspace),
    # slower; on the CPU fedcare's arithmetic is deterministic anyway
    deterministic: bool = False
    # conv nets' weights in channels-last layout (NHWC): fp32 steps 0.81-0.93x as long on an AVX-512
    # CPU (benchmarks/precision.py); other kernels, so other rounding: opt-in
    channels_last: bool = False
    # Flower's Simulation Engine (`fedcare flower run --federation-config ...`): the GPUs each
    # simulated site reserves in Ray (its client_resources num_gpus; 0.25: four sites per GPU)
    gpus_per_site: float = Field(0.0, ge=0)

    @field_validator("threads")
    @classmethod
    def _threads(cls, threads: int | str | None) -> int | str | None:
        if isinstance(threads, int) and threads < 1:
            raise ValueError("threads must be at least 1, or \"auto\"")
        cores = os.cpu_count() or 1
        if isinstance(threads, int) and threads > cores:  # 100000 crashed OpenMP (a segfault)
            raise ValueError(f"threads = {threads} is more than this machine's {cores} cores (more threads than "
                             "cores only slows torch down); give at most that, or \"auto\"")
        return threads

    @field_validator("device")
    @classmethod
    def _device(cls, device: str) -> str:
        if not re.fullmatch(DEVICE_PATTERN, device):
            raise ValueError(f"device must be \"auto\", \"cpu\", \"cuda\", \"cuda:N\" or \"mps\", got {device!r}")
        return device

"""What a run's numbers depend on besides its config: the machine's arithmetic.

The same config gives bit-identical numbers only where torch adds its floats in the same
order: the same torch release, the same CPU kernels (torch and its libraries, oneDNN and MKL,
pick them by the processor's vector instructions: AVX2, AVX-512, ARM's) and the same thread
count. On another processor, or with other threads, a run's numbers differ by float rounding,
which training amplifies (docs/studies/pain.md measures by how much). run.json
records these facts, for the run and, on Flower, for every site, so a difference can be told
from a bug.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

# environment variables that select torch's CPU kernels, recorded when set
KERNEL_SETTINGS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_CBWR",
                   "MKL_ENABLE_INSTRUCTIONS")
# the facts that change the arithmetic (the processor's name is for people: two models with the
# same vector instructions usually, not provably, run the same kernels)
ARITHMETIC = ("torch", "cpu_kernels", "threads", "machine", "kernel_settings", "device", "device_name", "precision",
              "channels_last")
# what facts recorded before fedcare had a device setting computed on
DEFAULTS = {"device": "cpu", "precision": "fp32", "deterministic": False, "channels_last": False}


def compute_facts() -> dict:
    """This process's torch release, the CPU kernels torch dispatches to, its thread count (as
    set now: call after the run's `runtime.threads` is applied), the processor and its
    architecture, and the kernel-selecting environment variables that are set. A run adds its
    device, precision and determinism (`fedcare.device.Compute.facts`)."""
    import torch  # here: a report, which only describes these facts, needs no torch

    return {
        "torch": torch.__version__,
        "cpu_kernels": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "processor": _processor(),
        "machine": platform.machine(),
        "kernel_settings": {k: os.environ[k] for k in KERNEL_SETTINGS if os.environ.get(k)},
    }


def same_arithmetic(a: dict, b: dict) -> bool:
    """Whether two `compute_facts` results compute alike (as far as these facts tell)."""
    return all(a.get(k, DEFAULTS.get(k)) == b.get(k, DEFAULTS.get(k)) for k in ARITHMETIC)


def describe(facts: dict) -> str:
    """One line for a report: "torch 2.14.1, CPU kernels AVX512, 2 threads, AMD EPYC (x86_64)",
    and the device and precision when they are not the CPU's fp32."""
    settings = facts.get("kernel_settings") or {}
    text = (f"torch {facts.get('torch', '?')}, CPU kernels {facts.get('cpu_kernels', '?')}, "
            f"{facts.get('threads', '?')} threads, {facts.get('processor') or '?'} ({facts.get('machine') or '?'})")
    device, precision = facts.get("device", "cpu"), facts.get("precision", "fp32")
    if device != "cpu":
        text += f", device {device}" + (f" ({facts['device_name']})" if facts.get("device_name") else "")
        text += ", deterministic" if facts.get("deterministic") else ""
    if precision != "fp32":
        text += f", {precision}"
    if facts.get("channels_last"):
        text += ", channels-last"
    return text + "".join(f", {k}={v}" for k, v in sorted(settings.items()))


def _processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model name"):
                return value.strip()
    except OSError:
        pass
    return platform.processor() or ""

"""CPU threads on a shared machine: OpenMP's wait policy and the `threads = "auto"` rule.

torch's CPU kernels run on OpenMP (libgomp). By default a libgomp thread that finishes its
share of an operation spins, waiting for the next one; on a machine whose cores other
processes also use (a shared HPC node, a laptop running a browser, the test suite's workers)
the spinning threads take the cores from the threads that have work, and a training step
became 13x slower on 2 threads than on 1 (benchmarks/threads.py). A passive policy makes the
waiting threads sleep instead. libgomp reads the policy once, when torch loads it, so fedcare
sets it in its package `__init__` (every entry point imports `fedcare` before torch: the
`fedcare` command, the Flower apps, the warm launcher) unless the user set one.

This module imports nothing heavy: it runs before torch is imported.
"""

from __future__ import annotations

import os

WAIT_POLICY = "OMP_WAIT_POLICY"


def set_passive_wait_policy() -> None:
    """OMP_WAIT_POLICY=PASSIVE unless the environment already says something (the user's choice
    is kept). Too late once torch is imported: then this changes nothing for this process."""
    os.environ.setdefault(WAIT_POLICY, "PASSIVE")


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a batch scheduler's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows: no affinity call
        return os.cpu_count() or 1


def auto_threads(cores: int | None = None, load: float | None = None) -> int:
    """`threads = "auto"`: the cores left free by other work, at least 1.

    free = cores this process may use - the 1-minute load average (rounded to the nearest
    whole core), between 1 and the cores. The load average counts the runnable processes of
    the whole machine, so on a machine with more cores than this process's affinity it
    overstates the load on our cores: the rule then errs towards fewer threads, which costs
    little, while more threads than free cores cost much (the module docstring)."""
    cores = available_cores() if cores is None else cores
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = 0.0
    return max(1, min(cores, cores - int(load + 0.5)))

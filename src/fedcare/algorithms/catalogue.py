"""The algorithm library by name: the one table (name -> factory) the studies' methods draw
from. A study maps its method names to these names (the pain study's "FP(C)" is "pfdl", the
surgical study's "fedprox-uniform" is "fedprox") and keeps its own wiring only where its
algorithm differs from the library's (the facerec study's client halves, the surgical study's
persistent AdamW).

`build(name, settings, **options)` passes each factory the options it takes, so a study gives
its options once for all its methods (`weighting`, `mu`, `head_paths`, ...). An option no
factory takes is an error: a misspelt option is never dropped silently."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from fedcare.algorithms.base import Algorithm
from fedcare.algorithms.centralized import centralized
from fedcare.algorithms.fedap import fedap
from fedcare.algorithms.fedavg import fedavg
from fedcare.algorithms.fedbn import fedbn
from fedcare.algorithms.feddg import feddg
from fedcare.algorithms.feddyn import feddyn
from fedcare.algorithms.fedper import fedper
from fedcare.algorithms.fedprox import fedprox
from fedcare.algorithms.fedrep import fedrep
from fedcare.algorithms.local import local
from fedcare.algorithms.perfedavg import perfedavg
from fedcare.algorithms.pfdl import pfdl
from fedcare.algorithms.qfedavg import qfedavg
from fedcare.algorithms.training import TrainSettings

ALGORITHMS: dict[str, Callable[..., Algorithm]] = {
    "centralized": centralized, "local": local, "fedavg": fedavg, "fedprox": fedprox, "fedbn": fedbn,
    "fedper": fedper, "fedrep": fedrep, "feddg": feddg, "feddyn": feddyn, "fedap": fedap, "pfdl": pfdl,
    "perfedavg": perfedavg, "qfedavg": qfedavg,
}


def _options(factory: Callable[..., Algorithm]) -> set[str]:
    return set(inspect.signature(factory).parameters) - {"settings"}


def build(name: str, settings: TrainSettings, **options: Any) -> Algorithm:
    """The library's algorithm `name` with these settings and the options its factory takes."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}: the library has {', '.join(ALGORITHMS)}")
    unknown = set(options) - set().union(*map(_options, ALGORITHMS.values()))
    if unknown:
        raise TypeError(f"no algorithm takes the option(s) {', '.join(sorted(unknown))}")
    factory = ALGORITHMS[name]
    return factory(settings, **{k: v for k, v in options.items() if k in _options(factory)})

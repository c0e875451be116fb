"""The algorithm library by name: the one table (name -> factory) the studies' methods draw
from. A study maps its method names to these names (the pain study's "FP(C)" is "pfdl", the
surgical study's "fedprox-uniform" is "fedprox") and keeps its own wiring only where its
algorithm differs from the library's (the facerec study's client halves, the surgical study's
persistent AdamW).

`build(name, settings, **options)` passes each factory the options it takes, so a study gives
its options once for all its methods (`weighting`, `mu`, `head_paths`, ...). An option no
factory takes is an error: a misspelt option is never dropped silently.

Another installed package adds an algorithm by an entry point in the group
`fedcare.algorithms` (`fedfoo = "package.module:fedfoo"`, a factory `(settings, **options)
-> Algorithm`): `build` finds it by name as it finds the library's own. A name the library
has already, or that two packages declare, is an error naming both."""

from __future__ import annotations

import importlib
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
from fedcare.plugins import ALGORITHMS as GROUP
from fedcare.plugins import Plugin, PluginError, plugins, problem

ALGORITHMS: dict[str, Callable[..., Algorithm]] = {
    "centralized": centralized, "local": local, "fedavg": fedavg, "fedprox": fedprox, "fedbn": fedbn,
    "fedper": fedper, "fedrep": fedrep, "feddg": feddg, "feddyn": feddyn, "fedap": fedap, "pfdl": pfdl,
    "perfedavg": perfedavg, "qfedavg": qfedavg,
}


def _options(factory: Callable[..., Algorithm]) -> set[str]:
    return set(inspect.signature(factory).parameters) - {"settings"}


def outside() -> dict[str, Plugin]:
    """The algorithms other installed packages declare (entry points), by name; a malformed
    declaration or a name declared twice (here or in the library) is a PluginError naming both."""
    found: dict[str, Plugin] = {}
    for plugin in plugins(GROUP):
        why = problem(plugin) or (None if plugin.attribute else
                                  f"{GROUP} entry point {plugin.name!r} of {plugin.distribution}: {plugin.value!r} "
                                  "names no factory ('package.module:factory')")
        if why:
            raise PluginError(why)
        if plugin.name in ALGORITHMS:
            raise PluginError(f"algorithm {plugin.name!r} is fedcare's own and also {plugin.value} ({plugin.source}): "
                             "rename it in that package")
        if plugin.name in found:
            raise PluginError(f"algorithm {plugin.name!r} is declared twice: {found[plugin.name].value} "
                             f"({found[plugin.name].source}) and {plugin.value} ({plugin.source})")
        found[plugin.name] = plugin
    return found


def names() -> list[str]:
    """Every algorithm `build` knows: the library's, then the outside ones."""
    return [*ALGORITHMS, *outside()]


def factory(name: str) -> Callable[..., Algorithm]:
    """The factory of algorithm `name` (an outside one imported on first use)."""
    if name in ALGORITHMS:
        return ALGORITHMS[name]
    plugins_found = outside()
    if name not in plugins_found:
        raise ValueError(f"unknown algorithm {name!r}: the library has {', '.join([*ALGORITHMS, *plugins_found])}")
    plugin = plugins_found[name]
    made = getattr(importlib.import_module(plugin.module), plugin.attribute, None)
    if not callable(made):
        raise PluginError(f"algorithm {name!r}: {plugin.value} is not a factory ({plugin.source})")
    return made


def build(name: str, settings: TrainSettings, **options: Any) -> Algorithm:
    """The algorithm `name` (the library's, or an outside one) with these settings and the
    options its factory takes."""
    made = factory(name)
    unknown = set(options) - set().union(_options(made), *map(_options, ALGORITHMS.values()))
    if unknown:
        raise TypeError(f"no algorithm takes the option(s) {', '.join(sorted(unknown))}")
    return made(settings, **{k: v for k, v in options.items() if k in _options(made)})

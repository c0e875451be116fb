"""The datasets fedcare reads, by name: the one place a dataset is registered (as studies are
in `fedcare.studies.registry`).

A dataset is a package under `fedcare.data` with three modules:

* `reader`: reads a copy in the dataset's layout and raises a `DataError` naming the path;
* `synthetic`: writes a synthetic copy in that layout (byte for byte the same for a seed);
* `commands`: the `fedcare data` commands, as `SUMMARY` (name -> `summary` command) and
  `SYNTH` (name -> `synth` command), typer functions that import the reader or the
  generator only when they run.

A package's `__init__` imports nothing and `commands` only typer and rich, so building the
`fedcare data` commands costs no numpy, OpenCV or torch.

Another installed package adds a dataset by an entry point in the group `fedcare.datasets`
(`ecg = "fedcare_ecg.dataset"`, a package with the same three modules): its commands join
`fedcare data`. A name fedcare has already, or that two packages declare, is an error naming
both.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from fedcare.plugins import DATASETS, PluginError, plugins, problem

BUILT_IN = {
    "unbc": "fedcare.data.unbc",
    "pamap2": "fedcare.data.pamap2",
    "xray": "fedcare.data.xray",
    "surgical": "fedcare.data.surgical",
    "celeba": "fedcare.data.celeba",
}
PARTS = ("reader", "synthetic", "commands")


def registered() -> dict[str, str]:
    """name -> package of every dataset: the built-in ones, then the outside ones (entry
    points). A malformed entry point or a name declared twice is a PluginError naming both."""
    found = dict(BUILT_IN)
    where = {name: "fedcare" for name in BUILT_IN}
    for plugin in plugins(DATASETS):
        why = problem(plugin) or (f"{DATASETS} entry point {plugin.name!r} of {plugin.distribution}: name the "
                                  "dataset's package, not an attribute" if plugin.attribute else None)
        if why:
            raise PluginError(why)
        if plugin.name in found:
            raise PluginError(f"dataset {plugin.name!r} is registered twice: {found[plugin.name]} ({where[plugin.name]}) "
                           f"and {plugin.module} ({plugin.source})")
        found[plugin.name], where[plugin.name] = plugin.module, plugin.source
    return found


def names() -> list[str]:
    return list(registered())


def part(name: str, part: str) -> ModuleType:
    """Module `part` ("reader", "synthetic" or "commands") of dataset `name`, imported on first use."""
    datasets = BUILT_IN if name in BUILT_IN else registered()  # a built-in one whatever other packages declare
    if name not in datasets:
        raise KeyError(f"unknown dataset {name!r}: registered datasets are {', '.join(datasets)}")
    if part not in PARTS:
        raise KeyError(f"a dataset has no part {part!r} (parts: {', '.join(PARTS)})")
    return importlib.import_module(f"{datasets[name]}.{part}")

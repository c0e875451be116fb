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
"""

from __future__ import annotations

import importlib
from types import ModuleType

BUILT_IN = {
    "unbc": "fedcare.data.unbc",
    "pamap2": "fedcare.data.pamap2",
    "xray": "fedcare.data.xray",
    "surgical": "fedcare.data.surgical",
    "celeba": "fedcare.data.celeba",
}
PARTS = ("reader", "synthetic", "commands")


def names() -> list[str]:
    return list(BUILT_IN)


def part(name: str, part: str) -> ModuleType:
    """Module `part` ("reader", "synthetic" or "commands") of dataset `name`, imported on first use."""
    if name not in BUILT_IN:
        raise KeyError(f"unknown dataset {name!r}: registered datasets are {', '.join(BUILT_IN)}")
    if part not in PARTS:
        raise KeyError(f"a dataset has no part {part!r} (parts: {', '.join(PARTS)})")
    return importlib.import_module(f"{BUILT_IN[name]}.{part}")

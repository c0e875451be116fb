"""What other installed packages add to fedcare: their entry points.

A package declares, in its own pyproject.toml, what it adds under one of three groups::

    [project.entry-points."fedcare.studies"]
    lung = "fedcare_lung"                  # a package whose __init__ defines STUDY
    [project.entry-points."fedcare.datasets"]
    ecg = "fedcare_ecg.dataset"            # a package with reader, synthetic and commands modules
    [project.entry-points."fedcare.algorithms"]
    fedfoo = "fedcare_foo.algorithm:fedfoo"  # a factory (settings, **options) -> Algorithm

`pip install` writes them into the package's metadata, where this module reads them
(importlib.metadata), so every process that has the package installed finds them, a Flower
site's too, with no environment variable. Reading them imports nothing of the package.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.metadata import entry_points

from fedcare.errors import UserError

STUDIES = "fedcare.studies"
DATASETS = "fedcare.datasets"
ALGORITHMS = "fedcare.algorithms"

DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")  # a study, dataset or algorithm name


class PluginError(UserError, ValueError):
    """An entry point declared wrongly, or a name two sources claim; the message names the
    distributions (the user fixes it by uninstalling or renaming one)."""


@dataclass(frozen=True)
class Plugin:
    """One entry point: the name it registers, what it points to, and who declared it."""

    group: str
    name: str
    value: str  # "package.module" or "package.module:attribute"
    distribution: str  # "fedcare-lung 0.1.0": the installed package that declared it

    @property
    def module(self) -> str:
        return self.value.partition(":")[0].strip()

    @property
    def attribute(self) -> str:
        return self.value.partition(":")[2].strip()

    @property
    def source(self) -> str:
        """Where it comes from, in words (for messages and `fedcare studies`)."""
        return f"entry point of {self.distribution}"


def is_dotted_name(text: str) -> bool:
    """Whether `text` is a dotted Python module name (`a.b_c`), and nothing else."""
    return bool(DOTTED.fullmatch(text))


def plugins(group: str) -> list[Plugin]:
    """Every entry point of `group` in the installed packages, sorted by name then distribution."""
    found = []
    for point in entry_points(group=group):
        dist = getattr(point, "dist", None)
        who = f"{dist.metadata['Name']} {dist.version}" if dist is not None else "an unnamed distribution"
        found.append(Plugin(group, point.name, point.value, who))
    return sorted(set(found), key=lambda p: (p.name, p.distribution))


def problem(plugin: Plugin) -> str | None:
    """What is wrong with an entry point's name or value, in one line (None: nothing)."""
    if not NAME.fullmatch(plugin.name):
        return f"{plugin.group} entry point {plugin.name!r} of {plugin.distribution}: not a valid name"
    attribute_ok = not plugin.attribute or plugin.attribute.isidentifier()
    if not is_dotted_name(plugin.module) or not attribute_ok or plugin.value.count(":") > 1:
        return (f"{plugin.group} entry point {plugin.name!r} of {plugin.distribution}: {plugin.value!r} is not "
                "'package.module' or 'package.module:name'")
    return None

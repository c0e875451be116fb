"""The studies fedcare knows, by name: the one place a study is registered.

A study is a Python package whose `__init__.py` defines `STUDY`, a subclass of
`fedcare.studies.base.Study`. The CLI (`demo`, `run`, `report`, `studies`), the config loader
and the Flower app find studies here and nowhere else. Modules are imported on first use, so
listing the names costs nothing.

A study comes from one of three sources:

- **built-in**: the packages under `fedcare.studies` (`BUILT_IN`);
- **entry point**: an installed package that declares it in its own pyproject.toml
  (`[project.entry-points."fedcare.studies"]`, `name = "package"`): found in every process
  where the package is installed (`fedcare new study` writes such a package);
- **environment**: ``FEDCARE_STUDIES="name=package[,name=package]"`` in the environment of
  every process that runs it (on Flower: the SuperLink's and each SuperNode's too), with the
  package importable (installed, or its parent folder on PYTHONPATH).

A name claimed by two sources for different packages is an error naming both (a package
named by its entry point and again by the variable is no conflict). A run records its
study's source in run.json (`study_source`), so `fedcare resume` and `fedcare report` find
it there when the name is no longer registered: the recorded package is imported if it is
importable, and nothing else from run.json is ever run.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedcare.errors import UserError
from fedcare.plugins import STUDIES, is_dotted_name, plugins, problem

if TYPE_CHECKING:
    from fedcare.config import Experiment
    from fedcare.studies.base import Study

DEFAULT_STUDY = "pain"  # run directories and experiment files from before a second study existed

BUILT_IN = {
    "pain": "fedcare.studies.pain",
    "fedhealth2": "fedcare.studies.fedhealth2",
    "surgical": "fedcare.studies.surgical",
    "facerec": "fedcare.studies.facerec",
    "privacy_audit": "fedcare.studies.privacy_audit",
}
ENVIRONMENT = "FEDCARE_STUDIES"
KINDS = ("built-in", "entry-point", "environment")


class UnknownStudy(UserError, ValueError):
    """A study name that is not registered (the message lists the registered ones), or whose
    registration is broken (the message says how)."""


@dataclass(frozen=True)
class Source:
    """Where a study comes from: its kind (`KINDS`), its package and, for an entry point, the
    installed distribution that declares it ("fedcare-lung 0.1.0")."""

    kind: str
    module: str
    distribution: str | None = None

    def describe(self) -> str:
        return {"built-in": "built-in", "environment": ENVIRONMENT}.get(
            self.kind, f"entry point of {self.distribution}")

    def record(self) -> dict[str, str]:
        """What run.json keeps (`study_source`)."""
        return {"kind": self.kind, "module": self.module,
                **({"distribution": self.distribution} if self.distribution else {})}


def _environment() -> list[tuple[str, str]]:
    pairs = []
    for entry in os.environ.get(ENVIRONMENT, "").split(","):
        if not entry.strip():
            continue
        name, sep, package = entry.partition("=")
        if not sep or not name.strip() or not package.strip():
            raise UnknownStudy(f"{ENVIRONMENT}: {entry.strip()!r} is not name=package")
        pairs.append((name.strip(), package.strip()))
    return pairs


def sources() -> tuple[dict[str, Source], dict[str, list[Source]]]:
    """(name -> source of every registered study, name -> the sources of each name claimed for
    two different packages). Order: built-in, entry points (by name), then the variable."""
    claims: dict[str, list[Source]] = {name: [Source("built-in", module)] for name, module in BUILT_IN.items()}
    for plugin in plugins(STUDIES):
        if problem(plugin) is None and not plugin.attribute:
            claims.setdefault(plugin.name, []).append(Source("entry-point", plugin.module, plugin.distribution))
    for name, module in _environment():
        claims.setdefault(name, []).append(Source("environment", module))
    registered, conflicts = {}, {}
    for name, claimed in claims.items():
        if len({s.module for s in claimed}) > 1:
            conflicts[name] = claimed
        else:
            registered[name] = claimed[0]
    return registered, conflicts


def problems() -> list[str]:
    """What keeps a registration from being used, one line each: a malformed entry point, a
    name claimed twice (`fedcare studies` shows them)."""
    found = []
    for plugin in plugins(STUDIES):
        why = problem(plugin) or (f"{STUDIES} entry point {plugin.name!r} of {plugin.distribution}: "
                                  f"{plugin.value!r} names an attribute; name the study's package"
                                  if plugin.attribute else None)
        if why:
            found.append(why)
    return found + [conflict_message(name, claimed) for name, claimed in sources()[1].items()]


def conflict_message(name: str, claimed: list[Source]) -> str:
    both = " and ".join(f"{s.module} ({s.describe()})" for s in claimed)
    return f"study {name!r} is registered twice, as {both}: uninstall one, or change {ENVIRONMENT}"


def registered() -> dict[str, str]:
    """name -> package of every registered study."""
    return {name: source.module for name, source in sources()[0].items()}


def names() -> list[str]:
    return list(sources()[0])


def source_of(name: str) -> Source:
    """Where the registered study `name` comes from."""
    found, conflicts = sources()
    if name in conflicts:
        raise UnknownStudy(conflict_message(name, conflicts[name]))
    if name not in found:
        raise UnknownStudy(f"unknown study {name!r}: registered studies are {', '.join(found)}")
    return found[name]


def recorded_source(record: Any) -> Source | None:
    """The source run.json recorded (`study_source`), if it is well formed: a known kind and
    a dotted module name outside the standard library (nothing else in it is ever used)."""
    if not isinstance(record, Mapping):
        return None
    kind, module, distribution = record.get("kind"), record.get("module"), record.get("distribution")
    if kind not in KINDS or not isinstance(module, str) or not is_dotted_name(module):
        return None
    if module.partition(".")[0] in sys.stdlib_module_names:  # a study is never the standard library's
        return None
    return Source(kind, module, distribution if isinstance(distribution, str) else None)


def get(name: str, recorded: Any = None) -> type[Study]:
    """The Study class registered as `name` (its package imported on first use). A name that
    is not registered is looked up in `recorded` (run.json's `study_source`), whose package
    is imported if it is installed or on the path."""
    found, conflicts = sources()
    if name in conflicts:
        raise UnknownStudy(conflict_message(name, conflicts[name]))
    source = found.get(name)
    if source is None:
        source = recorded_source(recorded)
        if source is None or importlib.util.find_spec(source.module.partition(".")[0]) is None:
            where = f" (the run was made with {source.module}, {source.describe()}, which is not installed here)" \
                if source is not None else ""
            raise UnknownStudy(f"unknown study {name!r}{where}: registered studies are {', '.join(found)}")
    return load(name, source)


def load(name: str, source: Source) -> type[Study]:
    """The Study class of `source`'s package, checked to be a Study named `name`."""
    from fedcare.studies.base import Study

    try:
        module = importlib.import_module(source.module)
    except ModuleNotFoundError as e:
        raise UnknownStudy(f"study {name!r}: cannot import {source.module!r} ({e}; {source.describe()})") from None
    study = getattr(module, "STUDY", None)
    if not (isinstance(study, type) and issubclass(study, Study)):
        raise UnknownStudy(f"study {name!r}: {source.module} defines no STUDY (a subclass of "
                           f"fedcare.studies.base.Study; {source.describe()})")
    if study.name != name:
        raise UnknownStudy(f"study {name!r}: {source.module}.STUDY is named {study.name!r} ({source.describe()})")
    return study


def study_for(config: Experiment, recorded: Any = None) -> Study:
    """The study of an experiment, bound to it (`recorded`: as for `get`)."""
    return get(config.study, recorded)(config)

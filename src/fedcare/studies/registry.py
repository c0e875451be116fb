"""The studies fedcare knows, by name: the one place a study is registered.

A study is a folder (a Python package) whose `__init__.py` defines `STUDY`, a subclass of
`fedcare.studies.base.Study`. The CLI (`demo`, `run`, `report`), the config loader and the
Flower app find studies here and nowhere else. Modules are imported on first use, so listing
the names costs nothing.

Studies outside this package (your own, in your own folder) are registered without editing
fedcare: set ``FEDCARE_STUDIES="name=package[,name=package]"`` in the environment of every
process that runs them (on Flower: the SuperLink's and each SuperNode's too), with the
package importable (installed, or its parent folder on PYTHONPATH).
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

from fedcare.errors import UserError

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


class UnknownStudy(UserError, ValueError):
    """A study name that is not registered (the message lists the registered ones)."""


def registered() -> dict[str, str]:
    """name -> package of every registered study: the built-in ones, then `FEDCARE_STUDIES`."""
    studies = dict(BUILT_IN)
    for entry in os.environ.get(ENVIRONMENT, "").split(","):
        if not entry.strip():
            continue
        name, sep, package = entry.partition("=")
        if not sep or not name.strip() or not package.strip():
            raise UnknownStudy(f"{ENVIRONMENT}: {entry.strip()!r} is not name=package")
        studies[name.strip()] = package.strip()
    return studies


def names() -> list[str]:
    return list(registered())


def get(name: str) -> type[Study]:
    """The Study class registered as `name` (its package imported on first use)."""
    from fedcare.studies.base import Study

    studies = registered()
    if name not in studies:
        raise UnknownStudy(f"unknown study {name!r}: registered studies are {', '.join(studies)}")
    try:
        module = importlib.import_module(studies[name])
    except ModuleNotFoundError as e:
        raise UnknownStudy(f"study {name!r}: cannot import {studies[name]!r} ({e})") from None
    study = getattr(module, "STUDY", None)
    if not (isinstance(study, type) and issubclass(study, Study)):
        raise UnknownStudy(f"study {name!r}: {studies[name]} defines no STUDY (a subclass of fedcare.studies.base.Study)")
    if study.name != name:
        raise UnknownStudy(f"study {name!r}: {studies[name]}.STUDY is named {study.name!r}")
    return study


def study_for(config: Experiment) -> Study:
    """The study of an experiment, bound to it."""
    return get(config.study)(config)

"""`fedcare new study NAME DIR`: a new study as an installable package, ready to run.

It writes DIR with a pyproject.toml (distribution `fedcare-<name>`, declaring the study under
the `fedcare.studies` entry point), the package `fedcare_<name>` (config, synthetic data and a
site, the study on `fedcare.studies.rounds.RoundsStudy`, a demo config) and a test. After
`pip install -e DIR`, `fedcare demo <name>` runs it and `python -m pytest DIR` passes. The
files come from the templates in `template/` (`$name`, `$package`, ... filled in); DIR is
written whole or not at all.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from importlib.resources import files
from pathlib import Path
from string import Template

from fedcare import __version__
from fedcare.errors import InputError
from fedcare.files import umask
from fedcare.studies import registry

NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
# output path (relative to DIR) -> template file
FILES = {
    "pyproject.toml": "pyproject.toml.tmpl",
    "README.md": "README.md.tmpl",
    "src/{package}/__init__.py": "__init__.py.tmpl",
    "src/{package}/config.py": "config.py.tmpl",
    "src/{package}/data.py": "data.py.tmpl",
    "src/{package}/study.py": "study.py.tmpl",
    "src/{package}/demo.toml": "demo.toml.tmpl",
    "tests/conftest.py": "conftest.py.tmpl",
    "tests/test_{name}.py": "test_study.py.tmpl",
}


class ScaffoldError(InputError):
    """A name or folder `fedcare new study` cannot use; the message says why."""


def names_for(name: str) -> dict[str, str]:
    """What the templates fill in for study `name`."""
    return {"name": name, "package": f"fedcare_{name}", "distribution": f"fedcare-{name.replace('_', '-')}",
            "klass": "".join(part.capitalize() for part in name.split("_")) + "Study",
            "fedcare_version": __version__}


def check(name: str, out: Path) -> None:
    if not NAME.fullmatch(name):
        raise ScaffoldError(f"study name {name!r}: use lower-case letters, digits and _ (a letter first, at most "
                            "40), e.g. sepsis or icu_los")
    if name in registry.BUILT_IN:
        raise ScaffoldError(f"study name {name!r}: fedcare has a study of that name; choose another")
    if out.exists() or out.is_symlink():
        raise ScaffoldError(f"{out}: already exists; name a new folder")


def new_study(name: str, out: Path) -> Path:
    """Write the package of study `name` into the new folder `out`; returns `out`."""
    out = Path(out)
    check(name, out)
    values = names_for(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        template = files("fedcare.studies") / "template"
        for target, source in FILES.items():
            path = tmp / target.format(**values)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(Template((template / source).read_text()).substitute(values))
        os.chmod(tmp, 0o777 & ~umask())  # mkdtemp made it 0700: the package follows the umask
        if out.exists():
            raise ScaffoldError(f"{out}: appeared while writing; nothing was written there")
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out

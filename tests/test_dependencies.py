"""Dependencies as a library declares them: pyproject.toml gives the ranges fedcare supports,
constraints.txt the exact set CI tested (a `pip freeze` of a `.[test]` install), and the two
agree: every declared dependency (of every extra too) is pinned, inside its range. The README's
Quick start and .ci/run install with the constraints. docs/testing.md: how to regenerate them."""

import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from support import ROOT

CONSTRAINTS = ROOT / "constraints.txt"


def declared(pyproject: dict) -> dict[str, list[tuple[str, Requirement]]]:
    """Each declared dependency for this platform (its markers hold), by name: where it is
    declared ("dependencies" or "extra NAME") and the requirement."""
    project = pyproject["project"]
    found: dict[str, list[tuple[str, Requirement]]] = {}
    groups = {"dependencies": project["dependencies"],
              **{f"extra {name}": reqs for name, reqs in project.get("optional-dependencies", {}).items()}}
    for where, requirements in groups.items():
        for text in requirements:
            req = Requirement(text)
            if canonicalize_name(req.name) == canonicalize_name(project["name"]):  # an extra naming fedcare's others
                continue
            if req.marker is None or req.marker.evaluate({"extra": where.removeprefix("extra ")}):
                found.setdefault(canonicalize_name(req.name), []).append((where, req))
    return found


def pinned(text: str) -> dict[str, Version]:
    """constraints.txt's `name==version` lines, by name."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)", line)
        assert match, f"constraints.txt: {line!r} is not NAME==VERSION (a pip freeze line)"
        pins[canonicalize_name(match[1])] = Version(match[2])
    return pins


def regenerate_command(pyproject: dict) -> str:
    extras = ",".join(sorted(pyproject["project"].get("optional-dependencies", {})))
    return (f'python -m venv --clear /tmp/fedcare-constraints && /tmp/fedcare-constraints/bin/pip install -e ".[{extras}]" '
            "-c constraints.txt && /tmp/fedcare-constraints/bin/pip freeze --exclude-editable > constraints.txt")


def disagreements(pyproject: dict, constraints: str) -> list[str]:
    pins = pinned(constraints)
    problems = []
    for name, declarations in sorted(declared(pyproject).items()):
        for where, req in declarations:
            if name not in pins:
                problems.append(f"{req.name} ({where}: {req.specifier or 'any version'}) is not pinned")
            elif not req.specifier.contains(pins[name], prereleases=True):
                problems.append(f"{req.name}=={pins[name]} is outside {where}'s range {req.specifier}")
    if canonicalize_name(pyproject["project"]["name"]) in pins:
        problems.append(f"{pyproject['project']['name']} itself is pinned (freeze with --exclude-editable)")
    return problems


def test_the_constraints_pin_every_declared_dependency_inside_its_range():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    problems = disagreements(pyproject, CONSTRAINTS.read_text())
    assert not problems, ("pyproject.toml and constraints.txt disagree: " + "; ".join(problems) + ". Regenerate the "
                          f"constraints (docs/testing.md) with: {regenerate_command(pyproject)} (where pip reports a "
                          "conflict with a pin, delete that pin's line first), then run the suite with them")


def test_a_disagreement_is_found_and_named():
    pyproject = {"project": {"name": "fedcare", "dependencies": ["torch>=2.14,<3", "numpy>=1.26"],
                             "optional-dependencies": {"test": ["pytest>=8"], "tracking": ["mlflow>=3", "fedcare[test]"]}}}
    constraints = "torch==2.13.0\nnumpy==2.4.6\npytest==9.2.0\n"
    assert disagreements(pyproject, constraints) == [
        "mlflow (extra tracking: >=3) is not pinned", "torch==2.13.0 is outside dependencies's range <3,>=2.14"]
    assert disagreements(pyproject, constraints.replace("2.13.0", "2.14.1") + "mlflow==3.1.0\n") == []
    assert '.[test,tracking]' in regenerate_command(pyproject)


def test_the_quick_start_and_ci_install_with_the_constraints():
    readme = ROOT / "README.md"
    quick_start = readme.read_text().split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    installs = [line for text in (quick_start, (ROOT / ".ci" / "run").read_text()) for line in text.splitlines()
                if "pip install" in line]
    assert len(installs) == 3 and all("-c constraints.txt" in line for line in installs), installs
    assert "torch==2.14.1" in CONSTRAINTS.read_text() and "torchvision==0.29.1" in CONSTRAINTS.read_text()

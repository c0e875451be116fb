"""The tests' layout (docs/testing.md): tests/ mirrors src/fedcare, a folder per package and a test
file named after the module it tests (`tests/privacy/test_dp_sgd.py` for fedcare/privacy/dp_sgd.py,
`test_dp_sgd_budget.py` for one aspect of it); what tests share is in tests/support (helpers) and
in conftest.py files (fixtures), and no test file imports another. Every folder's tests can be
collected on their own, as a developer runs them."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from support import ROOT

TESTS = ROOT / "tests"
SRC = ROOT / "src" / "fedcare"
NOT_TEST_FOLDERS = {"support", "golden", "__pycache__"}  # helpers and data
# Top-level test files that mirror no module of fedcare: they check the whole tree.
WHOLE_TREE = {"test_architecture.py", "test_readme.py", "test_layout.py", "test_dependencies.py"}
# tests/benchmarks/ mirrors the scripts of benchmarks/ (their arithmetic, which the README cites).
OTHER_MIRRORS = {Path("benchmarks"): ROOT / "benchmarks"}


def python_files(tests: Path) -> list[Path]:
    """Every .py file under `tests` outside the helper and data folders."""
    return sorted(p for p in tests.rglob("*.py") if not NOT_TEST_FOLDERS & set(p.relative_to(tests).parts[:-1]))


def mirrored(folder: Path, tests: Path, src: Path, others: dict[Path, Path]) -> Path | None:
    """The source folder a test folder mirrors: the package at the same path under src, or one of `others`."""
    relative = folder.relative_to(tests)
    if relative in others:
        return others[relative]
    return src / relative if (src / relative / "__init__.py").is_file() else None


def names_in(folder: Path, top_level: bool) -> set[str]:
    """What a test file in the mirror of `folder` may be named after: its modules, and below the top
    its subpackages."""
    names = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    if not top_level:
        names |= {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    return names


def layout_problems(tests: Path, src: Path, others: dict[Path, Path]) -> list[str]:
    problems = []
    for path in python_files(tests):
        where = path.relative_to(tests)
        if path.name == "conftest.py":
            continue
        if not path.name.startswith("test_"):
            problems.append(f"{where}: not a test file (helpers go to support/, fixtures to a conftest.py)")
            continue
        if path.parent == tests:
            if path.name in WHOLE_TREE:
                continue
            allowed = names_in(src, top_level=True)
        else:
            source = mirrored(path.parent, tests, src, others)
            if source is None:
                problems.append(f"{where}: {where.parent} mirrors no package of {src.name}")
                continue
            allowed = names_in(source, top_level=False)
        subject = path.stem.removeprefix("test_")
        if not any(subject == name or subject.startswith(name + "_") for name in allowed):
            problems.append(f"{where}: named after no module of its folder's mirror ({', '.join(sorted(allowed))})")
    return problems


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            modules |= {base} if base else {alias.name for alias in node.names}  # `from . import x`
    return modules


def imports_of_test_files(tests: Path) -> list[str]:
    """`path: module` for every import of a test file (or a conftest) in a test or support file."""
    found = []
    for path in sorted(tests.rglob("*.py")):
        for module in sorted(imported_modules(path)):
            if any(part.startswith("test_") or part == "conftest" for part in module.split(".")):
                found.append(f"{path.relative_to(tests)}: {module}")
    return found


def test_every_test_file_lies_in_the_mirror_of_what_it_tests_and_is_named_after_it():
    assert layout_problems(TESTS, SRC, OTHER_MIRRORS) == []
    assert len(python_files(TESTS)) > 100  # the check saw the tree


def test_no_test_file_imports_another():
    assert imports_of_test_files(TESTS) == []


def test_the_checks_report_a_misplaced_or_misnamed_file_and_a_test_importing_another(tmp_path):
    src, tests = tmp_path / "src" / "pkg", tmp_path / "tests"
    for module in ("__init__.py", "tasks.py", "algorithms/__init__.py", "algorithms/fedavg.py",
                   "algorithms/flower/__init__.py"):
        (src / module).parent.mkdir(parents=True, exist_ok=True)
        (src / module).write_text("")
    files = {
        "test_tasks.py": "", "test_layout.py": "", "conftest.py": "",
        "support/helpers.py": "from test_tasks import x\n",
        "test_algorithms.py": "",  # a package at the top: its tests belong in its folder
        "algorithms/test_fedavg_by_hand.py": "from support.helpers import y\n",
        "algorithms/test_flower.py": "",  # a subpackage's name is one of its folder's names
        "algorithms/test_fedprox.py": "import conftest\n",
        "algorithms/helpers.py": "",
        "studies/test_run.py": "def f():\n    from test_tasks import z\n",
        "benchmarks/test_profile.py": "",
    }
    for name, text in files.items():
        (tests / name).parent.mkdir(parents=True, exist_ok=True)
        (tests / name).write_text(text)
    assert layout_problems(tests, src, {}) == [
        "algorithms/helpers.py: not a test file (helpers go to support/, fixtures to a conftest.py)",
        "algorithms/test_fedprox.py: named after no module of its folder's mirror (fedavg, flower)",
        "benchmarks/test_profile.py: benchmarks mirrors no package of pkg",
        "studies/test_run.py: studies mirrors no package of pkg",
        "test_algorithms.py: named after no module of its folder's mirror (tasks)",
    ]
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "profile.py").write_text("")
    assert not [p for p in layout_problems(tests, src, {Path("benchmarks"): tmp_path / "benchmarks"})
                if p.startswith("benchmarks/")]
    assert imports_of_test_files(tests) == [
        "algorithms/test_fedprox.py: conftest", "studies/test_run.py: test_tasks", "support/helpers.py: test_tasks"]


# Each folder's own test files alone, in one process: pytest's --setup-plan resolves every
# fixture a test asks for (a missing one is an error) without running any.
COLLECT = """
import contextlib, io, json, sys
import pytest

class Count:
    def pytest_collection_finish(self, session):
        self.items = len(session.items)

result = {}
for folder, files in json.loads(sys.argv[1]).items():
    count = Count()
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = pytest.main(["-o", "addopts=", "--import-mode=importlib", "-p", "no:xdist", "-p", "no:cacheprovider",
                            "--setup-plan", "-q", *files], plugins=[count])
    result[folder] = [int(code), getattr(count, "items", 0), out.getvalue()[-3000:] if code else ""]
print(json.dumps(result))
"""


def test_every_folders_tests_can_be_collected_on_their_own():
    folders: dict[str, list[str]] = {}
    for path in python_files(TESTS):
        if path.name.startswith("test_"):
            folders.setdefault(str(path.parent.relative_to(ROOT)), []).append(str(path.relative_to(ROOT)))
    done = subprocess.run([sys.executable, "-c", COLLECT, json.dumps(folders)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert sorted(result) == sorted(folders) and len(folders) > 15
    for folder, (code, items, output) in result.items():
        assert code == 0 and items > 0, f"{folder}: exit code {code}, {items} tests\n{output}"

"""The layers of docs/architecture.md, checked on the source.

The one list of layers is the table in docs/architecture.md ("The layers", top to bottom).
Every package and top-level module of src/fedcare is in exactly one row; a module imports
only modules of lower rows (or of its own package), and no module imports itself back
through others. Imports count wherever they are: at the top, inside functions, under
TYPE_CHECKING."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedcare.studies import registry

from support import ROOT


SRC = ROOT / "src" / "fedcare"
DOC = ROOT / "docs" / "architecture.md"
STUDY_PACKAGES = sorted(p.name for p in (SRC / "studies").iterdir() if (p / "__init__.py").is_file())


# -- the checker ---------------------------------------------------------------------------
def layers_of(doc: str) -> list[list[str]]:
    """The units (a package `data`, a top-level module `tasks`, the package's own `__init__`)
    of each row of the doc's layer table, top row first."""
    section = doc.split("## The layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # after the header and ---
    return [[re.sub(r"(/|\.py)$", "", name) for name in re.findall(r"`([^`]+)`", row.split("|")[2])]
            for row in rows]


def modules_of(src: Path) -> dict[str, Path]:
    """Dotted module name (fedcare.studies.base; a package by its name) -> its file."""
    found = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(src: Path) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports. `from a import b` imports module
    `a.b` when there is one, else (a name defined in it) `a`."""
    modules = modules_of(src)
    package = src.name

    def known(name: str) -> str | None:  # the module, or the nearest package that defines the name
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {known(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from the module's own package
                    base = name.split(".")[: len(name.split(".")) - node.level + (path.name == "__init__.py")]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                for alias in node.names:
                    targets.add(known(f"{module}.{alias.name}") if f"{module}.{alias.name}" in modules else known(module))
        graph[name] = {t for t in targets if t and t != name and t.split(".")[0] == package}
    return graph


def unit_of(module: str) -> str:
    """The row a module belongs to: its top-level package or module (`__init__` for the package's own)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def units_of(src: Path) -> set[str]:
    return {unit_of(m) for m in modules_of(src)}


def layer_problems(graph: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
    """Every import of a unit in the same row or a row above; and units in no row, or in two."""
    rank = {}
    problems = []
    for row, units in enumerate(layers):
        for unit in units:
            if unit in rank:
                problems.append(f"{unit} is in two rows of the layer table")
            rank[unit] = row
    for unit in sorted({unit_of(m) for m in graph} - set(rank)):
        problems.append(f"{unit} is in no row of the layer table")
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = unit_of(module), unit_of(target)
            if a != b and a in rank and b in rank and rank[b] <= rank[a]:
                where = "beside" if rank[b] == rank[a] else "above"
                problems.append(f"{module} imports {target}: {b} is {where} {a}")
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected sets of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# -- the source ----------------------------------------------------------------------------
LAYERS = layers_of(DOC.read_text())


def test_the_layer_table_names_every_package_and_top_level_module():
    named = [unit for row in LAYERS for unit in row]
    assert len(named) == len(set(named)), "a unit is in two rows"
    assert set(named) == units_of(SRC)
    assert {"algorithms", "runtime", "report", "evaluation", "data", "privacy", "models", "studies", "deployment",
            "tasks", "config", "compute", "files", "progress", "seeding", "cli"} <= set(named)
    row = {unit: i for i, units in enumerate(LAYERS) for unit in units}
    assert row["cli"] < row["studies"] < row["algorithms"] < row["seeding"]  # top first


def test_each_layer_imports_only_the_layers_below_it():
    assert layer_problems(import_graph(SRC), LAYERS) == []


def test_no_import_cycle():
    assert cycles(import_graph(SRC)) == []


# -- the checker finds what it is for ------------------------------------------------------
@pytest.fixture
def source_copy(tmp_path):
    copy = tmp_path / "fedcare"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__", "*.toml", "*.xml", "cascades", "configs"))
    return copy


def test_a_planted_upward_import_is_reported(source_copy):
    training = source_copy / "algorithms" / "training.py"
    training.write_text(training.read_text() + "\n\ndef _study():\n    from fedcare.studies import registry\n")
    assert layer_problems(import_graph(source_copy), LAYERS) == [
        "fedcare.algorithms.training imports fedcare.studies.registry: studies is above algorithms"]


def test_a_planted_cycle_and_a_unit_outside_the_table_are_reported(source_copy):
    (source_copy / "tasks.py").write_text((source_copy / "tasks.py").read_text() + "\nfrom fedcare import evaluation\n")
    (source_copy / "evaluation" / "__init__.py").write_text("from fedcare.tasks import BINARY\n")
    (source_copy / "gadgets.py").write_text("import fedcare.seeding\n")
    graph = import_graph(source_copy)
    assert ["fedcare.evaluation", "fedcare.tasks"] in cycles(graph)
    problems = layer_problems(graph, LAYERS)
    assert "gadgets is in no row of the layer table" in problems
    assert "fedcare.evaluation imports fedcare.tasks: tasks is above evaluation" in problems


def test_a_synthetic_module_set_with_a_sideways_and_an_upward_import():
    """Rows [[top], [left, right], [low]]: `left` importing `right` (beside it) and `low`
    importing `top` (above it) are both reported, and the loop they close."""
    layers = [["top"], ["left", "right"], ["low"]]
    graph = {"pkg.top": {"pkg.left"}, "pkg.left": {"pkg.right"}, "pkg.right": {"pkg.low"}, "pkg.low": {"pkg.top"}}
    assert layer_problems(graph, layers) == ["pkg.left imports pkg.right: right is beside left",
                                             "pkg.low imports pkg.top: top is above low"]
    assert cycles(graph) == [["pkg.left", "pkg.low", "pkg.right", "pkg.top"]]


def test_relative_imports_are_resolved(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import inner\n")
    (pkg / "sub" / "inner.py").write_text("from ..low import x\n")
    assert import_graph(pkg) == {"pkg": set(), "pkg.low": set(), "pkg.sub": {"pkg.sub.inner"},
                                 "pkg.sub.inner": {"pkg.low"}}


# -- studies -------------------------------------------------------------------------------
def test_no_module_outside_a_study_imports_that_study():
    """Studies are found through the registry (by name), never imported or type-checked elsewhere."""
    graph = import_graph(SRC)
    for module, targets in graph.items():
        for study in STUDY_PACKAGES:
            inside = f"fedcare.studies.{study}"
            if module == inside or module.startswith(inside + "."):
                continue
            assert not [t for t in targets if t == inside or t.startswith(inside + ".")], (module, study)
    built_in = {name for name, package in registry.BUILT_IN.items() if package.startswith("fedcare.studies.")}
    assert set(STUDY_PACKAGES) == built_in  # every study folder is registered, by name, as a string


def test_studies_do_not_import_each_other():
    graph = import_graph(SRC)
    for study in STUDY_PACKAGES:
        mine = f"fedcare.studies.{study}"
        for module in (m for m in graph if m == mine or m.startswith(mine + ".")):
            others = [t for t in graph[module] for o in STUDY_PACKAGES
                      if o != study and (t == f"fedcare.studies.{o}" or t.startswith(f"fedcare.studies.{o}."))]
            assert not others, (module, others)


def test_a_sites_clientapp_process_does_not_load_the_report_stack():
    """Flower starts a new ClientApp process for every message: a site opens its study without
    importing matplotlib or scipy.stats (a report is only made on the coordinator)."""
    code = ("import sys\nimport fedcare.deployment.app\nfrom fedcare.studies import registry\n"
            "for name in registry.names(): registry.get(name)\n"
            "print(sorted(m for m in ('matplotlib', 'scipy.stats') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"

"""The layers of docs/architecture.md, checked on the source: what each package may import."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).parents[1] / "src" / "fedcare"
STUDY_PACKAGES = sorted(p.name for p in (SRC / "studies").iterdir() if (p / "__init__.py").is_file())


def imports_of(path: Path) -> set[str]:
    """Every module a file imports (top level, inside functions, under TYPE_CHECKING)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _files(package: str) -> list[Path]:
    return sorted((SRC / package).rglob("*.py"))


@pytest.mark.parametrize("package, forbidden", [
    ("algorithms", ("flwr", "fedcare.runtime", "fedcare.studies", "fedcare.deployment", "fedcare.config")),
    ("runtime", ("fedcare.studies", "fedcare.deployment", "fedcare.config", "fedcare.cli")),
    ("report", ("fedcare.studies.pain", "fedcare.studies.fedhealth2", "fedcare.studies.surgical",
                "fedcare.studies.facerec", "fedcare.runtime",
                "fedcare.deployment")),
    ("evaluation", ("fedcare.studies", "fedcare.runtime", "fedcare.deployment")),
    ("data", ("fedcare.studies", "fedcare.runtime", "fedcare.deployment", "fedcare.algorithms")),
])
def test_a_lower_layer_imports_nothing_above_it(package, forbidden):
    offending = {str(path.relative_to(SRC)): sorted(m for m in imports_of(path) if m.startswith(forbidden))
                 for path in _files(package)}
    assert not {k: v for k, v in offending.items() if v}


def test_no_module_outside_a_study_imports_that_study():
    """Studies are found through the registry (by name), never imported or type-checked elsewhere."""
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        for study in STUDY_PACKAGES:
            if rel.parts[:2] == ("studies", study):
                continue
            assert not [m for m in imports_of(path) if m.startswith(f"fedcare.studies.{study}")], (rel, study)
    assert set(STUDY_PACKAGES) == {"pain", "fedhealth2", "surgical", "facerec", "privacy_audit"}
    assert "fedcare.studies.pain" in (SRC / "studies" / "registry.py").read_text()  # named there, as a string


def test_studies_do_not_import_each_other():
    for study in STUDY_PACKAGES:
        for path in _files(f"studies/{study}"):
            others = [m for m in imports_of(path) for o in STUDY_PACKAGES if o != study and m.startswith(f"fedcare.studies.{o}")]
            assert not others, (path, others)


def test_a_sites_clientapp_process_does_not_load_the_report_stack():
    """Flower starts a new ClientApp process for every message: a site opens its study without
    importing matplotlib or scipy.stats (a report is only made on the coordinator)."""
    code = ("import sys\nimport fedcare.deployment.app\nfrom fedcare.studies import registry\n"
            "for name in registry.names(): registry.get(name)\n"
            "print(sorted(m for m in ('matplotlib', 'scipy.stats') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"

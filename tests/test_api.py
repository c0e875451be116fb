"""fedcare.api, the public API: every name it lists imports, docs/api.md documents exactly
those names, and importing it does not load the report stack (a Flower site imports a study's
package, which imports the API)."""

import re
import subprocess
import sys
from pathlib import Path

import fedcare.api as api

DOC = Path(__file__).parents[1] / "docs" / "api.md"


def documented() -> list[str]:
    """The first cell of every table row of docs/api.md (`name`)."""
    return re.findall(r"^\| `([^`]+)` \|", DOC.read_text(), flags=re.M)


def test_every_listed_name_imports():
    missing = [name for name in api.__all__ if getattr(api, name, None) is None]
    assert missing == [] and len(api.__all__) == len(set(api.__all__))
    namespace: dict = {}
    exec(f"from fedcare.api import {', '.join(api.__all__)}", namespace)  # as a study writes it
    assert namespace["RoundsStudy"] is api.RoundsStudy and callable(namespace["write_report"])


def test_the_page_documents_exactly_the_listed_names():
    names = documented()
    assert len(names) == len(set(names)), "a name is documented twice"
    assert sorted(names) == sorted(api.__all__)


def test_an_unknown_name_is_an_attribute_error():
    try:
        api.no_such_name
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("no AttributeError")


def test_importing_the_api_loads_no_plotting():
    code = "import sys, fedcare.api\nprint(sorted(m for m in ('matplotlib', 'scipy.stats') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_example_study_and_the_template_reach_fedcare_only_through_the_api():
    root = Path(__file__).parents[1]
    sources = [*(root / "examples").rglob("src/**/*.py"), *(root / "src" / "fedcare" / "studies" / "template").glob("*.tmpl")]
    assert len(sources) >= 8
    for path in sources:
        for line in path.read_text().splitlines():
            if re.match(r"\s*(from|import) fedcare[.\s]", line):
                assert line.strip().startswith("from fedcare.api import"), f"{path.name}: {line.strip()}"

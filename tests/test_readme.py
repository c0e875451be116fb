"""What a newcomer meets first: the README's commands work as written and its links lead somewhere.

The README is short (at most 250 lines); its Quick start is two shell commands, the second of
them what CI runs (.ci/run); every `fedcare ...` command it shows exists with every option it
shows; every relative link in it and in docs/ points to a file (and heading) that exists.
"""

import re
from functools import cache
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

from fedcare.cli import app

from support import ROOT


README = ROOT / "README.md"
DOCS = [README, ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# A wide terminal without colour, so that no option name is cut or split by markup.
HELP_ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERMINAL_WIDTH": "200"}


def section(text: str, heading: str) -> str:
    """The text under a `## heading`, up to the next `## ` heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def shell_commands(markdown: str) -> list[str]:
    """The command lines of the fenced shell blocks (comments and blank lines left out)."""
    blocks = re.findall(r"```(?:bash|sh|shell|console)?\n(.*?)```", markdown, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def documented_commands(markdown: str) -> list[str]:
    """Every inline-code span that starts with `fedcare `."""
    return re.findall(r"`(fedcare [^`]+)`", markdown)


def resolve(span: str) -> tuple[list[str], click.Command, str | None]:
    """Walk the words after `fedcare` down the command tree: (path, command, the word it stopped at)."""
    command = typer.main.get_command(app)
    path: list[str] = []
    for word in span.split()[1:]:
        if not isinstance(command, click.Group) or word not in command.commands:
            return path, command, word
        command = command.commands[word]
        path.append(word)
    return path, command, None


@cache
def help_text(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env=HELP_ENV)
    assert result.exit_code == 0, f"fedcare {' '.join(path)} --help failed:\n{result.output}"
    return result.output


def test_readme_is_at_most_250_lines():
    lines = README.read_text().count("\n")
    assert lines <= 250, f"README.md has {lines} lines; move detail to docs/ (at most 250)"


def test_quick_start_is_two_commands_and_ci_runs_the_second_verbatim():
    commands = shell_commands(section(README.read_text(), "Quick start"))
    assert len(commands) == 2, commands
    ci = (ROOT / ".ci" / "run").read_text()
    ci_commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.startswith("#")]
    assert commands[1] in ci_commands, f".ci/run does not run the README's test command {commands[1]!r}"
    assert "fedcare demo" in commands[0]


COMMAND_TABLE = [row.split("|")[1].strip() for row in section(README.read_text(), "Commands").splitlines()
                 if row.startswith("| `fedcare")]


def test_the_command_table_lists_commands():
    assert len(COMMAND_TABLE) >= 10


@pytest.mark.parametrize("span", documented_commands(README.read_text()))
def test_every_readme_command_exists_with_every_option_it_shows(span):
    path, command, stopped_at = resolve(span)
    if isinstance(command, click.Group):
        # `fedcare flower ...` names a family of commands; any other word under a group is a typo
        assert stopped_at == "...", f"`{span}`: {stopped_at!r} is not a command of `fedcare {' '.join(path)}`"
    help_output = help_text(tuple(path))
    for option in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", span):
        assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", help_output), (
            f"`{span}`: {option} is not an option of `fedcare {' '.join(path)}`")


def test_the_check_catches_a_wrong_option_and_a_wrong_command():
    with pytest.raises(AssertionError, match="--frames-scale"):
        test_every_readme_command_exists_with_every_option_it_shows("fedcare data synth pain OUT --frames-scale 0.1")
    with pytest.raises(AssertionError, match="sumary"):
        test_every_readme_command_exists_with_every_option_it_shows("fedcare data sumary unbc PATH")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", markdown.read_text(), flags=re.S)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def relative_links(markdown: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", markdown.read_text(), flags=re.S)
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t for t in targets if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("markdown", [d for d in DOCS if d.exists()], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_an_existing_file_and_heading(markdown):
    for link in relative_links(markdown):
        target, _, fragment = link.partition("#")
        path = (markdown.parent / target).resolve() if target else markdown
        assert path.exists(), f"{markdown.relative_to(ROOT)}: link {link!r} points to a missing file"
        if fragment and path.suffix == ".md":
            assert fragment in anchors(path), f"{markdown.relative_to(ROOT)}: link {link!r}: no such heading"


def test_every_test_the_trust_model_names_exists():
    """docs/deploy.md's trust model backs each line with a test, named `file::test` (a file under
    tests/; `::test` alone is in the file named before it): each must exist."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = text[text.index("## 10. Who can do what"):text.index("\n## 11.")]
    named, file = [], None
    for ref in re.findall(r"`([\w/]*(?:\.py)?(?:::\w+)?)`", section):
        path, _, test = ref.partition("::")
        if path.endswith(".py"):
            file = ROOT / "tests" / path.removeprefix("tests/")
            assert file.is_file(), f"docs/deploy.md names {ref}: no such test file"
        if test:
            assert file is not None and f"def {test}(" in file.read_text(), f"docs/deploy.md names {ref}: no such test"
            named.append(test)
    assert len(named) >= 15  # every line of the three roles names its test

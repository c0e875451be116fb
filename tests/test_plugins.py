"""fedcare.plugins: the entry points other installed packages declare, read from their
metadata with the distribution that declared them; names and values checked."""

import sys

from support.distributions import fake_distribution

from fedcare.plugins import ALGORITHMS, DATASETS, STUDIES, Plugin, is_dotted_name, plugins, problem


def test_the_entry_points_of_an_installed_distribution_are_found_with_who_declared_them(tmp_path, monkeypatch):
    fake_distribution(tmp_path, "fedcare-extra", "1.2.0", {
        STUDIES: {"extra": "fedcare_extra"}, ALGORITHMS: {"fedfoo": "fedcare_extra.algo:fedfoo"}})
    assert plugins(STUDIES) == [] or all(p.name != "extra" for p in plugins(STUDIES))
    monkeypatch.syspath_prepend(str(tmp_path))
    study = [p for p in plugins(STUDIES) if p.name == "extra"]
    assert study == [Plugin(STUDIES, "extra", "fedcare_extra", "fedcare-extra 1.2.0")]
    algorithm = [p for p in plugins(ALGORITHMS) if p.name == "fedfoo"][0]
    assert (algorithm.module, algorithm.attribute, algorithm.source) == (
        "fedcare_extra.algo", "fedfoo", "entry point of fedcare-extra 1.2.0")
    assert not [p for p in plugins(DATASETS) if p.distribution.startswith("fedcare-extra")]


def test_a_malformed_name_or_value_is_one_line_naming_the_distribution():
    def plugin(name, value):
        return Plugin(STUDIES, name, value, "fedcare-x 0.1")

    assert problem(plugin("lung", "fedcare_lung")) is None
    assert problem(plugin("lung", "pkg.mod:Attr")) is None
    assert "not a valid name" in problem(plugin("lung study", "x"))
    for value in ("pkg/mod", "pkg.mod:a:b", "os; rm", "pkg.:x", ":attr", "pkg.mod:1x"):
        message = problem(plugin("lung", value))
        assert message is not None and "fedcare-x 0.1" in message and repr(value) in message, value
    assert is_dotted_name("a.b_c.d") and not is_dotted_name("a..b") and not is_dotted_name("1a")


def test_nothing_of_a_declaring_package_is_imported_to_read_its_entry_points(tmp_path, monkeypatch):
    (tmp_path / "fedcare_loud").mkdir()
    (tmp_path / "fedcare_loud" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    fake_distribution(tmp_path, "fedcare-loud", "0.1", {STUDIES: {"loud": "fedcare_loud"}})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert [p.name for p in plugins(STUDIES) if p.name == "loud"] == ["loud"]
    assert "fedcare_loud" not in sys.modules

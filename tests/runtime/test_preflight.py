"""Preflight (`fedcare.runtime.preflight`): each site's aggregate data summary leaves it with
small counts suppressed, and the coordinator refuses an experiment the sites cannot run
(missing tool, empty split, label set mismatch, different copies), naming the site. The
refusal runs through the real ServerApp and ClientApp on Flower's Simulation Engine (in
process: support/flower_inprocess.py); the real multi-process deployment writes the preflight to the
report in tests/deployment/test_cli_deployed_studies.py."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.data.surgical.clients import TOOLS
from fedcare.data.surgical.synthetic import generate_surgical
from fedcare.runtime.preflight import Expectations, PreflightError, check, site_summary
from fedcare.runtime.refs import Split
from fedcare.studies.registry import study_for

from support.flower_inprocess import run_experiment_on_flower
from support.surgical import SYNTH, tiny


CLIENTS = ["HEI1", "HEI2", "CHO1", "CHO2", "CHO3"]


class _Site:
    def __init__(self, inventory: dict):
        self._inventory = inventory

    def inventory(self) -> dict:
        return self._inventory


def test_counts_below_the_minimum_leave_a_site_as_less_than_k():
    site = _Site({"unit": "frames", "splits": {"train": {"examples": 40, "videos": 2,
                                                         "labels": {"a": 0, "b": 1, "c": 4, "d": 5, "e": 39}}},
                  "dataset": {"global_identities": 3}})
    summary = site_summary(site, 5)
    assert summary["splits"]["train"] == {"examples": 40, "videos": "<5",
                                          "labels": {"a": 0, "b": "<5", "c": "<5", "d": 5, "e": 39}}
    assert summary["min_count"] == 5 and summary["unit"] == "frames"
    assert summary["dataset"] == {"global_identities": 3}  # a fact of the copy, not of its people
    assert site_summary(site, 1)["splits"]["train"]["labels"]["b"] == 1  # a site may choose no suppression
    assert site_summary(object()) is None  # a study without an inventory


@pytest.fixture(scope="module")
def copies(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("preflight") / "copies"
    generate_surgical(root, **SYNTH)
    return root


def test_a_surgical_sites_summary_is_its_tool_counts_suppressed(copies, tmp_path):
    study = study_for(tiny(copies, tmp_path / "cache"))
    site = study.open_site("CHO2", copies, tmp_path / "site-cache")
    exact = site.data(Split("train")).y.sum(0).long().tolist()
    summary = site_summary(site, 5)
    train = summary["splits"]["train"]
    assert train["examples"] == len(site.data(Split("train"))) and list(train["labels"]) == list(TOOLS)
    assert [train["labels"][t] for t in TOOLS] == [n if n == 0 or n >= 5 else "<5" for n in exact]
    assert "<5" in train["labels"].values() and any(isinstance(n, int) and n >= 5 for n in train["labels"].values())
    assert all(not isinstance(v, int) or v == 0 or v >= 5
               for s in summary["splits"].values() for v in [*s["labels"].values(), s["examples"], s["videos"]])
    assert check({"site-a": ("CHO2", summary)}, study.preflight_expectations()).ok


def test_the_check_names_the_site_and_each_problem():
    expected = Expectations(splits=("train", "test"), labels=("x", "y"), required={"train": ("x", "y")},
                            wanted={"test": ("y",)}, label_kind="tool")

    def summary(train: dict, test: dict, **dataset) -> dict:
        return {"unit": "frames", "min_count": 5, "dataset": dataset,
                "splits": {"train": {"examples": 9, "labels": train}, "test": {"examples": 3, "labels": test}}}

    good = summary({"x": 7, "y": "<5"}, {"x": 2, "y": "<5"}, copy=1)
    result = check({"a": (1, good), "b": (2, good)}, expected)
    assert result.ok and result.problems == [] and result.warnings == []
    empty_test = {**good, "splits": {**good["splits"], "test": {"examples": 0, "labels": {"x": 0, "y": 0}}}}
    result = check({"a": (1, summary({"x": 7, "y": 0}, {"x": 1, "y": 0})),
                    "b": (2, summary({"x": 7, "y": 3, "z": 1}, {"x": 1, "y": 1}, copy=2)),
                    "c": (3, empty_test), "d": (4, None), "e": (5, {"unit": "frames", "splits": {"train": 3}})},
                   expected)
    assert not result.ok
    assert result.problems == [
        "site 'a' (1): tool 'y' never occurs in its train frames",
        "site 'b' (2): label set mismatch: it has tools ['z'] that the experiment does not know (it knows ['x', 'y'])",
        "site 'c' (3): its test split is empty",
        "site 'e' (5) sent a malformed data summary (min_count None is not a whole number from 1 to 1000000)",
        "the sites' data differ in copy (b: 2, c: 1): every site must hold the same copy",
    ]
    assert result.warnings == ["site 'a' (1): tool 'y' never occurs in its test frames",
                               "site 'c' (3): tool 'y' never occurs in its test frames",
                               "site 'd' (4) gave no data summary (its study has none)"]
    assert result.sites["e"]["summary"] is None  # what a site sent malformed is not kept


def _without_clipper(copies: Path, root: Path) -> Path:
    """The copies with no Clipper in any Cholec80 annotation (a site whose tool mapping lost it)."""
    shutil.copytree(copies, root)
    for path in (root / "cholec80" / "tool_annotations").glob("*-tool.txt"):
        lines = path.read_text().splitlines()
        column = lines[0].split("\t").index("Clipper")
        rows = [line.split("\t") for line in lines[1:]]
        path.write_text("\n".join([lines[0], *("\t".join(r[:column] + ["0"] + r[column + 1:]) for r in rows)]) + "\n")
    return root


@pytest.mark.timeout(300)
def test_preflight_refuses_a_site_without_a_tool_the_experiment_needs(copies, tmp_path):
    """`--preflight-only`'s ServerApp on Flower's Simulation Engine: the sites answer, the
    coordinator writes preflight.json; the Cholec80 sites have lost the Clipper: refused, by name."""
    config = tiny(_without_clipper(copies, tmp_path / "copies"), tmp_path / "cache", methods=["fedavg"])
    problem = "site 'CHO1' (CHO1): tool 'Clipper' never occurs in its train frames"
    with pytest.raises(PreflightError, match=re.escape(problem)):
        run_experiment_on_flower(config, tmp_path / "check", len(CLIENTS), "surgical.toml", **{"preflight-only": True})
    preflight = json.loads((tmp_path / "check" / "preflight.json").read_text())
    assert not preflight["ok"]
    assert preflight["problems"] == [f"site {c!r} ({c}): tool 'Clipper' never occurs in its train frames"
                                     for c in ("CHO1", "CHO2", "CHO3")]
    assert preflight["sites"]["CHO1"]["summary"]["splits"]["train"]["labels"]["Clipper"] == 0
    assert sorted(preflight["sites"]) == sorted(CLIENTS) and not (tmp_path / "check" / "metrics.jsonl").exists()
    # the same experiment without --preflight-only stops before any training: no run directory
    with pytest.raises(PreflightError, match=re.escape(problem)):
        run_experiment_on_flower(config, tmp_path / "run", len(CLIENTS), "surgical.toml")
    assert not (tmp_path / "run").exists() and not (tmp_path / "run.partial").exists()


@pytest.mark.timeout(300)
def test_preflight_passes_on_the_copies_and_writes_every_sites_summary(copies, tmp_path):
    config = tiny(copies, tmp_path / "cache", methods=["fedavg"])
    run_experiment_on_flower(config, tmp_path / "check", len(CLIENTS), "surgical.toml", **{"preflight-only": True})
    preflight = json.loads((tmp_path / "check" / "preflight.json").read_text())
    assert preflight["ok"] and preflight["problems"] == []
    # the synthetic HEI2 test videos never show the suction-irrigation: noted, not refused
    assert preflight["warnings"] == ["site 'HEI2' (HEI2): tool 'Suction-Irrigation' never occurs in its test frames"]
    assert {s: v["client"] for s, v in preflight["sites"].items()} == {c: c for c in CLIENTS}


def test_supernode_passes_its_minimum_count_and_refuses_one_below_1(tmp_path):
    base = ["flower", "supernode", "--site", "a", "--data-dir", str(tmp_path), "--state-dir", str(tmp_path / "s"),
            "--insecure", "--no-warm", "--dry-run"]
    result = CliRunner().invoke(app, [*base, "--preflight-min-count", "11"])
    assert result.exit_code == 0 and 'preflight-min-count="11"' in result.output, result.output
    result = CliRunner().invoke(app, [*base, "--preflight-min-count", "0"])
    assert result.exit_code == 2 and "--preflight-min-count 0: at least 1" in result.output


def _summary(**changes) -> dict:
    """A well-formed summary (min_count 5), with `changes` to its train split or its top level."""
    train = {"examples": 9, "videos": 2, "labels": {"x": 7, "y": "<5"}}
    top = {k: v for k, v in changes.items() if k in ("unit", "min_count", "dataset", "extra")}
    train.update({k: v for k, v in changes.items() if k not in top})
    return {"unit": "frames", "min_count": 5, "dataset": {}, "splits": {"train": train}, **top}


@pytest.mark.parametrize("changes, why", [
    ({"min_count": "<5"}, "min_count '<5' is not a whole number"),  # passed, then failed the run at its last step
    ({"min_count": True}, "min_count True is not a whole number"),
    ({"examples": "<0"}, "'<0' is not a count"),
    ({"examples": "<7"}, "'<7' is not a count"),  # "<k" only for the site's own k
    ({"examples": 10 ** 30}, "is not a count (0 to 1e+12"),
    ({"examples": -1}, "-1 is not a count"),
    ({"labels": {"x": 700, "y": 1}}, "label 'x': 700 examples, more than the split's 9"),
    ({"labels": {"x": "<5", "y": 10 ** 13}}, "label 'y': 10000000000000 is not a count"),
    ({"labels": {"": 1}}, "label '' is not a name"),
    ({"unit": "x" * 10_000_000}, "more than 65536"),  # a 10 MB field was copied into run.json
    ({"dataset": {"copy": ["a list"]}}, "dataset fact 'copy': ['a list'] is not a count or a short text"),
    ({"extra": 1}, "unknown fields ['extra']"),
])
def test_a_summary_that_no_site_can_give_is_refused_naming_why_and_not_kept(changes, why):
    expected = Expectations(splits=("train",), labels=("x", "y"))
    assert check({"a": (1, _summary())}, expected).ok
    result = check({"a": (1, _summary(**changes))}, expected)
    assert len(result.problems) == 1 and result.problems[0].startswith("site 'a' (1) sent a malformed data summary (")
    assert why in result.problems[0] and len(result.problems[0]) < 300
    assert result.sites["a"]["summary"] is None and len(json.dumps(result.as_json())) < 1000
    assert result.notes() == []  # the report's lines read only what was kept


def test_labels_that_add_up_to_more_than_the_split_are_refused_where_each_example_has_one():
    """Each label within its split holds for any study; their sum only where an example has one
    label (pain, FedHealth 2): a surgical frame shows several tools."""
    summary = _summary(labels={"x": 7, "y": 6})
    assert check({"a": (1, summary)}, Expectations(splits=("train",), labels=("x", "y"))).ok
    result = check({"a": (1, summary)}, Expectations(splits=("train",), labels=("x", "y"), one_label=True))
    assert result.problems == ["site 'a' (1): its train split has 9 frames but at least 13 labels (each has one): "
                               "not counts of one copy"]
    suppressed = _summary(labels={"x": 8, "y": "<5"})  # "<5" is at least 1: 9 of 9
    assert check({"a": (1, suppressed)}, Expectations(splits=("train",), labels=("x", "y"), one_label=True)).ok

"""The pain study end to end on a tiny synthetic cohort: golden metrics, determinism, bad input."""

import json
import math
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.studies.load import load_config
from fedcare.data.unbc.synthetic import generate_pain_cohort
from fedcare.data.unbc.reader import UnbcImageError, UnbcLayoutError, UnbcUnusableError
from fedcare.studies.pain.config import PainExperiment
from fedcare.studies.pain.report import summary_markdown
from fedcare.studies.run import run_study
from fedcare.studies.rundir import RunDirectoryExists

from support import ROOT
from support.lineage import check_lineage
from support.pain import SUBJECTS, small_config


GOLDEN = ROOT / "tests" / "golden" / "pain_small.json"


def records_of(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == "client_eval"]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    return run_study(small_config(), tmp_path_factory.mktemp("run") / "small")


def test_run_directory_holds_config_metrics_tables_plots_and_report(small_run):
    for name in ["config.toml", "run.json", "metrics.jsonl", "report.html", "tables/summary.csv",
                 "tables/per_subject_f1.md", "tables/rank_sums.csv", "plots/per_session_f1.png"]:
        assert (small_run / name).is_file(), name
    assert not small_run.with_name("small.partial").exists()
    assert json.loads((small_run / "run.json").read_text())["synthetic"] is True
    assert "SYNTHETIC" in (small_run / "report.html").read_text()
    assert load_config(small_run / "config.toml") == small_config()  # the resolved config reruns as is


def test_every_method_is_tested_on_every_subject_session_it_has(small_run):
    records = records_of(small_run)
    methods = {r["method"] for r in records}
    assert methods == {"BC", "F(C)", "FP(C)", "FL(N)"}
    pairs = {m: sorted((r["session"], r["client"]) for r in records if r["method"] == m) for m in methods}
    assert len({tuple(p) for p in pairs.values()}) == 1  # same subject-sessions for every method
    assert {s for s, _ in pairs["BC"]} <= {1, 2, 3}
    # session 1 is tested before any Group-2 training: F(C) and FP(C) still equal BC there
    first = {(r["method"], r["client"]): r["f1"] for r in records if r["session"] == 1}
    for client in {c for _, c in first}:
        assert first[("F(C)", client)] == first[("BC", client)] == first[("FP(C)", client)]


def test_golden_metrics(small_run):
    """A short run whose metrics must match stored values: catches silent changes anywhere in
    data generation, preprocessing, training or evaluation. Regenerate deliberately with
    FEDCARE_UPDATE_GOLDEN=1 after an intended change, and say why in the commit."""
    got = {f"{r['method']}|{r['session']}|{r['client']}": [None if _nan(v) else v for v in
                                                          (r["acc"], r["pr_auc"], r["f1"], r["loss"])]
           for r in records_of(small_run)}
    if os.environ.get("FEDCARE_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    expected = json.loads(GOLDEN.read_text())
    assert sorted(got) == sorted(expected)
    for key, values in expected.items():
        for a, b in zip(got[key], values):
            assert (a is None and b is None) or (a is not None and b is not None and abs(a - b) < 1e-4), (key, got[key], values)


def _nan(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def test_same_seed_gives_identical_metrics(small_run, tmp_path):
    again = run_study(small_config(), tmp_path / "again")
    assert records_of(again) == records_of(small_run)


def test_the_runs_lineage_holds_every_round_and_saves_each_federations_model(small_run):
    """Every aggregate of the pretraining and the sessions, each method's federation a chain of
    its own, its final global model saved (`fedcare lineage --verify`)."""
    verified = check_lineage(small_run)
    aggregates = [r for r in verified.records if r["type"] == "aggregate"]
    assert {r["label"]["method"] for r in aggregates} == {"pretrain C", "F(C)", "FP(C)", "FL(N)"}
    assert {r["algorithm"] for r in aggregates} == {"centralized", "fedavg", "pfdl", "local"}
    assert {c for r in aggregates if r["label"]["method"] == "F(C)" for c in r["clients"]} == {"43", "80", "92"}
    assert {c for r in aggregates if r["label"]["method"] == "pretrain C" for c in r["clients"]} == {"pooled"}
    assert sorted(Path(f).name.split("_seed")[0] for f in verified.models) == ["F-C", "FL-N", "FP-C", "pretrain-C"]


def test_existing_run_directory_is_never_overwritten(small_run):
    before = (small_run / "metrics.jsonl").read_bytes()
    with pytest.raises(RunDirectoryExists, match="already exists"):
        run_study(small_config(), small_run)
    assert (small_run / "metrics.jsonl").read_bytes() == before


@pytest.fixture(scope="module")
def cohort_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data") / "unbc"
    generate_pain_cohort(root, subjects=SUBJECTS, frame_scale=0.02, image_size=32)
    return root


def _copy(cohort_root: Path, tmp_path: Path) -> Path:
    import shutil

    target = tmp_path / "unbc"
    shutil.copytree(cohort_root, target)
    return target


def _some(root: Path, pattern: str) -> Path:
    return sorted(root.glob(pattern))[0]


@pytest.mark.parametrize(
    "damage, error",
    [
        (lambda r: _some(r, "Images/043-*/*/*.png").write_bytes(b"not a png"), UnbcImageError),
        (lambda r: _some(r, "Frame_Labels/PSPI/080-*/*/*_facs.txt").unlink(), UnbcUnusableError),
        (lambda r: _some(r, "Images/092-*/*/*.png").unlink(), UnbcUnusableError),
    ],
    ids=["corrupt-image", "missing-label", "missing-image"],
)
def test_bad_input_names_the_path_and_leaves_no_run_directory(cohort_root, tmp_path, damage, error):
    root = _copy(cohort_root, tmp_path)
    damage(root)
    out = tmp_path / "run"
    with pytest.raises(error) as info:
        run_study(small_config(root), out)
    assert str(root) in str(info.value)
    assert not out.exists() and not out.with_name("run.partial").exists()


def test_wrong_layout_fails_before_training(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UnbcLayoutError, match="empty"):
        run_study(small_config(tmp_path / "empty"), tmp_path / "run")
    assert not (tmp_path / "run").exists() and not (tmp_path / "run.partial").exists()


def test_cli_run_reports_bad_config_and_bad_data_without_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('methods = ["F(C)"]\n[data]\nroot = "nowhere"\n[train]\nepochs = 3\n')
    result = CliRunner().invoke(app, ["run", str(bad), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "train.epochs" in result.output and "Traceback" not in result.output
    good = tmp_path / "good.toml"
    good.write_text('methods = ["F(C)"]\n[data]\nroot = "nowhere"\n')
    result = CliRunner().invoke(app, ["run", str(good), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "nowhere" in result.output
    assert not (tmp_path / "r").exists()


def random_config(**extra) -> PainExperiment:
    base = small_config().model_dump()
    base.update(methods=["RANDOM", "FL(N)"], **extra)
    return PainExperiment.model_validate(base)


def test_random_runs_on_its_own_seeds_and_the_others_are_unchanged(tmp_path):
    """random_seeds: RANDOM (no training) on more seeds than the trained methods; the shared
    seed's records are those of a run without it, and the summary counts RANDOM's seeds."""
    run = run_study(random_config(seeds=[6], random_seeds=[5, 6, 7]), tmp_path / "more")
    plain = run_study(random_config(seeds=[6]), tmp_path / "plain")
    records, before = records_of(run), records_of(plain)
    assert list(dict.fromkeys(r["seed"] for r in records)) == [6, 5, 7]  # `seeds` first, then RANDOM's others
    assert {r["seed"] for r in records if r["method"] == "FL(N)"} == {6}
    assert [r for r in records if r["seed"] == 6] == before  # as without random_seeds
    by_seed = {s: [r["loss"] for r in records if r["method"] == "RANDOM" and r["seed"] == s] for s in (5, 6, 7)}
    assert len({tuple(v) for v in by_seed.values()}) == 3  # each seed draws its own untrained network
    info = json.loads((run / "run.json").read_text())
    sessions = len(info["test_sessions"])
    assert info["progress"] == {"units_done": 4 * sessions, "units_total": 4 * sessions}  # 3 RANDOM seeds + FL(N)
    assert info["random_seeds"] == [5, 6, 7]
    rows = (run / "tables/summary.csv").read_text().splitlines()[1:]
    summary = {row.split(",")[0]: row.split(",")[1] for row in rows}  # method -> seeds
    assert summary == {"RANDOM": "3", "FL(N)": "1"}
    assert "Means over seeds: RANDOM over 3; FL(N) over 1." in summary_markdown(run)
    assert "Means over seeds" not in summary_markdown(plain)
    assert "<th>RANDOM&#x27;s seeds</th><td>5, 6, 7</td>" in (run / "report.html").read_text()


def test_random_seeds_listed_twice_are_refused():
    with pytest.raises(ValueError, match="(?s)random_seeds.*listed twice: \\[6\\]"):
        random_config(random_seeds=[5, 6, 6])

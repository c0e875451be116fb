"""The face study's report (fedcare.studies.facerec.report): means per client then over clients, the
std across clients per run, the paired tests (marked below too few pairs), the thesis's orderings
and the printed summary."""

from __future__ import annotations

import json

import pytest


def test_report_means_per_client_then_over_clients_and_std_across_clients_per_run():
    from scipy import stats

    from fedcare.studies.facerec.report import Scores, paired_tests

    def ev(method, seed, path, client, g, t):
        return {"method": method, "seed": seed, "path": path, "client": client, "tar_global": g, "tar_tuned": t}

    evals = [ev("a", 0, 1, 1, 0.2, 0.4), ev("a", 0, 1, 2, 0.6, 0.8), ev("a", 1, 1, 1, 0.4, 0.4),  # client 2 missing once
             ev("a", 0, 1, 3, 0.5, 0.9), ev("a", 1, 1, 3, 0.1, 0.1),
             ev("b", 0, 1, 1, 0.3, 0.5), ev("b", 0, 1, 2, 0.7, 0.9), ev("b", 1, 1, 1, 0.6, 0.6),
             ev("b", 0, 1, 3, 0.5, 0.5), ev("b", 1, 1, 3, 0.2, 0.3)]
    s = Scores(evals, unseen={3})
    assert s.group("trained") == [1, 2] and s.group("unseen") == [3]
    assert s.mean("a", "tar_global", "trained") == pytest.approx(((0.2 + 0.4) / 2 + 0.6) / 2)  # client means first
    assert s.mean("a", "tar_tuned", "unseen") == pytest.approx(0.5)
    assert s.fairness("a", "tar_global", "trained") == pytest.approx((0.2 + 0.0) / 2)  # std 0.2 in run 0; one client in run 1
    a, b = s.per_run("a", "tar_global", "trained"), s.per_run("b", "tar_global", "trained")
    assert a == pytest.approx({(0, 1): 0.4, (1, 1): 0.4})
    t, w, n = paired_tests(b, a)
    assert n == 2 and t == pytest.approx(stats.ttest_rel([0.5, 0.6], [0.4, 0.4]).pvalue)


def test_paired_tests_on_too_few_pairs_are_marked_as_meaningless():
    """The demo's face report printed p = 0.030 from 2 pairs; below MIN_PAIRS every p is marked."""
    import random

    from fedcare.studies.facerec.report import MIN_PAIRS, Scores, tables

    def evals(runs: int) -> list[dict]:
        rng = random.Random(runs)
        return [{"method": m, "seed": seed, "path": 1, "client": c, "tar_global": rng.random(), "tar_tuned": rng.random()}
                for m in ("a", "b") for seed in range(runs) for c in (1, 2)]

    few = tables(Scores(evals(2), unseen=set()))["tests"]
    assert few.rows and all(row[3] == "2" and row[4].endswith("(too few pairs)") for row in few.rows)
    assert "too few pairs" in few.caption
    enough = tables(Scores(evals(MIN_PAIRS), unseen=set()))["tests"]
    assert all(row[3] == str(MIN_PAIRS) and "too few" not in row[4] + row[5] for row in enough.rows)


def test_the_thesis_orderings_are_checked_on_the_tables_numbers_with_the_paired_test():
    """Issue 29: the demo shows the thesis's orderings (claim, holds, numbers, the paired test's p)."""
    from fedcare.studies.facerec.report import Scores, orderings, paired_tests, tables

    import random

    rng = random.Random(0)  # hfmaml 0.1 above fedavg everywhere, plus noise
    evals = [{"method": m, "seed": seed, "path": path, "client": c,
              "tar_global": 0.5 + 0.05 * rng.random() + (0.1 if m == "hfmaml" else 0.0),
              "tar_tuned": 0.55 + 0.05 * rng.random() + (0.1 if m == "hfmaml" else 0.0)}
             for m in ("fedavg", "hfmaml") for seed in range(2) for path in range(1, 5) for c in (1, 2, 3)]
    s = Scores(evals, unseen={3})
    checks = {c.claim: c for c in orderings(s)}
    beats = checks["HF-MAML beats FL: hfmaml tuned > fedavg tuned (trained)"]
    assert beats.holds and beats.left == pytest.approx(s.mean("hfmaml", "tar_tuned", "trained"))
    assert beats.n == 8 and beats.p == paired_tests(s.per_run("hfmaml", "tar_tuned", "trained"),
                                                    s.per_run("fedavg", "tar_tuned", "trained"))[0]
    assert "tuning raises TAR: fedavg tuned > fedavg global (unseen)" in checks
    fair = checks["HF-MAML lowers the std across clients: hfmaml std tuned < fedavg std tuned (trained)"]
    assert fair.left == pytest.approx(s.fairness("hfmaml", "tar_tuned", "trained"))
    assert not any("-local" in claim or "fedfr" in claim for claim in checks)  # only what the run's methods show
    table = tables(s)["orderings"]
    assert table.columns[-2:] == ["p (paired t-test)", "n"] and len(table.rows) == len(checks)
    assert "orderings" not in tables(Scores([dict(e, method=e["method"] + "x") for e in evals], unseen={3}))


def test_the_printed_summary_has_table_a1_and_the_orderings(tmp_path):
    """What `fedcare demo facerec` prints after the run: Table A.1, then the orderings table."""
    from fedcare.studies.facerec.report import summary_markdown

    rows = [{"type": "client_eval", "method": m, "seed": seed, "path": 1, "client": c, "tar_global": 0.3 + 0.1 * c,
             "tar_tuned": 0.4 + 0.05 * c + 0.01 * seed + (0.1 + 0.03 * (seed == 1) if m == "hfmaml" else 0.0)}
            for m in ("fedavg", "hfmaml") for seed in range(3) for c in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "run.json").write_text(json.dumps({"unseen": [2]}))
    text = summary_markdown(tmp_path)
    assert text.index("Table A.1: mean TAR@FAR") < text.index("The thesis's orderings on this run")
    assert "| HF-MAML beats FL: hfmaml tuned > fedavg tuned (trained) | 57.0 | 46.0 | yes |" in text

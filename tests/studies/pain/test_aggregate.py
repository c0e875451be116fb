"""The pain study's aggregation of test records (fedcare.studies.pain.aggregate) against hand-
computed values: the positive-session mask, example weighting, SD between subjects, seed
averaging; and reading records back."""

import math

import numpy as np
import pytest

from fedcare.evaluation.statistics import read_records
from fedcare.studies.pain.aggregate import (
    aggregate,
    load_test_records,
    method_summaries,
    per_session_values,
    per_subject_values,
)


# (session, client, n, positives, f1) of one seed; f1 depends on the method and seed below.
LAYOUT = [
    (1, 10, 100, 10),
    (2, 10, 300, 30),
    (1, 20, 200, 20),
    (2, 20, 200, 0),  # no positives: masked out
    (1, 30, 100, 5),
    (2, 30, 100, 5),
]


# method "Second" (appears second), seed 1: f1 per record; seed 2 adds 0.1 everywhere
SECOND_F1 = [0.2, 0.6, 0.5, 0.9, 0.4, 0.8]


# method "First" (appears first): f1 by client only, both seeds
FIRST_F1 = {10: 0.7, 20: 0.1, 30: 0.3}


def _records():
    out = [{"type": "round", "method": "First", "seed": 1, "phase": "session-1", "round": 1, "val_loss": 0.6},
           {"type": "something-new", "method": "Zeta", "acc": 1.0}]
    for seed in (1, 2):
        for session, client, n, pos in LAYOUT:
            f1 = FIRST_F1[client]
            out.append({"type": "test", "study": "pain", "method": "First", "seed": seed, "session": session,
                        "client": client, "n": n, "positives": pos, "acc": f1, "pr_auc": f1, "f1": f1,
                        "precision": None, "recall": 0.5, "roc_auc": 0.5, "loss": 0.1})
        for (session, client, n, pos), f1 in zip(LAYOUT, SECOND_F1):
            f1 = f1 + (0.1 if seed == 2 else 0.0)
            # PR-AUC undefined (null) for seed 1's (session 1, client 10): left out of PR-AUC means
            pr = None if (seed, session, client) == (1, 1, 10) else f1
            out.append({"type": "test", "study": "pain", "method": "Second", "seed": seed, "session": session,
                        "client": client, "n": n, "positives": pos, "acc": 1 - f1, "pr_auc": pr, "f1": f1,
                        "precision": f1, "recall": f1, "roc_auc": f1, "loss": 0.2})
    return out


def test_aggregation_hand_computed():
    agg = aggregate(_records())
    assert agg.methods == ["First", "Second"]  # order of first appearance, unknown types ignored
    assert agg.subjects == [10, 20, 30] and agg.sessions == [1, 2]

    # "Second", seed 1 (the (2, 20) record with f1 0.9 is masked out):
    #   per subject: 10 -> (0.2*100 + 0.6*300)/400 = 0.5; 20 -> 0.5; 30 -> (0.4*100 + 0.8*100)/200 = 0.6
    #   per session: 1 -> (0.2*100 + 0.5*200 + 0.4*100)/400 = 0.4; 2 -> (0.6*300 + 0.8*100)/400 = 0.65
    #   overall: (20 + 180 + 100 + 40 + 80)/800 = 0.525
    # seed 2: everything + 0.1 (SDs unchanged)
    s1 = agg.per_seed[("Second", 1)]
    assert s1.records == 5 and s1.examples == 800
    assert s1.per_subject["f1"] == pytest.approx({10: 0.5, 20: 0.5, 30: 0.6})
    assert s1.per_session["f1"] == pytest.approx({1: 0.4, 2: 0.65})
    assert s1.overall["f1"] == pytest.approx(0.525)
    subj_sd = float(np.std([0.5, 0.5, 0.6]))
    assert s1.subject_sd["f1"] == pytest.approx(subj_sd)
    assert s1.session_sd["f1"] == pytest.approx(0.125)  # std of [0.4, 0.65]
    # PR-AUC: the null record of (1, 10) drops out with its weight
    assert s1.per_subject["pr_auc"][10] == pytest.approx(0.6)
    assert s1.per_session["pr_auc"][1] == pytest.approx((0.5 * 200 + 0.4 * 100) / 300)
    assert s1.overall["pr_auc"] == pytest.approx((180 + 100 + 40 + 80) / 700)
    assert agg.per_seed[("Second", 2)].overall["f1"] == pytest.approx(0.625)

    second = agg.summary["Second"]
    assert second.seeds == [1, 2] and second.records == 10 and second.masked_out == 2
    assert second.mean["f1"] == pytest.approx((0.525 + 0.625) / 2)
    assert second.sd["f1"] == pytest.approx(subj_sd)
    assert second.session_sd["f1"] == pytest.approx(0.125)
    assert second.seed_sd["f1"] == pytest.approx(0.05)  # population SD of [0.525, 0.625]
    assert second.mean["acc"] == pytest.approx(1 - 0.575)
    assert agg.per_subject["f1"]["Second"] == pytest.approx({10: 0.55, 20: 0.55, 30: 0.65})
    assert agg.per_session["f1"]["Second"] == pytest.approx({1: 0.45, 2: 0.70})

    # "First": per subject 0.7, 0.1, 0.3; per session 1 -> (70 + 20 + 30)/400 = 0.3,
    # 2 -> (210 + 30)/400 = 0.6; overall (70 + 210 + 20 + 30 + 30)/800 = 0.45; same in both seeds
    first = agg.summary["First"]
    assert first.mean["f1"] == pytest.approx(0.45)
    assert first.sd["f1"] == pytest.approx(float(np.std([0.7, 0.1, 0.3])))
    assert first.session_sd["f1"] == pytest.approx(0.15)
    assert first.seed_sd["f1"] == pytest.approx(0.0)
    assert math.isnan(first.mean["precision"])  # all null
    assert agg.per_subject["f1"]["First"] == pytest.approx({10: 0.7, 20: 0.1, 30: 0.3})
    assert agg.per_session["f1"]["First"] == pytest.approx({1: 0.3, 2: 0.6})

    # rank sums by subject: 10 -> First wins; 20, 30 -> Second wins. By session: Second wins both.
    assert agg.rank_sums("subject", "f1") == {"First": 1.0, "Second": 2.0}
    assert agg.rank_sums("session", "f1") == {"First": 0.0, "Second": 2.0}

    # the convenience helpers agree
    assert [s.method for s in method_summaries(_records())] == ["First", "Second"]
    assert per_subject_values(_records(), "f1") == agg.per_subject["f1"]
    assert per_session_values(_records(), "f1") == agg.per_session["f1"]


def test_session_without_positives_is_nan():
    records = [r for r in _records() if r["type"] == "test"]
    for r in records:
        if r["session"] == 2:
            r["positives"] = 0
    agg = aggregate(records)
    assert agg.sessions == [1, 2]
    assert math.isnan(agg.per_session["f1"]["First"][2])
    assert agg.summary["First"].session_sd["f1"] == 0.0  # one session left
    assert agg.rank_units("session", "f1") == [1]


def test_records_io(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"type": "test", "acc": NaN}\n\n{"type": "round"}\n{"type": "te')  # cut-off last line
    records, notes = read_records(path)
    assert len(records) == 2 and math.isnan(records[0]["acc"]) and notes
    path.write_text('{"type": "test"}\nnot json\n{"type": "round"}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_records(path)
    with pytest.raises(ValueError, match="lacks"):
        load_test_records([{"type": "test", "method": "A", "seed": 1}])


def test_a_metric_out_of_range_is_an_error_naming_the_record():
    """F1 7.5 would be shown as 750.0."""
    record = {"type": "test", "method": "A", "seed": 1, "session": 1, "client": 43, "n": 10, "positives": 2, "f1": 7.5}
    with pytest.raises(ValueError, match=r"test record 1: f1 = 7.5: not a fraction"):
        load_test_records([record])

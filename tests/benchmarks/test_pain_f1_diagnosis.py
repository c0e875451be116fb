"""benchmarks/pain_f1_diagnosis.py's arithmetic, which the README's pain-demo finding reads:
the example-weighted F1 of given predictions, and ROC-AUC within groups."""

import importlib.util

import numpy as np
from sklearn.metrics import f1_score, roc_auc_score

from support import ROOT


_spec = importlib.util.spec_from_file_location(
    "pain_f1_diagnosis", ROOT / "benchmarks" / "pain_f1_diagnosis.py")
diagnosis = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(diagnosis)


def test_weighted_f1_is_sklearns_per_record_f1_weighted_by_record_size():
    rng = np.random.default_rng(0)
    truth = [rng.random(n) < 0.3 for n in (5, 12, 30)]
    truth[0][:] = False
    truth[0][2] = True  # one pain frame, missed below: F1 0
    predicted = [rng.random(len(t)) < 0.5 for t in truth]
    predicted[0][:] = False
    sizes = [len(t) for t in truth]
    expected = 100 * np.average([f1_score(t, p, zero_division=0) for t, p in zip(truth, predicted)], weights=sizes)
    assert abs(diagnosis.weighted_f1(predicted, truth, sizes) - expected) < 1e-9
    # calling every frame pain: 2p/(1+p) per record
    all_pain = diagnosis.weighted_f1([np.ones_like(t) for t in truth], truth, sizes)
    shares = [t.mean() for t in truth]
    assert abs(all_pain - 100 * np.average([2 * p / (1 + p) for p in shares], weights=sizes)) < 1e-9


def test_within_group_auc_ignores_the_offset_between_groups():
    # two sequences whose scores are shifted by 0.5: perfectly ranked inside each, not pooled
    scores = np.array([0.1, 0.2, 0.3, 0.6, 0.7, 0.8])
    groups = np.array([1, 1, 1, 2, 2, 2])
    negative = np.array([True, True, False, True, True, False])
    positive = ~negative
    assert diagnosis.within(groups, scores, negative, positive) == 1.0
    pooled = roc_auc_score(positive[negative | positive], scores)
    assert pooled < 1.0
    # a group without positives does not count; weights are the groups' positives
    scores2 = np.array([0.1, 0.9, 0.5, 0.4, 0.6, 0.3, 0.2])
    groups2 = np.array([1, 1, 2, 2, 2, 3, 3])
    neg2 = np.array([True, False, True, False, False, True, True])
    pos2 = ~neg2
    expected = (1 * 1.0 + 2 * 0.5) / 3  # group 1: 1 positive, AUC 1; group 2: 2 positives, AUC 0.5
    assert abs(diagnosis.within(groups2, scores2, neg2, pos2) - expected) < 1e-12

"""Binary metrics (fedcare.evaluation.metrics) against hand-computed values: a hand example, the
threshold, JSON, a single class and the edge cases."""

import json
import math

import numpy as np
import pytest

from fedcare.evaluation.metrics import binary_metrics


def test_binary_metrics_hand_example():
    m = binary_metrics(np.array([0, 0, 1, 1]), np.array([0.1, 0.6, 0.4, 0.9]))
    # predictions at 0.5: [0, 1, 0, 1] -> tp 1 (0.9), fp 1 (0.6), fn 1 (0.4), tn 1 (0.1)
    assert (m["tp"], m["tn"], m["fp"], m["fn"]) == (1, 1, 1, 1)
    assert (m["n"], m["positives"]) == (4, 2)
    assert m["acc"] == pytest.approx(0.5)
    assert m["precision"] == pytest.approx(0.5)
    assert m["recall"] == pytest.approx(0.5)
    assert m["f1"] == pytest.approx(0.5)
    # Average precision, scores descending 0.9(+) 0.6(-) 0.4(+) 0.1(-):
    # recall steps 0 -> 0.5 at precision 1/1 and 0.5 -> 1 at precision 2/3: 0.5*1 + 0.5*2/3 = 5/6.
    assert m["pr_auc"] == pytest.approx(5 / 6)
    # ROC-AUC: of the 4 (positive, negative) pairs, 3 are ordered correctly (0.4 < 0.6 is not).
    assert m["roc_auc"] == pytest.approx(0.75)
    assert list(m) == ["acc", "pr_auc", "f1", "precision", "recall", "roc_auc", "n", "positives", "tp", "tn", "fp", "fn"]


def test_binary_metrics_threshold_and_json():
    m = binary_metrics(np.array([0.0, 0.0, 1.0, 1.0]), np.array([0.1, 0.6, 0.4, 0.9]), threshold=0.3)
    # predictions [0, 1, 1, 1]: tp 2, fp 1, tn 1, fn 0
    assert (m["tp"], m["tn"], m["fp"], m["fn"]) == (2, 1, 1, 0)
    assert m["acc"] == pytest.approx(0.75)
    assert m["precision"] == pytest.approx(2 / 3)
    assert m["recall"] == pytest.approx(1.0)
    assert m["f1"] == pytest.approx(0.8)
    assert m["pr_auc"] == pytest.approx(5 / 6)  # threshold-free
    assert all(type(m[k]) is int for k in ("n", "positives", "tp", "tn", "fp", "fn"))
    json.dumps(m, allow_nan=False)  # plain Python numbers


def test_binary_metrics_single_class():
    m = binary_metrics(np.array([0, 0, 0]), np.array([0.2, 0.7, 0.1]))
    assert math.isnan(m["pr_auc"]) and math.isnan(m["roc_auc"])
    assert m["acc"] == pytest.approx(2 / 3)
    assert (m["precision"], m["recall"], m["f1"]) == (0.0, 0.0, 0.0)  # zero_division=0
    assert m["positives"] == 0 and m["fp"] == 1

    m = binary_metrics(np.array([1, 1]), np.array([0.2, 0.7]))
    assert math.isnan(m["pr_auc"]) and math.isnan(m["roc_auc"])
    assert m["recall"] == pytest.approx(0.5) and m["precision"] == pytest.approx(1.0)


def test_binary_metrics_edge_cases():
    empty = binary_metrics(np.array([]), np.array([]))
    assert empty["n"] == 0 and math.isnan(empty["acc"])
    diverged = binary_metrics(np.array([0, 1]), np.array([np.nan, 0.3]))
    assert diverged["n"] == 2 and diverged["positives"] == 1
    assert all(math.isnan(diverged[k]) for k in ("acc", "f1", "pr_auc", "tp"))
    with pytest.raises(ValueError):
        binary_metrics(np.array([0, 2]), np.array([0.1, 0.2]))
    with pytest.raises(ValueError):
        binary_metrics(np.array([0, 1]), np.array([0.1]))

"""Classification metrics for one client's test set: binary (Tobis thesis §7.1) and multi-label
(surgical thesis §4.2).

The thesis reports ACC, PR-AUC and F1 at threshold 0.5; its code also tracked TP/TN/FP/FN,
precision, recall and ROC-AUC through Keras metrics. We compute the same quantities with
scikit-learn:

- **PR-AUC** is scikit-learn's ``average_precision_score`` (step-wise sum of precision times
  recall increments over the distinct score thresholds). Keras's ``AUC(curve="PR")`` instead
  integrates an interpolated precision-recall curve with trapezoids over 200 fixed thresholds,
  so its values differ slightly (typically by a point or less) from ours; the random-classifier
  baseline is the positive rate in both.
- **F1, precision, recall** use ``zero_division=0`` (no predicted positives gives precision 0,
  no actual positives gives recall 0 and F1 0), as Keras's counters do.
- **PR-AUC and ROC-AUC are NaN** when ``y_true`` holds only one class (they are undefined);
  the study's positive-session mask (see :mod:`fedcare.evaluation.statistics`) drops the
  sessions without positives anyway.

All values are fractions in [0, 1]; reports multiply by 100.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

METRIC_KEYS = ("acc", "pr_auc", "f1", "precision", "recall", "roc_auc")
COUNT_KEYS = ("n", "positives", "tp", "tn", "fp", "fn")


def binary_metrics(y_true: np.ndarray, y_score: np.ndarray, threshold: float = 0.5) -> dict[str, float]:
    """Metrics of the pain probabilities ``y_score`` against the 0/1 labels ``y_true``.

    The predicted label is ``y_score >= threshold``. Returns a dict with the keys
    acc, pr_auc, f1, precision, recall, roc_auc (floats in [0, 1], or NaN where undefined) and
    n, positives, tp, tn, fp, fn (ints). Plain Python numbers only, so the dict is JSON-ready.

    - Empty input: the counts are 0 and every metric is NaN.
    - Non-finite scores (a diverged model): the counts n and positives are kept, every metric
      and tp/tn/fp/fn are NaN, so the record shows up as "NA" instead of crashing a long run
      or being scored as if the NaNs were negatives.

    Raises ValueError when the shapes differ or ``y_true`` holds values other than 0 and 1.
    """
    # imported here: a site's ClientApp process (one per message on Flower) often needs no metrics
    from sklearn.metrics import average_precision_score, precision_recall_fscore_support, roc_auc_score

    y = np.asarray(y_true).reshape(-1)
    s = np.asarray(y_score, dtype=np.float64).reshape(-1)
    if y.shape != s.shape:
        raise ValueError(f"y_true has {y.size} values but y_score has {s.size}")
    if y.size and not np.isin(y, (0, 1)).all():
        raise ValueError("y_true must contain only 0 and 1")
    y = y.astype(np.int64)
    n = int(y.size)
    positives = int(y.sum())
    nan = math.nan
    out: dict[str, float] = {k: nan for k in METRIC_KEYS}
    out.update(n=n, positives=positives, tp=nan, tn=nan, fp=nan, fn=nan)
    if n == 0:
        out.update(tp=0, tn=0, fp=0, fn=0)
        return out
    if not np.isfinite(s).all():
        return out

    pred = (s >= threshold).astype(np.int64)
    tp = int(((pred == 1) & (y == 1)).sum())
    tn = int(((pred == 0) & (y == 0)).sum())
    fp = int(((pred == 1) & (y == 0)).sum())
    fn = int(((pred == 0) & (y == 1)).sum())
    precision, recall, f1, _ = precision_recall_fscore_support(
        y, pred, average="binary", pos_label=1, labels=[0, 1], zero_division=0
    )
    out.update(
        acc=(tp + tn) / n,
        precision=float(precision),
        recall=float(recall),
        f1=float(f1),
        tp=tp, tn=tn, fp=fp, fn=fn,
    )
    if 0 < positives < n:
        out["pr_auc"] = float(average_precision_score(y, s))
        out["roc_auc"] = float(roc_auc_score(y, s))
    return out


def multilabel_metrics(
    y_true: np.ndarray, y_score: np.ndarray, labels: Sequence[str] = (), threshold: float = 0.5
) -> dict[str, float]:
    """Per-label precision, recall and F1 of the scores ``y_score`` (N, L) against 0/1 labels
    ``y_true`` (N, L) at ``threshold``, and their macro mean over labels (the surgical
    thesis's macro F1). Keys: ``macro_f1``, ``macro_precision``, ``macro_recall`` and, per
    label, ``f1/<label>``, ``precision/<label>``, ``recall/<label>``, ``positives/<label>`` and
    the counts ``tp/<label>``, ``fp/<label>``, ``fn/<label>`` (summed over clients, they give the
    scores on the union of their data) (`labels` names them; default "0", "1", ...). Zero division gives 0 (scikit-learn's
    ``zero_division=0``): a label never present and never predicted scores F1 0, and counts
    in the macro mean, as the thesis's HEI2 with a missing tool. NaN everywhere when the
    input is empty or holds non-finite scores."""
    from sklearn.metrics import precision_recall_fscore_support

    y = np.asarray(y_true)
    s = np.asarray(y_score, dtype=np.float64)
    if y.ndim != 2 or y.shape != s.shape:
        raise ValueError(f"y_true and y_score must both be (N, L), got {y.shape} and {s.shape}")
    names = [str(n) for n in labels] if labels else [str(i) for i in range(y.shape[1])]
    if len(names) != y.shape[1]:
        raise ValueError(f"{len(names)} label names for {y.shape[1]} labels")
    out: dict[str, float] = {}
    counts = np.full((3, len(names)), math.nan)
    if len(y) == 0 or not np.isfinite(s).all():
        precision = recall = f1 = np.full(len(names), math.nan)
    else:
        pred = (s >= threshold).astype(np.int64)
        truth = y.astype(np.int64)
        precision, recall, f1, _ = precision_recall_fscore_support(
            truth, pred, average=None, labels=list(range(len(names))), zero_division=0)
        counts = np.stack([(pred & truth).sum(0), (pred & (1 - truth)).sum(0), ((1 - pred) & truth).sum(0)])
    out["macro_f1"] = float(np.mean(f1))
    out["macro_precision"] = float(np.mean(precision))
    out["macro_recall"] = float(np.mean(recall))
    for i, name in enumerate(names):
        out[f"f1/{name}"] = float(f1[i])
        out[f"precision/{name}"] = float(precision[i])
        out[f"recall/{name}"] = float(recall[i])
        out[f"positives/{name}"] = int(y[:, i].sum()) if len(y) else 0
        for row, what in enumerate(("tp", "fp", "fn")):
            out[f"{what}/{name}"] = math.nan if math.isnan(counts[row, i]) else int(counts[row, i])
    return out

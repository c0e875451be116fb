"""The pain study's aggregation of per-client test records into the thesis's tables (Tobis
thesis §6.3, §7).

A run writes one ``{"type": "client_eval", "session": s, ...}`` record per (method, seed,
session, client): the metrics of that client's own model on that client's data of session s
(before training on it), with ``n`` examples of which ``positives`` are pain. Runs made
before the record types were unified wrote ``"type": "test"``; both are read. The aggregation, step by step:

1. **Mask.** A test record counts only if ``positives > 0`` (the thesis's positive-session
   mask: a client-session pair is kept only if the client has pain frames in that session).
   Records with ``n <= 0`` are dropped as well.
2. **Per (method, seed)**, for each metric separately:

   - per-subject value: the example-weighted mean (weight ``n``) over that subject's masked
     sessions;
   - per-session value: the example-weighted mean over that session's masked subjects;
   - overall value: the example-weighted mean over all masked records (the thesis's
     "weighted AVG"; the same number whether one groups by subject or by session);
   - SD across subjects: the population SD (``ddof=0``, unweighted) of the per-subject values
     (the thesis's "SD between test subjects", the ± of Tables 7.1 and 7.4);
   - SD across sessions: the population SD of the per-session values (the ± of Table 7.5).

   A metric value that is NaN (``null`` in the JSON, e.g. PR-AUC of a record whose labels are
   all one class) is left out of that metric's means, together with its weight.
3. **Across seeds**: the mean over seeds of each per-seed value (mean of means, mean of SDs,
   mean of per-subject and per-session values, NaN-skipping), plus the population SD across
   seeds of the overall value ("seed SD": 0 with one seed).

Rank sums (Tables 7.6/7.7) rank the methods per subject or per session on the seed-averaged
per-subject / per-session values.

All values are fractions; reports show percentages.
"""


from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedcare.errors import InputError
from fedcare.evaluation.statistics import (
    Unit, as_float, as_fraction, as_unit, first_appearance, nanmean, nanstd, rank_sums, rank_units, sort_units,
    weighted_mean_sd,
)

METRICS = ("acc", "pr_auc", "f1", "precision", "recall", "roc_auc")
PRIMARY_METRICS = ("acc", "pr_auc", "f1")
METRIC_LABELS = {
    "acc": "ACC", "pr_auc": "PR-AUC", "f1": "F1", "precision": "Precision", "recall": "Recall", "roc_auc": "ROC-AUC",
}
COUNTS = ("tp", "fp", "fn", "tn")  # a test record's confusion counts at threshold 0.5
TEST_TYPES = ("client_eval", "test")  # "test": run directories written before the record types were unified


@dataclass(frozen=True)
class ClientTestRecord:
    """One test of a subject on a session: a ``"client_eval"`` line of metrics.jsonl with a session."""

    method: str
    seed: Any
    session: Unit
    client: Unit
    n: float
    positives: float
    values: Mapping[str, float]  # metric -> fraction or NaN
    counts: Mapping[str, float] = field(default_factory=dict)  # tp/fp/fn/tn at threshold 0.5 (NaN if missing)

    @property
    def masked_in(self) -> bool:
        """True if the record passes the positive-session mask (positives > 0, n > 0)."""
        return self.positives > 0 and self.n > 0


def load_test_records(
    records: Iterable[Mapping[str, Any] | ClientTestRecord], source: str = "metrics.jsonl",
) -> list[ClientTestRecord]:
    """The test records (``client_eval`` with a session, or legacy ``test``) as
    :class:`ClientTestRecord` (other records are ignored).

    Metric values that are null, missing or non-numeric become NaN. A test record without
    method, seed, session, client, n or positives raises ValueError naming ``source`` and the
    record's position (its line, for records read from metrics.jsonl without blank lines).
    """
    out = []
    for i, r in enumerate(records, start=1):
        rec = _to_test_record(r, i, source)
        if rec is not None:
            out.append(rec)
    return out


def _to_test_record(r: Mapping[str, Any] | ClientTestRecord, index: int, source: str) -> ClientTestRecord | None:
    if isinstance(r, ClientTestRecord):
        return r
    if r.get("type") not in TEST_TYPES or (r.get("type") == "client_eval" and "session" not in r):
        return None
    missing = [k for k in ("method", "seed", "session", "client", "n", "positives") if r.get(k) is None]
    if missing:
        raise InputError(f"{source}: test record {index} lacks {', '.join(missing)}")
    return ClientTestRecord(
        method=str(r["method"]), seed=as_unit(r["seed"]), session=as_unit(r["session"]), client=as_unit(r["client"]),
        n=as_float(r["n"]), positives=as_float(r["positives"]),
        values={m: as_fraction(r.get(m), f"{source}: test record {index}: {m}") for m in METRICS},
        counts={k: as_float(r.get(k)) for k in COUNTS},
    )


# -- aggregation ------------------------------------------------------------------------
@dataclass
class SeedAggregate:
    """The numbers of one (method, seed); every dict is keyed by metric."""

    overall: dict[str, float]
    subject_sd: dict[str, float]
    session_sd: dict[str, float]
    per_subject: dict[str, dict[Unit, float]]
    per_session: dict[str, dict[Unit, float]]
    records: int  # masked-in records
    examples: float  # their total n


def aggregate_seed(records: Sequence[ClientTestRecord], metrics: Sequence[str] = METRICS) -> SeedAggregate:
    """Aggregate the test records of one (method, seed) (see the module docstring).

    Records failing the positive-session mask are dropped here. Per-subject and per-session
    dicts only contain units with at least one masked-in record (their value may still be NaN
    if the metric is NaN in all of them).
    """
    kept = [r for r in records if r.masked_in]
    out = SeedAggregate({}, {}, {}, {}, {}, records=len(kept), examples=float(sum(r.n for r in kept)))
    subjects = sort_units(r.client for r in kept)
    sessions = sort_units(r.session for r in kept)
    for m in metrics:
        out.overall[m] = weighted_mean_sd([r.values[m] for r in kept], [r.n for r in kept])[0]
        out.per_subject[m] = {
            k: weighted_mean_sd([r.values[m] for r in kept if r.client == k], [r.n for r in kept if r.client == k])[0]
            for k in subjects
        }
        out.per_session[m] = {
            s: weighted_mean_sd([r.values[m] for r in kept if r.session == s], [r.n for r in kept if r.session == s])[0]
            for s in sessions
        }
        out.subject_sd[m] = nanstd(out.per_subject[m].values())
        out.session_sd[m] = nanstd(out.per_session[m].values())
    return out


@dataclass
class MethodSummary:
    """One row of Table 7.1, averaged over seeds; dicts are keyed by metric."""

    method: str
    seeds: list
    mean: dict[str, float]  # mean over seeds of the overall weighted mean
    sd: dict[str, float]  # mean over seeds of the SD across subjects
    session_sd: dict[str, float]  # mean over seeds of the SD across sessions
    seed_sd: dict[str, float]  # population SD across seeds of the overall weighted mean
    records: int  # masked-in test records, all seeds
    masked_out: int  # test records dropped by the mask, all seeds


@dataclass
class RunAggregate:
    """Everything the report shows, computed from a run's test records."""

    methods: list[str]  # order of first appearance
    subjects: list[Unit]  # every client with a test record, masked or not
    sessions: list[Unit]  # every session with a test record, masked or not
    summary: dict[str, MethodSummary]
    per_subject: dict[str, dict[str, dict[Unit, float]]]  # metric -> method -> subject -> value
    per_session: dict[str, dict[str, dict[Unit, float]]]  # metric -> method -> session -> value
    per_seed: dict[tuple[str, Any], SeedAggregate] = field(default_factory=dict)
    metrics: tuple[str, ...] = METRICS

    def rank_sums(self, by: str, metric: str) -> dict[str, float]:
        """Rank sums by "subject" or "session" of one metric (Tables 7.6/7.7)."""
        return rank_sums(self._table(by, metric))

    def rank_units(self, by: str, metric: str) -> list[Unit]:
        return rank_units(self._table(by, metric))

    def _table(self, by: str, metric: str) -> dict[str, dict[Unit, float]]:
        if by == "subject":
            return self.per_subject[metric]
        if by == "session":
            return self.per_session[metric]
        raise ValueError(f"by must be 'subject' or 'session', not {by!r}")


def aggregate(
    records: Iterable[Mapping[str, Any] | ClientTestRecord], metrics: Sequence[str] = METRICS,
    source: str = "metrics.jsonl",
) -> RunAggregate:
    """Aggregate a run's records (dicts as read from metrics.jsonl, or ClientTestRecords).

    Non-test records are ignored. Methods keep their order of first appearance. Per-subject
    and per-session values of a method are the means over seeds of the per-seed values (seeds
    where the unit has no masked-in record are skipped); units never masked in are NaN.
    """
    tests = load_test_records(records, source)
    methods = first_appearance(r.method for r in tests)
    subjects = sort_units(r.client for r in tests)
    sessions = sort_units(r.session for r in tests)
    per_seed: dict[tuple[str, Any], SeedAggregate] = {}
    summary: dict[str, MethodSummary] = {}
    per_subject: dict[str, dict[str, dict[Unit, float]]] = {m: {} for m in metrics}
    per_session: dict[str, dict[str, dict[Unit, float]]] = {m: {} for m in metrics}
    for method in methods:
        mine = [r for r in tests if r.method == method]
        seeds = first_appearance(r.seed for r in mine)
        aggs = []
        for seed in seeds:
            agg = aggregate_seed([r for r in mine if r.seed == seed], metrics)
            per_seed[(method, seed)] = agg
            aggs.append(agg)
        summary[method] = MethodSummary(
            method=method,
            seeds=seeds,
            mean={m: nanmean(a.overall[m] for a in aggs) for m in metrics},
            sd={m: nanmean(a.subject_sd[m] for a in aggs) for m in metrics},
            session_sd={m: nanmean(a.session_sd[m] for a in aggs) for m in metrics},
            seed_sd={m: nanstd(a.overall[m] for a in aggs) for m in metrics},
            records=sum(a.records for a in aggs),
            masked_out=len(mine) - sum(a.records for a in aggs),
        )
        for m in metrics:
            per_subject[m][method] = {k: nanmean(a.per_subject[m].get(k, math.nan) for a in aggs) for k in subjects}
            per_session[m][method] = {s: nanmean(a.per_session[m].get(s, math.nan) for a in aggs) for s in sessions}
    return RunAggregate(
        methods=methods, subjects=subjects, sessions=sessions, summary=summary,
        per_subject=per_subject, per_session=per_session, per_seed=per_seed, metrics=tuple(metrics),
    )


def method_summaries(records: Iterable[Mapping[str, Any]]) -> list[MethodSummary]:
    """Table 7.1: one :class:`MethodSummary` per method, in order of first appearance."""
    agg = aggregate(records)
    return [agg.summary[m] for m in agg.methods]


def per_subject_values(records: Iterable[Mapping[str, Any]], metric: str) -> dict[str, dict[Unit, float]]:
    """Table 7.4 for one metric: method -> subject -> seed-averaged weighted mean."""
    return aggregate(records, (metric,)).per_subject[metric]


def per_session_values(records: Iterable[Mapping[str, Any]], metric: str) -> dict[str, dict[Unit, float]]:
    """Table 7.5 for one metric: method -> session -> seed-averaged weighted mean (NaN where
    the session has no masked-in record)."""
    return aggregate(records, (metric,)).per_session[metric]


# -- F1's threshold ---------------------------------------------------------------------
@dataclass(frozen=True)
class ThresholdSummary:
    """How a method's decisions at threshold 0.5 fall, its masked-in records (all seeds) taken
    together: why its F1 can disagree with ACC and PR-AUC. F1 is a per-record value averaged
    with weights, so a record in which no pain frame reaches 0.5 counts as F1 = 0 however well the
    model ranks its frames, while a model that calls most frames pain never scores 0."""

    records: int  # masked-in records with counts
    missed: int  # of which no pain frame reached 0.5 (tp = 0: F1 = 0 there)
    predicted_pain: float  # share of their frames predicted pain
    precision: float  # pooled over their frames
    recall: float
    f1: float


def threshold_summaries(records: Iterable[Mapping[str, Any] | ClientTestRecord],
                        source: str = "metrics.jsonl") -> dict[str, ThresholdSummary]:
    """method -> ThresholdSummary over its masked-in records that carry tp/fp/fn/tn; methods
    whose records carry none are left out."""
    out = {}
    tests = [r for r in load_test_records(records, source) if r.masked_in]
    for method in first_appearance(r.method for r in tests):
        mine = [r for r in tests if r.method == method and not any(math.isnan(r.counts.get(k, math.nan)) for k in COUNTS)]
        if not mine:
            continue
        tp, fp, fn, tn = (sum(r.counts[k] for r in mine) for k in COUNTS)
        precision = tp / (tp + fp) if tp + fp else math.nan
        recall = tp / (tp + fn) if tp + fn else math.nan
        f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else math.nan
        out[method] = ThresholdSummary(
            records=len(mine), missed=sum(1 for r in mine if r.counts["tp"] == 0),
            predicted_pain=(tp + fp) / (tp + fp + fn + tn), precision=precision, recall=recall, f1=f1,
        )
    return out

"""The report of a study whose clients are evaluated round by round: every study built on
`fedcare.studies.rounds` (its `report_module`), and the aggregation the FedHealth 2 report
shares.

``build_report(run_dir, run_info, notes)`` reads ``run_dir/metrics.jsonl`` and writes::

    tables/summary.{csv,md}          per method at the final round: mean over clients ± SD
                                     across clients, weighted mean, worst and best client, seed
                                     SD; and the best single-site model
    tables/single_site.{csv,md}      each site's model trained alone, scored at every client
    tables/per_client.{csv,md}       per method and client, the final round's value
    tables/metrics.{csv,md}          every metric the clients computed, mean over clients
    plots/per_round.png              mean over clients per round
    plots/per_client.png             grouped bars per client, final round
    report.html

The metric the tables lead with is run.json's ``metric`` (the protocol's fact; "accuracy"
when it does not say). Only ``"type": "client_eval"`` records with a round are used: one per
(method, seed, round, client), that client's own model scored on its own test data with
``n`` test examples; a record with a ``model`` is the model trained at that site alone,
scored at the client (row "<method> (<site>)"). The aggregation, step by step:

1. **Final round** of a (method, seed): the largest round with client_eval records for it.
2. **Per (method, seed)** at its final round, over the clients whose value is a number (NaN,
   ``null`` or missing values are skipped and counted): the plain mean over clients, the
   population SD across clients (``ddof=0``), the mean weighted by the clients' ``n``, and the
   worst and best client (for a metric where lower is better, such as the loss, the worst is
   the highest). The same plain mean is taken at every round for the per-round curve.
3. **Across seeds**: the mean over seeds of each per-seed number (NaN-skipping; per-client
   values likewise), and "seed SD", the population SD across seeds of the per-seed mean.

The best single-site model is the site model with the best mean. A record seen twice for the
same (method, seed, round, client) counts once (the last one wins). CSVs hold raw values,
Markdown and HTML percentages for the metrics that are fractions. Every file is written
atomically.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedcare.errors import InputError
from fedcare.evaluation.statistics import (
    Unit, as_float, as_fraction, as_unit, first_appearance, nanmean, nanstd, sort_units, weighted_mean_sd,
)
from fedcare.report import write_report
from fedcare.report.html import esc, render_run_page, table_block
from fedcare.report.plots import method_bars, method_lines
from fedcare.report.tables import Table, is_missing, pct, pct_pm, unit_label
from fedcare.runfiles import METRICS_FILE, read_run_info, read_run_records

RECORD_TYPE = "client_eval"


# -- metrics ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    """A number a client computes, as the report shows it."""

    key: str  # its field in a client_eval record
    label: str  # in table headers: "ACC"
    name: str  # in sentences: "accuracy"
    higher_is_better: bool = True
    fraction: bool = True  # shown as a percentage

    def fmt(self, x: float | None) -> str:
        return pct(x) if self.fraction else ("NA" if is_missing(x) else f"{x:.3f}")

    def fmt_pm(self, mean: float | None, sd: float | None) -> str:
        if self.fraction:
            return pct_pm(mean, sd)
        return self.fmt(mean) if is_missing(mean) or is_missing(sd) else f"{self.fmt(mean)} ± {self.fmt(sd)}"

    def score(self, x: float) -> float:
        """Larger is better (the tables bold each column's largest score)."""
        return x if self.higher_is_better else -x

    @property
    def axis(self) -> str:
        return f"{self.name} (%)" if self.fraction else self.name


METRICS = {m.key: m for m in (
    Metric("accuracy", "ACC", "accuracy"), Metric("acc", "ACC", "accuracy"), Metric("roc_auc", "ROC AUC", "ROC AUC"),
    Metric("pr_auc", "PR-AUC", "PR-AUC"), Metric("f1", "F1", "F1"), Metric("precision", "precision", "precision"),
    Metric("recall", "recall", "recall"), Metric("macro_f1", "macro F1", "macro F1"), Metric("tar", "TAR", "TAR"),
    Metric("loss", "loss", "loss", higher_is_better=False, fraction=False),
)}


def metric_named(key: str) -> Metric:
    """The metric `key` (a client_eval field) as the report shows it; an unknown one by its key."""
    return METRICS.get(key) or Metric(key, key, key, fraction=False)


# -- records ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ClientEval:
    """One ``"type": "client_eval"`` line of metrics.jsonl, for one metric."""

    method: str  # the row: the method, or "<method> (<site>)" for a site's model trained alone
    seed: Any
    round: float
    client: Unit
    n: float  # test examples (NaN if missing)
    value: float  # the metric, or NaN
    model: Unit | None = None  # the site whose model this is (single-site models)


def _round(x: Any) -> float | int:
    v = float(x)
    return int(v) if v.is_integer() else v


def load_client_evals(records: Iterable[Mapping[str, Any]], metric: str,
                      source: str = METRICS_FILE) -> list[ClientEval]:
    """The client_eval records (other types are ignored), with their `metric`. A client_eval
    record without method, seed, round or client, or with a round that is not a number, raises
    InputError naming ``source`` and the record's position; a missing or non-numeric value or
    n becomes NaN."""
    out = []
    for i, r in enumerate(records, start=1):
        if r.get("type") != RECORD_TYPE or "round" not in r:
            continue
        missing = [k for k in ("method", "seed", "round", "client") if r.get(k) is None]
        if missing:
            raise InputError(f"{source}: client_eval record {i} lacks {', '.join(missing)}")
        try:
            rnd = _round(r["round"])
        except (TypeError, ValueError):
            raise InputError(
                f"{source}: client_eval record {i} has a round that is not a number: {r['round']!r}"
            ) from None
        model = as_unit(r["model"]) if r.get("model") is not None else None
        method = str(r["method"]) if model is None else f"{r['method']} ({unit_label(model)})"
        value = (as_fraction(r.get(metric), f"{source}: client_eval record {i}: {metric}")
                 if metric_named(metric).fraction else as_float(r.get(metric)))
        out.append(ClientEval(method=method, seed=as_unit(r["seed"]), round=rnd, client=as_unit(r["client"]),
                              n=as_float(r.get("n")), value=value, model=model))
    return out


# -- aggregation ------------------------------------------------------------------------
@dataclass
class SeedSummary:
    """The final-round numbers of one (method, seed)."""

    final_round: float
    per_client: dict[Unit, float]  # NaN where the value was not a number
    mean: float
    sd: float
    weighted: float
    worst: float
    best: float
    per_round: dict[float, float]  # plain mean over clients per round


def _clients_stats(evals: Sequence[ClientEval], higher_is_better: bool) -> tuple[float, float, float, float, float]:
    """(plain mean, population SD, n-weighted mean, worst, best) of the clients' values, NaN skipped."""
    values = np.asarray([e.value for e in evals], dtype=np.float64)
    keep = ~np.isnan(values)
    if not keep.any():
        return (math.nan,) * 5
    plain, sd = weighted_mean_sd(values[keep], np.ones(int(keep.sum())))
    n = np.asarray([e.n for e in evals], dtype=np.float64)
    ok = keep & np.isfinite(n) & (n >= 0)
    weighted = weighted_mean_sd(values[ok], n[ok])[0] if ok.any() else math.nan
    low, high = float(values[keep].min()), float(values[keep].max())
    return (plain, sd, weighted, low, high) if higher_is_better else (plain, sd, weighted, high, low)


def aggregate_seed(evals: Sequence[ClientEval], higher_is_better: bool = True) -> SeedSummary:
    """Aggregate the client_eval records of one (method, seed) (see the module docstring)."""
    by_round: dict[float, dict[Unit, ClientEval]] = {}
    for e in evals:
        by_round.setdefault(e.round, {})[e.client] = e  # duplicates: last one wins
    rounds = sorted(by_round)
    final = rounds[-1]
    last = list(by_round[final].values())
    mean, sd, weighted, worst, best = _clients_stats(last, higher_is_better)
    return SeedSummary(
        final_round=final, per_client={e.client: e.value for e in last}, mean=mean, sd=sd, weighted=weighted,
        worst=worst, best=best,
        per_round={r: _clients_stats(list(by_round[r].values()), higher_is_better)[0] for r in rounds},
    )


@dataclass
class MethodSummary:
    """One row of the summary table, averaged over seeds."""

    method: str
    seeds: list
    final_rounds: list  # per seed
    mean: float  # mean over seeds of the plain mean over clients
    sd: float  # mean over seeds of the SD across clients
    weighted: float  # mean over seeds of the example-weighted mean
    worst: float  # mean over seeds of the worst client's value
    best: float  # mean over seeds of the best client's value
    seed_sd: float  # population SD across seeds of the plain mean
    clients: int  # final-round client evaluations with a value, summed over seeds (CSV: final_evals)
    skipped: int  # final-round client evaluations with a NaN value, summed over seeds (CSV: final_nan_skipped)


@dataclass
class RoundsAggregate:
    """Everything a rounds report shows, for one metric."""

    methods: list[str]  # rows, in order of first appearance
    clients: list[Unit]  # every client with a client_eval record
    rounds: list[float]  # every round with a client_eval record
    summary: dict[str, MethodSummary]
    per_client: dict[str, dict[Unit, float]]  # row -> client -> final-round value, mean over seeds
    per_round: dict[str, dict[float, float]]  # row -> round -> mean over clients, mean over seeds
    per_seed: dict[tuple[str, Any], SeedSummary] = field(default_factory=dict)
    evaluations: int = 0  # client_eval records
    nan_evaluations: int = 0  # of which the value is not a number (any round)
    site_models: dict[str, Unit] = field(default_factory=dict)  # row -> its site, for the single-site models

    @property
    def federation_rows(self) -> list[str]:
        """The rows that are methods (not one site's model)."""
        return [m for m in self.methods if m not in self.site_models]


def aggregate(records: Iterable[Mapping[str, Any] | ClientEval], metric: str = "accuracy",
              source: str = METRICS_FILE, higher_is_better: bool | None = None) -> RoundsAggregate:
    """Aggregate a run's records (dicts as read from metrics.jsonl, or ClientEvals) for
    `metric`; see the module docstring. Rows keep their order of first appearance."""
    higher = metric_named(metric).higher_is_better if higher_is_better is None else higher_is_better
    records = list(records)
    evals = [r for r in records if isinstance(r, ClientEval)]
    evals += load_client_evals([r for r in records if not isinstance(r, ClientEval)], metric, source)
    methods = first_appearance(e.method for e in evals)
    clients = sort_units(e.client for e in evals)
    rounds = sorted({e.round for e in evals})
    summary: dict[str, MethodSummary] = {}
    per_client: dict[str, dict[Unit, float]] = {}
    per_round: dict[str, dict[float, float]] = {}
    per_seed: dict[tuple[str, Any], SeedSummary] = {}
    for method in methods:
        mine = [e for e in evals if e.method == method]
        seeds = first_appearance(e.seed for e in mine)
        aggs = []
        for seed in seeds:
            a = aggregate_seed([e for e in mine if e.seed == seed], higher)
            per_seed[(method, seed)] = a
            aggs.append(a)
        numeric = sum(sum(not math.isnan(v) for v in a.per_client.values()) for a in aggs)
        summary[method] = MethodSummary(
            method=method, seeds=seeds, final_rounds=[a.final_round for a in aggs],
            mean=nanmean(a.mean for a in aggs), sd=nanmean(a.sd for a in aggs),
            weighted=nanmean(a.weighted for a in aggs), worst=nanmean(a.worst for a in aggs),
            best=nanmean(a.best for a in aggs), seed_sd=nanstd(a.mean for a in aggs),
            clients=numeric, skipped=sum(len(a.per_client) for a in aggs) - numeric,
        )
        per_client[method] = {c: nanmean(a.per_client.get(c, math.nan) for a in aggs) for c in clients}
        per_round[method] = {r: nanmean(a.per_round.get(r, math.nan) for a in aggs) for r in rounds}
    return RoundsAggregate(
        methods=methods, clients=clients, rounds=rounds, summary=summary, per_client=per_client,
        per_round=per_round, per_seed=per_seed, evaluations=len(evals),
        nan_evaluations=sum(math.isnan(e.value) for e in evals),
        site_models={e.method: e.model for e in evals if e.model is not None},
    )


def load_run(run_dir: Path, metric: str) -> tuple[list[dict], RoundsAggregate, list[str]]:
    """(records, aggregate, notes) of a run directory for `metric`. Raises FileNotFoundError if
    metrics.jsonl is missing and InputError (naming it) if it is malformed or holds no
    client_eval records."""
    records, notes = read_run_records(run_dir)
    metrics_path = Path(run_dir) / METRICS_FILE
    agg = aggregate(records, metric, source=str(metrics_path))
    if not agg.evaluations:
        raise InputError(f"{metrics_path}: no client_eval records with a round; nothing to report")
    if agg.nan_evaluations:
        notes.append(f"{agg.nan_evaluations} of {agg.evaluations} client evaluations have no "
                     f"{metric_named(metric).name} (NaN) and are left out of the means.")
    finals = {r for s in agg.summary.values() for r in s.final_rounds}
    if len(finals) > 1:
        notes.append("Not every method and seed reached the same final round: "
                     + "; ".join(f"{m}: {'/'.join(unit_label(r) for r in s.final_rounds)}"
                                 for m, s in agg.summary.items())
                     + ".")
    return records, agg, notes


def best_site_model(agg: RoundsAggregate, metric: Metric) -> str | None:
    """The single-site row with the best mean over clients (None: no such rows)."""
    rows = [m for m in agg.site_models if not math.isnan(agg.summary[m].mean)]
    return max(rows, key=lambda m: metric.score(agg.summary[m].mean)) if rows else None


# -- tables -----------------------------------------------------------------------------
def rounds_text(rounds: Sequence[float]) -> str:
    return "/".join(unit_label(r) for r in first_appearance(rounds))


def seeds_caption(agg: RoundsAggregate, rows: Sequence[str]) -> str:
    multi_seed = any(len(agg.summary[m].seeds) > 1 for m in rows)
    return (" seed SD: population SD across seeds of the mean over clients." if multi_seed
            else " One seed, so no seed SD.")


def summary_table(agg: RoundsAggregate, metric: Metric, rows: Sequence[str], *, name: str, title: str,
                  caption: str) -> Table:
    """Per row at the final round: mean ± SD across clients, weighted mean, worst, best, seed SD."""
    columns = ["Method", f"{metric.label} (mean ± SD across clients)", f"weighted {metric.label}", "worst client",
               "best client", "seed SD", "seeds", "round"]
    cells, scores, csv_rows = [], [], []
    for method in rows:
        s = agg.summary[method]
        cells.append([method, metric.fmt_pm(s.mean, s.sd), metric.fmt(s.weighted), metric.fmt(s.worst),
                      metric.fmt(s.best), "–" if len(s.seeds) < 2 else metric.fmt(s.seed_sd), str(len(s.seeds)),
                      rounds_text(s.final_rounds)])
        scores.append([math.nan, *map(metric.score, (s.mean, s.weighted, s.worst, s.best)), math.nan, math.nan,
                       math.nan])
        csv_rows.append([method, len(s.seeds), rounds_text(s.final_rounds), s.clients, s.skipped, s.mean, s.sd,
                         s.weighted, s.worst, s.best, s.seed_sd])
    k = metric.key
    return Table(
        name=name, title=title, caption=caption, columns=columns, rows=cells, scores=scores,
        csv_header=["method", "seeds", "final_round", "final_evals", "final_nan_skipped", f"{k}_mean", f"{k}_sd",
                    f"{k}_weighted", f"{k}_worst", f"{k}_best", f"{k}_seed_sd"],
        csv_rows=csv_rows,
    )


def per_client_table(agg: RoundsAggregate, metric: Metric, rows: Sequence[str], *, name: str, title: str,
                     caption: str) -> Table:
    """Rows methods, columns clients (final-round value, mean over seeds), last column mean ± SD."""
    labels = [unit_label(c) for c in agg.clients]
    cells, scores, csv_rows = [], [], []
    for method in rows:
        s = agg.summary[method]
        vals = [agg.per_client[method].get(c, math.nan) for c in agg.clients]
        cells.append([method] + [metric.fmt(v) for v in vals] + [metric.fmt_pm(s.mean, s.sd)])
        scores.append([math.nan] + [metric.score(v) for v in vals] + [metric.score(s.mean)])
        csv_rows.append([method] + vals + [s.mean, s.sd])
    return Table(
        name=name, title=title, caption=caption, columns=["Method"] + labels + ["mean ± SD"], rows=cells,
        scores=scores, csv_header=["method"] + labels + ["mean", "sd"], csv_rows=csv_rows,
    )


def metrics_table(records: Sequence[Mapping[str, Any]], rows: Sequence[str]) -> Table | None:
    """Every known metric the clients computed, at the final round: mean over clients (mean
    over seeds), one column each; None when there is no second metric to show."""
    present = [k for k in METRICS if any(r.get("type") == RECORD_TYPE and k in r for r in records)]
    if len(present) < 2:
        return None
    aggs = {k: aggregate(records, k) for k in present}
    metrics = [metric_named(k) for k in present]
    cells = [[m] + [metric.fmt(aggs[metric.key].summary[m].mean) for metric in metrics] for m in rows]
    scores = [[math.nan] + [metric.score(aggs[metric.key].summary[m].mean) for metric in metrics] for m in rows]
    return Table(
        name="metrics", title="Every metric (final round, mean over clients)",
        caption="Each client's own model (a single-site row: that site's model) on the client's own test data; "
                "plain mean over clients, then over seeds. Percentages, except the loss.",
        columns=["Method"] + [m.label for m in metrics], rows=cells, scores=scores,
        csv_header=["method"] + present, csv_rows=[[m] + [aggs[k].summary[m].mean for k in present] for m in rows],
    )


# -- the generic report -----------------------------------------------------------------
KNOWN_FACTS = [
    ("study", "Study"), ("config_file", "Config file"), ("seeds", "Seeds"), ("methods", "Methods"),
    ("clients", "Clients"), ("rounds", "Rounds"), ("metric", "Metric"), ("started", "Started"),
    ("finished", "Finished"), ("training_seconds", "Training time (s)"), ("fedcare_version", "fedcare version"),
]


def run_metric(run_info: Mapping[str, Any]) -> Metric:
    key = run_info.get("metric")
    return metric_named(key if isinstance(key, str) and key else "accuracy")


def _shown_rows(agg: RoundsAggregate, metric: Metric) -> list[str]:
    """The methods, then the best single-site model."""
    best = best_site_model(agg, metric)
    return agg.federation_rows + ([best] if best else [])


def _verdict(agg: RoundsAggregate, metric: Metric) -> str:
    """Which methods beat the best single-site model, in one paragraph (empty without one)."""
    best = best_site_model(agg, metric)
    if best is None:
        return ""
    top = agg.summary[best].mean
    better = [m for m in agg.federation_rows if not math.isnan(agg.summary[m].mean)
              and metric.score(agg.summary[m].mean) > metric.score(top)]
    said = (f"{', '.join(better)} beat{'s' if len(better) == 1 else ''} it" if better
            else "no method beats it")
    return (f"<p><b>Against a site alone.</b> The best model trained at one site alone is {esc(best)}: "
            f"{esc(metric.fmt(top))} {esc(metric.label)} averaged over every client's test data; "
            f"{esc(said)} on the mean over clients. It is the best of {len(agg.site_models)} site models, chosen on "
            f"these same test data, so its number leans optimistic; compare the differences with the seed SD.</p>")


def _how_to_read(agg: RoundsAggregate, metric: Metric) -> str:
    items = [
        f"<b>Personalized evaluation.</b> Each client is evaluated with its own model (the model the method gives "
        f"it) on its own held-out test data, and computes its {esc(metric.name)} itself; round 0 is before "
        f"training. The tables use the final round.",
        "<b>Mean and spread over clients.</b> Every client counts the same in the mean; the example-weighted mean "
        "is beside it. ± SD is the population SD across clients: how unevenly the method serves them. The worst "
        "client is the one a federation must not leave behind.",
        "<b>Single-site models.</b> A row \"single-site (<i>site</i>)\" is a model trained at that site alone "
        "(the others idle), then scored at every client: what one site could hand the others without "
        "federating. The summary shows the best of them; a federated method is worth its cost where it beats it.",
        "<b>Seeds.</b> Everything is computed per seed first, then averaged over seeds. \"seed SD\" is the "
        "population SD across seeds of the mean over clients: the run-to-run noise to keep in mind.",
        f"<b>Missing values.</b> Client evaluations without a value (NaN, e.g. a test set with one class for "
        f"ROC AUC) are skipped ({agg.nan_evaluations} of {agg.evaluations} here). Bold marks each column's best.",
    ]
    return "<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>"


def build_tables(agg: RoundsAggregate, metric: Metric, records: Sequence[Mapping[str, Any]]) -> dict[str, Table]:
    rows = _shown_rows(agg, metric)
    caption = (f"{'Percentages, final' if metric.fraction else 'Final'} round, each client's own model on its own "
               f"test data: plain mean over clients ± population SD across clients; weighted by the clients' test "
               f"examples; the worst and best client. Per seed, then averaged over seeds."
               + seeds_caption(agg, rows))
    tables = [summary_table(agg, metric, rows, name="summary", title=f"Summary: {metric.name} per method "
                            "(final round)", caption=caption)]
    if agg.site_models:
        tables.append(summary_table(
            agg, metric, list(agg.site_models), name="single_site", title="Each site's model trained alone, scored "
            "at every client", caption="Each row: the model trained at that site alone, then scored on every "
            "client's test data (its own site's included); the columns as in the summary." + seeds_caption(
                agg, list(agg.site_models))))
    tables.append(per_client_table(agg, metric, rows, name="per_client", title=f"{metric.name} per client "
                                   "(final round)", caption="Each cell: that client's final-round value with its "
                                   "own model, averaged over seeds; NA = no value."))
    table = metrics_table(records, rows)
    return {t.name: t for t in [*tables, *([table] if table else [])]}


def build_plots(agg: RoundsAggregate, metric: Metric) -> dict[str, bytes]:
    rows = agg.federation_rows
    scale = 100.0 if metric.fraction else 1.0
    return {
        "per_round": method_lines(
            rows, agg.rounds, agg.per_round, xlabel="round", ylabel=metric.axis, scale=scale,
            title=f"{metric.name} per round (mean over clients, each client's own model, mean over seeds)",
            tick_every_unit=len(agg.rounds) <= 25, markersize=5 if len(agg.rounds) <= 25 else 0),
        "per_client": method_bars(
            _shown_rows(agg, metric), agg.clients, agg.per_client, xlabel="client", ylabel=metric.axis, scale=scale,
            title=f"{metric.name} per client at the final round (mean over seeds)"),
    }


def build_report(run_dir: Path, run_info: Mapping[str, Any] | None = None, notes: Sequence[str] = ()) -> Path:
    """Write the tables, plots and report.html of a run; returns report.html's path (nothing is
    written when metrics.jsonl holds no client_eval records: InputError)."""
    run_dir = Path(run_dir)
    run_info = dict(run_info or {})
    metric = run_metric(run_info)
    records, agg, more = load_run(run_dir, metric.key)
    tables = build_tables(agg, metric, records)
    plots = build_plots(agg, metric)
    extra = [("Client evaluations", f"{agg.evaluations} ({agg.nan_evaluations} without {metric.name}, skipped)")]
    sections = [("summary-section", "Summary", "Summary", table_block(tables["summary"]) + _verdict(agg, metric)),
                ("how", "How to read", "How to read this", _how_to_read(agg, metric))]
    sections += [(f"{name}-section", t.title.split(":")[0], t.title, table_block(t))
                 for name, t in tables.items() if name != "summary"]
    page = render_run_page(run_info, run_dir_name=str(run_info.get("run_dir") or run_dir.name),
                           known_facts=KNOWN_FACTS, extra_facts=extra, notes=[*notes, *more], sections=sections,
                           plots=plots, captions={"per_round": f"Mean {metric.name} over clients per round",
                                                  "per_client": f"{metric.name} per client at the final round"})
    return write_report(run_dir, tables, plots, page)


def summary_markdown(run_dir: Path) -> str:
    """The run's summary in Markdown (printed after a run): per method the mean ± SD across
    clients and the worst client, then the best single-site model."""
    metric = run_metric(read_run_info(run_dir)[0])
    agg = load_run(Path(run_dir), metric.key)[1]
    lines = [f"| Method | {metric.label} (mean ± SD across clients) | worst client |", "|---|---:|---:|"]
    for m in _shown_rows(agg, metric):
        s, name = agg.summary[m], m.replace("|", "\\|")
        lines.append(f"| {name} | {metric.fmt_pm(s.mean, s.sd)} | {metric.fmt(s.worst)} |")
    return "\n".join(lines)

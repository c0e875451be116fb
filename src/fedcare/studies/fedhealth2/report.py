"""The report of a FedHealth 2 run: per-client accuracy of personalized FL methods.

``build_report(run_dir, run_info, notes)`` reads ``run_dir/metrics.jsonl`` and writes::

    tables/summary.{csv,md}                 per method at the final round: mean accuracy over
                                            clients ± SD across clients, weighted mean, worst and
                                            best client, seed SD
    tables/per_client_accuracy.{csv,md}     per method and client, final-round accuracy
    plots/accuracy_per_round.png            mean accuracy over clients per round
    plots/per_client_accuracy.png           grouped bars per client, final round
    report.html

Only the ``"type": "client_eval"`` records with a round are used: one per (method, seed, round, client), the
accuracy of that client's own (personalized) model on that client's own test data, with ``n``
test examples. Round 0 is before training. The aggregation, step by step:

1. **Final round** of a (method, seed): the largest round with client_eval records for it.
2. **Per (method, seed)** at its final round, over the clients whose accuracy is a number (NaN,
   ``null`` or missing accuracies are skipped and counted):

   - mean: the plain (unweighted) mean over clients, the number the FedHealth 2 paper reports;
   - SD across clients: the population SD (``ddof=0``) of the clients' accuracies, as the pain
     report's "SD between test subjects";
   - weighted mean: weighted by the clients' ``n`` (the accuracy over all pooled test examples);
   - worst / best client: the lowest / highest client accuracy.

   The same plain mean over clients is taken at every round for the per-round curve.
3. **Across seeds**, as in the pain report: the mean over seeds of each per-seed number (NaN-
   skipping; per-client values likewise), plus "seed SD", the population SD across seeds of
   the per-seed mean (0 with one seed).

A record seen twice for the same (method, seed, round, client) counts once (the last one wins).
All values are fractions; tables in Markdown/HTML show percentages with one decimal, the CSVs
raw fractions. Every file is written atomically.
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
    Unit, as_float, as_unit, first_appearance, nanmean, nanstd, sort_units, weighted_mean_sd,
)
from fedcare.report import write_report
from fedcare.report.html import render_run_page, table_block
from fedcare.report.plots import method_bars, method_lines
from fedcare.report.tables import Table, pct, pct_pm, unit_label
from fedcare.studies.rundir import METRICS_FILE, read_run_records


RECORD_TYPE = "client_eval"


# -- records ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ClientEval:
    """One ``"type": "client_eval"`` line of metrics.jsonl."""

    method: str
    seed: Any
    round: float
    client: Unit
    n: float  # test examples (NaN if missing)
    accuracy: float  # fraction or NaN


def _round(x: Any) -> float | int:
    v = float(x)
    return int(v) if v.is_integer() else v


def load_client_evals(records: Iterable[Mapping[str, Any]], source: str = METRICS_FILE) -> list[ClientEval]:
    """The client_eval records (other types are ignored). A client_eval record without method,
    seed, round or client, or with a round that is not a number, raises ValueError naming
    ``source`` and the record's position; a missing or non-numeric accuracy or n becomes NaN."""
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
        out.append(ClientEval(method=str(r["method"]), seed=as_unit(r["seed"]), round=rnd, client=as_unit(r["client"]),
                              n=as_float(r.get("n")),
                              accuracy=as_float(r.get("accuracy"))))
    return out


# -- aggregation ------------------------------------------------------------------------
@dataclass
class SeedAccuracy:
    """The final-round numbers of one (method, seed)."""

    final_round: float
    per_client: dict[Unit, float]  # NaN where the accuracy was not a number
    mean: float
    sd: float
    weighted: float
    worst: float
    best: float
    per_round: dict[float, float]  # plain mean over clients per round


def _clients_stats(evals: Sequence[ClientEval]) -> tuple[float, float, float, float, float]:
    """(plain mean, population SD, n-weighted mean, min, max) of the clients' accuracies, NaN skipped."""
    acc = np.asarray([e.accuracy for e in evals], dtype=np.float64)
    keep = ~np.isnan(acc)
    if not keep.any():
        return (math.nan,) * 5
    plain, sd = weighted_mean_sd(acc[keep], np.ones(int(keep.sum())))
    n = np.asarray([e.n for e in evals], dtype=np.float64)
    ok = keep & np.isfinite(n) & (n >= 0)
    weighted = weighted_mean_sd(acc[ok], n[ok])[0] if ok.any() else math.nan
    return plain, sd, weighted, float(acc[keep].min()), float(acc[keep].max())


def aggregate_seed(evals: Sequence[ClientEval]) -> SeedAccuracy:
    """Aggregate the client_eval records of one (method, seed) (see the module docstring)."""
    by_round: dict[float, dict[Unit, ClientEval]] = {}
    for e in evals:
        by_round.setdefault(e.round, {})[e.client] = e  # duplicates: last one wins
    rounds = sorted(by_round)
    final = rounds[-1]
    last = list(by_round[final].values())
    mean, sd, weighted, worst, best = _clients_stats(last)
    return SeedAccuracy(
        final_round=final, per_client={e.client: e.accuracy for e in last}, mean=mean, sd=sd, weighted=weighted,
        worst=worst, best=best, per_round={r: _clients_stats(list(by_round[r].values()))[0] for r in rounds},
    )


@dataclass
class MethodAccuracy:
    """One row of the summary table, averaged over seeds."""

    method: str
    seeds: list
    final_rounds: list  # per seed
    mean: float  # mean over seeds of the plain mean over clients
    sd: float  # mean over seeds of the SD across clients
    weighted: float  # mean over seeds of the example-weighted mean
    worst: float  # mean over seeds of the worst client's accuracy
    best: float  # mean over seeds of the best client's accuracy
    seed_sd: float  # population SD across seeds of the plain mean
    clients: int  # final-round client evaluations with an accuracy, summed over seeds (CSV: final_evals)
    skipped: int  # final-round client evaluations with a NaN accuracy, summed over seeds (CSV: final_nan_skipped)


@dataclass
class FedHealth2Aggregate:
    """Everything the FedHealth 2 report shows."""

    methods: list[str]  # order of first appearance
    clients: list[Unit]  # every client with a client_eval record
    rounds: list[float]  # every round with a client_eval record
    summary: dict[str, MethodAccuracy]
    per_client: dict[str, dict[Unit, float]]  # method -> client -> final-round accuracy, mean over seeds
    per_round: dict[str, dict[float, float]]  # method -> round -> mean over clients, mean over seeds
    per_seed: dict[tuple[str, Any], SeedAccuracy] = field(default_factory=dict)
    evaluations: int = 0  # client_eval records
    nan_evaluations: int = 0  # of which the accuracy is not a number (any round)


def aggregate_fedhealth2(
    records: Iterable[Mapping[str, Any] | ClientEval], source: str = METRICS_FILE,
) -> FedHealth2Aggregate:
    """Aggregate a run's records (dicts as read from metrics.jsonl, or ClientEvals); see the
    module docstring. Methods keep their order of first appearance."""
    records = list(records)
    evals = [r for r in records if isinstance(r, ClientEval)]
    evals += load_client_evals([r for r in records if not isinstance(r, ClientEval)], source)
    methods = first_appearance(e.method for e in evals)
    clients = sort_units(e.client for e in evals)
    rounds = sorted({e.round for e in evals})
    summary: dict[str, MethodAccuracy] = {}
    per_client: dict[str, dict[Unit, float]] = {}
    per_round: dict[str, dict[float, float]] = {}
    per_seed: dict[tuple[str, Any], SeedAccuracy] = {}
    for method in methods:
        mine = [e for e in evals if e.method == method]
        seeds = first_appearance(e.seed for e in mine)
        aggs = []
        for seed in seeds:
            a = aggregate_seed([e for e in mine if e.seed == seed])
            per_seed[(method, seed)] = a
            aggs.append(a)
        numeric = sum(sum(not math.isnan(v) for v in a.per_client.values()) for a in aggs)
        summary[method] = MethodAccuracy(
            method=method, seeds=seeds, final_rounds=[a.final_round for a in aggs],
            mean=nanmean(a.mean for a in aggs), sd=nanmean(a.sd for a in aggs),
            weighted=nanmean(a.weighted for a in aggs), worst=nanmean(a.worst for a in aggs),
            best=nanmean(a.best for a in aggs), seed_sd=nanstd(a.mean for a in aggs),
            clients=numeric, skipped=sum(len(a.per_client) for a in aggs) - numeric,
        )
        per_client[method] = {c: nanmean(a.per_client.get(c, math.nan) for a in aggs) for c in clients}
        per_round[method] = {r: nanmean(a.per_round.get(r, math.nan) for a in aggs) for r in rounds}
    return FedHealth2Aggregate(
        methods=methods, clients=clients, rounds=rounds, summary=summary, per_client=per_client,
        per_round=per_round, per_seed=per_seed, evaluations=len(evals),
        nan_evaluations=sum(math.isnan(e.accuracy) for e in evals),
    )


def load_fedhealth2_run(run_dir: Path) -> tuple[list[dict], FedHealth2Aggregate, list[str]]:
    """(records, aggregate, notes) of a FedHealth 2 run directory. Raises FileNotFoundError if
    metrics.jsonl is missing and ValueError (naming it) if it is malformed or holds no
    client_eval records."""
    records, notes = read_run_records(run_dir)
    metrics_path = Path(run_dir) / METRICS_FILE
    agg = aggregate_fedhealth2(records, source=str(metrics_path))
    if not agg.evaluations:
        raise InputError(f"{metrics_path}: no client_eval records with a round; nothing to report")
    if agg.nan_evaluations:
        notes.append(f"{agg.nan_evaluations} of {agg.evaluations} client evaluations have no accuracy (NaN) "
                     "and are left out of the means.")
    finals = {r for s in agg.summary.values() for r in s.final_rounds}
    if len(finals) > 1:
        notes.append("Not every method and seed reached the same final round: "
                     + "; ".join(f"{m}: {'/'.join(unit_label(r) for r in s.final_rounds)}"
                                 for m, s in agg.summary.items())
                     + ".")
    return records, agg, notes


# -- tables -----------------------------------------------------------------------------
def _rounds_text(rounds: Sequence[float]) -> str:
    distinct = first_appearance(rounds)
    return "/".join(unit_label(r) for r in distinct)


def accuracy_summary_table(agg: FedHealth2Aggregate) -> Table:
    """Per method at the final round: mean ± SD across clients, weighted mean, worst, best, seed SD."""
    multi_seed = any(len(agg.summary[m].seeds) > 1 for m in agg.methods)
    columns = ["Method", "ACC (mean ± SD across clients)", "weighted ACC", "worst client", "best client", "seed SD",
               "seeds", "round"]
    rows, scores, csv_rows = [], [], []
    for method in agg.methods:
        s = agg.summary[method]
        rows.append([method, pct_pm(s.mean, s.sd), pct(s.weighted), pct(s.worst), pct(s.best),
                     "–" if len(s.seeds) < 2 else pct(s.seed_sd), str(len(s.seeds)), _rounds_text(s.final_rounds)])
        scores.append([math.nan, s.mean, s.weighted, s.worst, s.best, math.nan, math.nan, math.nan])
        csv_rows.append([method, len(s.seeds), _rounds_text(s.final_rounds), s.clients, s.skipped, s.mean, s.sd,
                         s.weighted, s.worst, s.best, s.seed_sd])
    caption = (
        "Percentages, final round, each client evaluated with its own personalized model on its own test data. "
        "ACC: plain (unweighted) mean over clients, as in the FedHealth 2 paper, ± population SD across clients; "
        "weighted ACC: weighted by the clients' test examples; worst/best client: the lowest/highest client "
        "accuracy. Each number is computed per seed, then averaged over seeds."
    )
    caption += (" seed SD: population SD across seeds of the mean over clients." if multi_seed
                else " One seed, so no seed SD.")
    return Table(
        name="summary", title="Summary: accuracy per method (final round)", caption=caption, columns=columns,
        rows=rows, scores=scores,
        csv_header=["method", "seeds", "final_round", "final_evals", "final_nan_skipped", "accuracy_mean",
                    "accuracy_sd", "accuracy_weighted", "accuracy_worst", "accuracy_best", "accuracy_seed_sd"],
        csv_rows=csv_rows,
    )


def per_client_table(agg: FedHealth2Aggregate) -> Table:
    """Rows methods, columns clients (final-round accuracy, mean over seeds), last column mean ± SD."""
    labels = [unit_label(c) for c in agg.clients]
    rows, scores, csv_rows = [], [], []
    for method in agg.methods:
        s = agg.summary[method]
        vals = [agg.per_client[method].get(c, math.nan) for c in agg.clients]
        rows.append([method] + [pct(v) for v in vals] + [pct_pm(s.mean, s.sd)])
        scores.append([math.nan] + vals + [s.mean])
        csv_rows.append([method] + vals + [s.mean, s.sd])
    caption = (
        "Percentages. Each cell: that client's final-round accuracy with its own personalized model, averaged over "
        "seeds; NA = no accuracy. Last column: plain mean over clients ± SD across clients, as in the summary."
    )
    return Table(
        name="per_client_accuracy", title="Accuracy per client (final round)", caption=caption,
        columns=["Method"] + labels + ["mean ± SD"], rows=rows, scores=scores,
        csv_header=["method"] + labels + ["mean", "sd"], csv_rows=csv_rows,
    )


def build_fedhealth2_tables(agg: FedHealth2Aggregate) -> dict[str, Table]:
    """All tables of the report keyed by file stem, in report order."""
    return {t.name: t for t in (accuracy_summary_table(agg), per_client_table(agg))}


# -- plots ------------------------------------------------------------------------------
PLOT_CAPTIONS = {
    "accuracy_per_round": "Mean accuracy over clients per round (round 0: before training), mean over seeds",
    "per_client_accuracy": "Accuracy per client at the final round, mean over seeds",
}


def build_fedhealth2_plots(agg: FedHealth2Aggregate) -> dict[str, bytes]:
    """All plots of the report as {file stem: PNG bytes}, in report order."""
    return {
        "accuracy_per_round": method_lines(
            agg.methods, agg.rounds, agg.per_round, xlabel="round", ylabel="accuracy (%)",
            title="Accuracy per round (plain mean over clients, personalized models, mean over seeds)",
            tick_every_unit=len(agg.rounds) <= 25, markersize=5 if len(agg.rounds) <= 25 else 0,
        ),
        "per_client_accuracy": method_bars(
            agg.methods, agg.clients, agg.per_client, xlabel="client", ylabel="accuracy (%)",
            title="Accuracy per client at the final round (own personalized model, mean over seeds)",
        ),
    }


# -- html -------------------------------------------------------------------------------
KNOWN_FACTS = [
    ("study", "Study"), ("dataset", "Dataset"), ("split", "Split"), ("config_file", "Config file"), ("seeds", "Seeds"),
    ("methods", "Methods"), ("clients", "Clients"), ("rounds", "Rounds"), ("started", "Started"),
    ("finished", "Finished"), ("training_seconds", "Training time (s)"), ("fedcare_version", "fedcare version"),
]


def _how_to_read(agg: FedHealth2Aggregate) -> str:
    items = [
        "<b>Personalized evaluation.</b> After every round (round 0 is before training) each client is evaluated "
        "with its own model, the personalized model the method gives it, on its own held-out test data; a client's "
        "accuracy is the share of its test examples classified correctly. The tables use the final round.",
        "<b>Plain mean over clients.</b> Every client counts the same, however many test examples it has, as in the "
        "FedHealth 2 paper. The example-weighted mean (accuracy over all pooled test examples) is shown next to it; "
        "the two differ when small clients fare differently from large ones.",
        "<b>± SD across clients.</b> The population SD (ddof=0) of the clients' accuracies: how unevenly the method "
        "serves the clients, not the uncertainty of the mean. Worst and best client show the extremes.",
        "<b>Seeds.</b> Everything is computed per seed first, then averaged over seeds (mean of means, mean of SDs, "
        "mean of worst and best). \"seed SD\" is the population SD across seeds of the mean over clients: the "
        "run-to-run noise to keep in mind when comparing methods.",
        f"<b>Missing values.</b> Client evaluations without an accuracy (NaN, e.g. an empty test set) are skipped "
        f"({agg.nan_evaluations} of {agg.evaluations} here). Percentages; bold marks each column's best value.",
    ]
    return "<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>"


def render_fedhealth2_html(
    run_info: Mapping[str, Any], agg: FedHealth2Aggregate, tables: Mapping[str, Table], plots: Mapping[str, bytes],
    *, run_dir_name: str = "", notes: Sequence[str] = (),
) -> str:
    """The whole page as a string (the shared run page of :mod:`fedcare.report.html`)."""
    extra = [("Client evaluations", f"{agg.evaluations} ({agg.nan_evaluations} without accuracy, skipped)"),
             ("Final round", "; ".join(f"{m}: {_rounds_text(agg.summary[m].final_rounds)}" for m in agg.methods))]
    sections = [
        ("summary-section", "Summary", "Summary", table_block(tables["summary"])),
        ("how", "How to read", "How to read this", _how_to_read(agg)),
        ("clients-section", "Per client", "Per client", table_block(tables["per_client_accuracy"])),
    ]
    return render_run_page(run_info, run_dir_name=run_dir_name, known_facts=KNOWN_FACTS, extra_facts=extra,
                           notes=notes, sections=sections, plots=plots, captions=PLOT_CAPTIONS)


# -- the report -------------------------------------------------------------------------
def build_report(run_dir: Path, run_info: Mapping[str, Any] | None = None, notes: Sequence[str] = ()) -> Path:
    """Write the tables, plots and report.html of a FedHealth 2 run; returns report.html's path.

    ``run_info`` is run.json's content and ``notes`` notes about reading it (see
    :func:`fedcare.studies.rundir.read_run_info`); nothing is written if metrics.jsonl has no
    client_eval records (ValueError)."""
    run_dir = Path(run_dir)
    run_info = dict(run_info or {})
    _, agg, more = load_fedhealth2_run(run_dir)
    tables = build_fedhealth2_tables(agg)
    plots = build_fedhealth2_plots(agg)
    page = render_fedhealth2_html(run_info, agg, tables, plots, run_dir_name=str(run_info.get("run_dir") or run_dir.name),
                                  notes=[*notes, *more])
    return write_report(run_dir, tables, plots, page)


def summary_rows(run_dir: Path) -> list[dict]:
    """The summary of a FedHealth 2 run as dicts (method, accuracy, accuracy_sd,
    accuracy_weighted, accuracy_worst, accuracy_best, accuracy_seed_sd, seeds), fractions, in the
    order methods first appear."""
    agg = load_fedhealth2_run(Path(run_dir))[1]
    return [
        {"method": m, "accuracy": s.mean, "accuracy_sd": s.sd, "accuracy_weighted": s.weighted,
         "accuracy_worst": s.worst, "accuracy_best": s.best, "accuracy_seed_sd": s.seed_sd, "seeds": len(s.seeds)}
        for m, s in agg.summary.items()
    ]


def format_summary_markdown(rows: list[dict]) -> str:
    """A Markdown table of :func:`summary_rows`: Method | ACC (mean ± SD across clients) |
    weighted ACC | worst client | best client, in %."""
    lines = ["| Method | ACC (mean ± SD across clients) | weighted ACC | worst client | best client |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        method = str(r.get("method", "")).replace("|", "\\|")
        cells = [pct_pm(r.get("accuracy"), r.get("accuracy_sd"))]
        cells += [pct(r.get(k)) for k in ("accuracy_weighted", "accuracy_worst", "accuracy_best")]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_markdown(run_dir: Path) -> str:
    """The summary of a run directory in Markdown (printed after a run)."""
    return format_summary_markdown(summary_rows(run_dir))

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
The aggregation and the tables' layout are those of every study evaluated round by round
(`fedcare.studies.rounds_report`); this module adds the FedHealth 2 captions. All values are
fractions; tables in Markdown/HTML show percentages with one decimal, the CSVs raw fractions.
Every file is written atomically.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedcare.report import write_report
from fedcare.report.html import render_run_page, table_block
from fedcare.report.plots import method_bars, method_lines
from fedcare.studies.rounds_report import (
    ClientEval, RoundsAggregate, aggregate, load_run, metric_named, per_client_table, rounds_text, seeds_caption,
    summary_table,
)
from fedcare.report.tables import Table, pct, pct_pm

ACCURACY = metric_named("accuracy")


def aggregate_fedhealth2(records: Iterable[Mapping[str, Any] | ClientEval], source: str = "metrics.jsonl",
                         ) -> RoundsAggregate:
    """Aggregate a run's records (dicts as read from metrics.jsonl, or ClientEvals); see the
    module docstring. Methods keep their order of first appearance."""
    return aggregate(records, "accuracy", source)


def load_fedhealth2_run(run_dir: Path) -> tuple[list[dict], RoundsAggregate, list[str]]:
    """(records, aggregate, notes) of a FedHealth 2 run directory. Raises FileNotFoundError if
    metrics.jsonl is missing and ValueError (naming it) if it is malformed or holds no
    client_eval records."""
    return load_run(run_dir, "accuracy")


# -- tables -----------------------------------------------------------------------------
def accuracy_summary_table(agg: RoundsAggregate) -> Table:
    """Per method at the final round: mean ± SD across clients, weighted mean, worst, best, seed SD."""
    caption = (
        "Percentages, final round, each client evaluated with its own personalized model on its own test data. "
        "ACC: plain (unweighted) mean over clients, as in the FedHealth 2 paper, ± population SD across clients; "
        "weighted ACC: weighted by the clients' test examples; worst/best client: the lowest/highest client "
        "accuracy. Each number is computed per seed, then averaged over seeds."
    )
    return summary_table(agg, ACCURACY, agg.methods, name="summary", title="Summary: accuracy per method (final "
                         "round)", caption=caption + seeds_caption(agg, agg.methods))


def accuracy_per_client_table(agg: RoundsAggregate) -> Table:
    """Rows methods, columns clients (final-round accuracy, mean over seeds), last column mean ± SD."""
    caption = (
        "Percentages. Each cell: that client's final-round accuracy with its own personalized model, averaged over "
        "seeds; NA = no accuracy. Last column: plain mean over clients ± SD across clients, as in the summary."
    )
    return per_client_table(agg, ACCURACY, agg.methods, name="per_client_accuracy",
                            title="Accuracy per client (final round)", caption=caption)


def build_fedhealth2_tables(agg: RoundsAggregate) -> dict[str, Table]:
    """All tables of the report keyed by file stem, in report order."""
    return {t.name: t for t in (accuracy_summary_table(agg), accuracy_per_client_table(agg))}


# -- plots ------------------------------------------------------------------------------
PLOT_CAPTIONS = {
    "accuracy_per_round": "Mean accuracy over clients per round (round 0: before training), mean over seeds",
    "per_client_accuracy": "Accuracy per client at the final round, mean over seeds",
}


def build_fedhealth2_plots(agg: RoundsAggregate) -> dict[str, bytes]:
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


def _how_to_read(agg: RoundsAggregate) -> str:
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
    run_info: Mapping[str, Any], agg: RoundsAggregate, tables: Mapping[str, Table], plots: Mapping[str, bytes],
    *, run_dir_name: str = "", notes: Sequence[str] = (),
) -> str:
    """The whole page as a string (the shared run page of :mod:`fedcare.report.html`)."""
    extra = [("Client evaluations", f"{agg.evaluations} ({agg.nan_evaluations} without accuracy, skipped)"),
             ("Final round", "; ".join(f"{m}: {rounds_text(agg.summary[m].final_rounds)}" for m in agg.methods))]
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

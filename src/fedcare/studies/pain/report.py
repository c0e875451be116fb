"""The pain study's report: the thesis's tables (7.1, 7.4-7.7), plots and report.html.

``build_report(run_dir, run_info, notes)`` reads ``run_dir/metrics.jsonl`` and writes::

    tables/summary.{csv,md}                       Table 7.1
    tables/per_subject_{acc,pr_auc,f1}.{csv,md}   Table 7.4
    tables/per_session_{acc,pr_auc,f1}.{csv,md}   Table 7.5
    tables/f1_threshold.{csv,md}                  decisions at threshold 0.5 (why F1 can disagree)
    tables/rank_sums.{csv,md}                     Tables 7.6/7.7
    tables/membership.{csv,md}                    the membership audit, when [privacy.audit] ran
    plots/per_session_{f1,pr_auc,acc}.png, plots/per_subject_f1.png, plots/val_loss.png
    plots/membership_auc.png                      the membership audit's AUC per method and view
    report.html

How the numbers are aggregated is documented in :mod:`fedcare.studies.pain.aggregate`.
It can be re-run on a finished run directory at any time (`fedcare report`).
"""

from __future__ import annotations

import math
from html import escape
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedcare.errors import InputError
from fedcare.privacy.report import membership_plot, membership_table
from fedcare.report import write_report
from fedcare.report.html import render_run_page, table_block
from fedcare.report.plots import method_bars, method_lines
from fedcare.report.tables import Table, fmt_rank, pct, pct_pm, unit_label
from fedcare.studies.pain.plots import plot_val_loss
from fedcare.studies.pain.aggregate import (
    METRIC_LABELS, METRICS, PRIMARY_METRICS, RunAggregate, ThresholdSummary, aggregate, threshold_summaries,
)
from fedcare.studies.rundir import METRICS_FILE, read_run_records


def load_run(run_dir: Path) -> tuple[list[dict], RunAggregate, list[str]]:
    """(records, aggregate, notes) of a pain run directory.

    Raises FileNotFoundError if metrics.jsonl is missing and ValueError (naming the file) if it
    is malformed or holds no test records.
    """
    records, notes = read_run_records(run_dir)
    metrics_path = Path(run_dir) / METRICS_FILE
    agg = aggregate(records, source=str(metrics_path))
    if not agg.methods:
        raise InputError(f"{metrics_path}: no test records (client_eval records with a session); nothing to report")
    if not agg.summary or all(s.records == 0 for s in agg.summary.values()):
        notes.append("No test record has positives: every record was masked out, all values are NA.")
    return records, agg, notes


# -- tables -----------------------------------------------------------------------------
def method_summary_table(agg: RunAggregate) -> Table:
    """Table 7.1: method | ACC | PR-AUC | F1 as mean ± SD across subjects, plus the seed SDs."""
    multi_seed = any(len(agg.summary[m].seeds) > 1 for m in agg.methods)
    columns = ["Method"] + [METRIC_LABELS[m] for m in PRIMARY_METRICS]
    columns += [f"seed SD {METRIC_LABELS[m]}" for m in PRIMARY_METRICS] + ["seeds"]
    rows, scores, csv_rows = [], [], []
    for method in agg.methods:
        s = agg.summary[method]
        one = len(s.seeds) < 2
        rows.append(
            [method]
            + [pct_pm(s.mean[m], s.sd[m]) for m in PRIMARY_METRICS]
            + ["–" if one else pct(s.seed_sd[m]) for m in PRIMARY_METRICS]
            + [str(len(s.seeds))]
        )
        scores.append([math.nan] + [s.mean[m] for m in PRIMARY_METRICS] + [math.nan] * 4)
        csv_rows.append(
            [method, len(s.seeds), s.records, s.masked_out]
            + [x for m in METRICS for x in (s.mean[m], s.sd[m], s.session_sd[m], s.seed_sd[m])]
        )
    csv_header = ["method", "seeds", "records", "masked_out"] + [
        f"{m}_{k}" for m in METRICS for k in ("mean", "sd", "session_sd", "seed_sd")
    ]
    caption = (
        "Percentages. Example-weighted mean over all test records with positives ± SD across test subjects "
        "(population SD of the per-subject weighted means), each averaged over seeds."
    )
    if multi_seed:
        caption += " seed SD: population SD across seeds of the weighted mean."
    else:
        caption += " One seed, so no seed SD."
    return Table(
        name="summary", title="Table 7.1: all methods (sessions setting)", caption=caption,
        columns=columns, rows=rows, csv_header=csv_header, csv_rows=csv_rows, scores=scores,
    )


def _unit_table(agg: RunAggregate, metric: str, by: str) -> Table:
    units = agg.subjects if by == "subject" else agg.sessions
    values = (agg.per_subject if by == "subject" else agg.per_session)[metric]
    label = METRIC_LABELS[metric]
    columns = ["Method"] + [unit_label(u) for u in units] + ["mean ± SD"]
    rows, scores, csv_rows = [], [], []
    for method in agg.methods:
        s = agg.summary[method]
        sd = s.sd[metric] if by == "subject" else s.session_sd[metric]
        row_vals = [values[method].get(u, math.nan) for u in units]
        rows.append([method] + [pct(v) for v in row_vals] + [pct_pm(s.mean[metric], sd)])
        scores.append([math.nan] + row_vals + [s.mean[metric]])
        csv_rows.append([method] + row_vals + [s.mean[metric], sd])
    if by == "subject":
        title = f"Table 7.4 ({label}): per test subject"
        caption = (
            f"Percentages. Each cell: example-weighted mean {label} over that subject's sessions with positives, "
            "averaged over seeds. Last column: weighted mean over all records ± SD across subjects."
        )
    else:
        title = f"Table 7.5 ({label}): per session"
        caption = (
            f"Percentages. Each cell: example-weighted mean {label} over that session's subjects with positives, "
            "averaged over seeds; NA = no subject with positives in that session. "
            "Last column: weighted mean over all records ± SD across sessions."
        )
    return Table(
        name=f"per_{by}_{metric}", title=title, caption=caption, columns=columns, rows=rows,
        csv_header=["method"] + [unit_label(u) for u in units] + ["mean", "sd"], csv_rows=csv_rows, scores=scores,
    )


def per_subject_table(agg: RunAggregate, metric: str) -> Table:
    """Table 7.4 for one metric: rows methods, columns subjects, last column mean ± SD."""
    return _unit_table(agg, metric, "subject")


def per_session_table(agg: RunAggregate, metric: str) -> Table:
    """Table 7.5 for one metric: rows methods, columns sessions, last column mean ± SD."""
    return _unit_table(agg, metric, "session")


def rank_sum_table(agg: RunAggregate) -> Table:
    """Tables 7.6/7.7: rank sums by subject and by session for ACC, PR-AUC, F1."""
    keys = [(by, m) for by in ("subject", "session") for m in PRIMARY_METRICS]
    sums = {k: agg.rank_sums(*k) for k in keys}
    counts = {k: len(agg.rank_units(*k)) for k in keys}
    columns = ["Method"] + [f"{METRIC_LABELS[m]} by {by}" for by, m in keys]
    rows = [[method] + [fmt_rank(sums[k][method]) for k in keys] for method in agg.methods]
    scores = [[math.nan] + [sums[k][method] for k in keys] for method in agg.methods]
    csv_rows = [[method] + [sums[k][method] for k in keys] for method in agg.methods]

    def units_text(by: str) -> str:
        ns = sorted({counts[(by, m)] for m in PRIMARY_METRICS})
        return f"{'/'.join(map(str, ns))} {by}s"

    n = len(agg.methods)
    caption = (
        f"Per subject (Table 7.6) or per session (Table 7.7) the {n} methods are ranked from 0 (worst) to {n - 1} (best) "
        "on the seed-averaged values of Tables 7.4/7.5 (ties share the average rank), and the ranks are summed. "
        f"Ranked over {units_text('subject')} and {units_text('session')}: units where any method is NA are skipped."
    )
    return Table(
        name="rank_sums", title="Tables 7.6/7.7: rank sums", caption=caption, columns=columns, rows=rows,
        csv_header=["method"] + [f"{by}_{m}" for by, m in keys], csv_rows=csv_rows, scores=scores,
    )


def threshold_table(agg: RunAggregate, thresholds: Mapping[str, ThresholdSummary]) -> Table:
    """Why F1 can disagree with ACC and PR-AUC: each method's decisions at threshold 0.5."""
    columns = ["Method", "records with pain", "of them no pain frame found", "frames called pain (%)",
               "precision", "recall", "F1 over all frames", "F1 (Table 7.1)"]
    rows, csv_rows = [], []
    for method in (m for m in agg.methods if m in thresholds):
        t = thresholds[method]
        rows.append([method, str(t.records), str(t.missed), pct(t.predicted_pain), pct(t.precision), pct(t.recall),
                     pct(t.f1), pct(agg.summary[method].mean["f1"])])
        csv_rows.append([method, t.records, t.missed, t.predicted_pain, t.precision, t.recall, t.f1,
                         agg.summary[method].mean["f1"]])
    caption = (
        "Percentages. Decisions at threshold 0.5 on the pain probability, every seed's test records with pain taken "
        "together. Table 7.1's F1 is the example-weighted mean of each record's own F1, so a record in which no "
        "pain frame reaches 0.5 counts as 0; the F1 over all frames pools the records' frames first."
    )
    return Table(
        name="f1_threshold", title="F1 at threshold 0.5: where the decisions fall", caption=caption,
        columns=columns, rows=rows,
        csv_header=["method", "records", "no_pain_predicted", "predicted_pain", "precision", "recall", "f1_pooled",
                    "f1_weighted_mean"],
        csv_rows=csv_rows,
    )


def threshold_findings(agg: RunAggregate, thresholds: Mapping[str, ThresholdSummary]) -> str:
    """One sentence per trained method whose F1 (Table 7.1) is below RANDOM's, saying why from the
    run's own counts; empty when there is none (or no RANDOM)."""
    if "RANDOM" not in thresholds:
        return ""
    rnd = thresholds["RANDOM"]
    rnd_f1 = agg.summary["RANDOM"].mean["f1"]
    below = [m for m in agg.methods if m != "RANDOM" and m in thresholds and agg.summary[m].mean["f1"] < rnd_f1]
    if not below:
        return ""
    parts = [f"{m} found no pain frame in {thresholds[m].missed} of {thresholds[m].records} records with pain "
             f"(F1 over all frames {pct(thresholds[m].f1)})" for m in below]
    return (
        f"In this run RANDOM's F1 ({pct(rnd_f1)}) is above that of {', '.join(below)}. RANDOM calls "
        f"{pct(rnd.predicted_pain)}% of frames pain, so it misses the pain of only {rnd.missed} of {rnd.records} "
        f"records and its per-record F1 stays near 2p/(1+p) for a record's pain "
        f"share p; its F1 over all frames is {pct(rnd.f1)}. " + "; ".join(parts) + ". "
        "Those records count as F1 = 0 in Table 7.1 however well the model ranks their frames (see PR-AUC)."
    )


def build_tables(agg: RunAggregate, thresholds: Mapping[str, ThresholdSummary] | None = None) -> dict[str, Table]:
    """All tables of the report keyed by file stem, in report order."""
    tables = [method_summary_table(agg)]
    if thresholds:
        tables.append(threshold_table(agg, thresholds))
    tables += [per_subject_table(agg, m) for m in PRIMARY_METRICS]
    tables += [per_session_table(agg, m) for m in PRIMARY_METRICS]
    tables.append(rank_sum_table(agg))
    return {t.name: t for t in tables}


# -- plots ------------------------------------------------------------------------------
def plot_per_session(agg: RunAggregate, metric: str) -> bytes:
    """Seed-averaged per-session values of ``metric`` (percent), one line per method; sessions
    without positives are gaps."""
    label = METRIC_LABELS[metric]
    return method_lines(
        agg.methods, agg.sessions, agg.per_session[metric], xlabel="test session", ylabel=f"{label} (%)",
        title=f"{label} per session (weighted over subjects with positives, mean over seeds)",
    )


def plot_per_subject(agg: RunAggregate, metric: str) -> bytes:
    """Seed-averaged per-subject values of ``metric`` (percent) as grouped bars."""
    label = METRIC_LABELS[metric]
    return method_bars(
        agg.methods, agg.subjects, agg.per_subject[metric], xlabel="test subject", ylabel=f"{label} (%)",
        title=f"{label} per test subject (weighted over sessions with positives, mean over seeds)",
    )


def build_plots(agg: RunAggregate, records: list[Mapping[str, Any]]) -> dict[str, bytes]:
    """All plots of the report as {file stem: PNG bytes}, in report order."""
    plots = {f"per_session_{m}": plot_per_session(agg, m) for m in ("f1", "pr_auc", "acc")}
    plots["per_subject_f1"] = plot_per_subject(agg, "f1")
    plots["val_loss"] = plot_val_loss(records, agg.methods)
    return plots


# -- report.html ------------------------------------------------------------------------
KNOWN_FACTS = [
    ("study", "Study"), ("config_file", "Config file"), ("seeds", "Seeds"), ("random_seeds", "RANDOM's seeds"),
    ("methods", "Methods"),
    ("subjects", "Test subjects"), ("test_sessions", "Test sessions"), ("started", "Started"),
    ("finished", "Finished"), ("training_seconds", "Training time (s)"), ("fedcare_version", "fedcare version"),
]


def _how_to_read(agg: RunAggregate) -> str:
    total = sum(s.records + s.masked_out for s in agg.summary.values())
    masked = sum(s.masked_out for s in agg.summary.values())
    items = [
        "<b>What was tested.</b> Every test subject (client) is tested with the model it would use: the global "
        "model for centralized and FedAvg methods, its own personal model for FP and FL. Each test yields one "
        "record per method, seed, session and subject.",
        f"<b>Mask.</b> A record counts only if that subject has pain frames in that session (positives &gt; 0), "
        f"as in the thesis; {masked} of {total} records were masked out. Sessions with no such subject show NA.",
        "<b>Weighting.</b> A subject's value is the mean over its kept sessions weighted by the number of test "
        "examples; a session's value is the weighted mean over its kept subjects; the overall value (Table 7.1 and "
        "the last column of the other tables) is the weighted mean over all kept records, which is the same "
        "whether one groups by subject or by session.",
        "<b>± SD.</b> The spread between units, not the uncertainty of the mean: the plain (unweighted, "
        "population) SD of the per-subject values in Tables 7.1 and 7.4 (the thesis's \"SD between test "
        "subjects\"), of the per-session values in Table 7.5.",
        "<b>Seeds.</b> Everything is computed per seed first, then averaged over seeds (mean of means, mean of "
        "SDs). \"seed SD\" in the summary is the population SD across seeds of the overall weighted mean; it is "
        "the run-to-run noise to keep in mind when comparing methods. RANDOM may run on more seeds than the "
        "other methods (<code>random_seeds</code>; the \"seeds\" column says how many): an untrained network's "
        "call rate, and so its F1, is a draw of its initialisation, and evaluating it costs no training.",
        "<b>Rank sums.</b> For each subject (or session) the methods are ranked from 0 (worst) to n−1 (best) on "
        "the seed-averaged values, ties sharing the average rank, and the ranks are summed; units where a "
        "method has NA are skipped.",
        "<b>Metrics.</b> Percentages. ACC and F1 use threshold 0.5 on the pain probability, as the thesis does: "
        "the models are trained on balanced data (as many pain as no-pain examples), so 0.5 is their even odds, "
        "while the test sessions are not balanced. PR-AUC is the average precision (scikit-learn), which uses no "
        "threshold; its random baseline is the share of pain frames. The thesis used Keras's interpolated PR-AUC, "
        "which differs slightly. Bold marks each column's best value.",
    ]
    return "<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>"


PLOT_CAPTIONS = {
    "per_session_f1": "F1 per session, one line per method",
    "per_session_pr_auc": "PR-AUC per session, one line per method",
    "per_session_acc": "ACC per session, one line per method",
    "per_subject_f1": "F1 per test subject",
    "val_loss": "Validation loss per training round (mean over seeds)",
    "membership_auc": "Membership inference (loss attack, a lower bound): attack AUC per method and view, mean ± SE "
                      "over subjects and seeds; 0.5 = guessing. Synthetic data.",
}


def render_pain_html(run_info: Mapping[str, Any], agg: RunAggregate, tables: Mapping[str, Table],
                     plots: Mapping[str, bytes], *, run_dir_name: str = "", notes: Sequence[str] = (),
                     findings: str = "") -> str:
    """The whole page as a string; `findings` is threshold_findings' text."""
    total = sum(s.records + s.masked_out for s in agg.summary.values())
    kept = sum(s.records for s in agg.summary.values())
    extra = [("Test records", f"{total} ({kept} with positives kept, {total - kept} masked out)")]
    sections = [
        ("summary-section", "Summary", "Summary (Table 7.1)", table_block(tables["summary"])),
        ("how", "How to read", "How to read this", _how_to_read(agg)),
        ("threshold", "F1 threshold", "F1 at threshold 0.5",
         (f"<p>{escape(findings)}</p>" if findings else "")
         + (table_block(tables["f1_threshold"]) if "f1_threshold" in tables else "")),
        ("subjects", "Per subject", "Per test subject (Table 7.4)",
         "".join(table_block(tables[f"per_subject_{m}"]) for m in PRIMARY_METRICS if f"per_subject_{m}" in tables)),
        ("sessions", "Per session", "Per session (Table 7.5)",
         "".join(table_block(tables[f"per_session_{m}"]) for m in PRIMARY_METRICS if f"per_session_{m}" in tables)),
        ("ranks", "Rank sums", "Rank sums (Tables 7.6 and 7.7)",
         table_block(tables["rank_sums"]) if "rank_sums" in tables else ""),
    ]
    if "membership" in tables:  # [privacy.audit]
        sections.append(("membership", "Membership inference", "Membership inference audit (loss attack)",
                         "<p>What an attacker holding each view learns about which frames a subject trained on. "
                         "The attack is the loss attack, a lower bound on the leakage; the data are synthetic.</p>"
                         + table_block(tables["membership"])))
    return render_run_page(run_info, run_dir_name=run_dir_name, known_facts=KNOWN_FACTS, extra_facts=extra,
                           notes=notes, sections=sections, plots=plots, captions=PLOT_CAPTIONS)


# -- the report -------------------------------------------------------------------------
def build_report(run_dir: Path, run_info: Mapping[str, Any], notes: Sequence[str] = ()) -> Path:
    """Write the tables, plots and report.html of a pain run; returns report.html's path."""
    run_dir = Path(run_dir)
    records, agg, more = load_run(run_dir)
    thresholds = threshold_summaries(records)
    tables = build_tables(agg, thresholds)
    plots = build_plots(agg, records)
    membership = membership_table(records)  # [privacy.audit]
    if membership is not None:
        tables["membership"] = membership
        plots["membership_auc"] = membership_plot(records)
    page = render_pain_html(run_info, agg, tables, plots, run_dir_name=str(run_info.get("run_dir") or run_dir.name),
                            notes=[*notes, *more], findings=threshold_findings(agg, thresholds))
    return write_report(run_dir, tables, plots, page)


def summary_rows(run_dir: Path) -> list[dict]:
    """Table 7.1 as dicts (method, acc, acc_sd, pr_auc, pr_auc_sd, f1, f1_sd: seed-averaged
    weighted mean and SD across subjects, fractions, NaN where undefined), in the order
    methods first appear, recomputed from metrics.jsonl."""
    return _summary_rows(load_run(Path(run_dir))[1])


def _summary_rows(agg: RunAggregate) -> list[dict]:
    rows = []
    for method in agg.methods:
        s = agg.summary[method]
        row: dict[str, Any] = {"method": method}
        for m in PRIMARY_METRICS:
            row[m] = s.mean[m]
            row[f"{m}_sd"] = s.sd[m]
        rows.append(row)
    return rows


def format_summary_markdown(rows: list[dict]) -> str:
    """A Markdown table of :func:`summary_rows`, "mean ± SD" in %: Method | ACC | PR-AUC | F1."""
    lines = ["| Method | ACC | PR-AUC | F1 |", "|---|---:|---:|---:|"]
    for r in rows:
        method = str(r.get("method", "")).replace("|", "\\|")
        cells = [pct_pm(r.get(m), r.get(f"{m}_sd")) for m in PRIMARY_METRICS]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_markdown(run_dir: Path) -> str:
    """Table 7.1 of a run directory in Markdown (printed after a run), followed by the F1
    threshold finding when a trained method's F1 is below RANDOM's."""
    records, agg, _ = load_run(Path(run_dir))
    findings = threshold_findings(agg, threshold_summaries(records))
    table = format_summary_markdown(_summary_rows(agg))
    by_count: dict[int, list[str]] = {}
    for method in agg.methods:
        by_count.setdefault(len(agg.summary[method].seeds), []).append(method)
    if len(by_count) > 1:  # e.g. RANDOM on more seeds (random_seeds): say which row averages how many
        table += "\n\nMeans over seeds: " + "; ".join(
            f"{', '.join(methods)} over {n}" for n, methods in by_count.items()) + "."
    return f"{table}\n\n{findings}" if findings else table

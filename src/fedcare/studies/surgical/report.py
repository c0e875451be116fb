"""The report of a surgical run: the Markert thesis's tables and figures from metrics.jsonl.

``build_report(run_dir, run_info, notes)`` writes::

    tables/table_a1.{csv,md}     Table A.1: final macro F1 per client test set (change vs ALTV), Mean, Var
    tables/table_a2.{csv,md}     Table A.2: final F1 per tool, macro mean (change vs ALTV), Var over tools
    tables/table_6_1.{csv,md}    Table 6.1: one-sided Mann-Whitney U p-values
    tables/convergence.{csv,md}  per method: has its training loss converged (`convergence`), with the
                                 last 3 rounds' server steps and clients' updates; the notes say why
                                 a method did not (`unconverged`)
    tables/orderings.{csv,md}    the thesis's orderings checked on Table A.1's means (`orderings`); the
                                 notes say which methods barely trained (`stalled`) and which orderings
                                 are within the last rounds' swings (`unsettled`)
    plots/f1_per_round.png       global macro F1 per round, one line per view
    plots/f1_per_client.png      per client (Table A.1's columns) macro F1 per round, one panel per client
    plots/train_loss.png         mean training loss per round
    plots/graddiff.png, plots/cossim.png            WAVG over clients per FL method and round
    plots/cossim_per_client.png  CosSim per client, one panel per FL method
    report.html

The scores are `fedcare.studies.surgical.aggregate`'s (its docstring defines every view).
Table 6.1: per FL method, `scipy.stats.mannwhitneyu(x, y, alternative="less")` (the
one-sided alternative x < y, method "auto": exact without ties for small samples, else the
normal approximation with continuity correction) on the final per-client x per-tool F1
values (5 clients x 6 tools = 30 per side; several seeds: their mean): ALTV < FLT,
EGOV < FLT and FLT < CENT. Values are fractions, shown with three decimals as in the thesis.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fedcare.report import write_report
from fedcare.report.html import render_run_page, table_block
from fedcare.report.orderings import Ordering, orderings_table
from fedcare.report.plots import figure_png, legend_right, method_lines, method_styles
from fedcare.report.tables import Table
from fedcare.studies.rundir import read_run_records
from fedcare.studies.surgical.aggregate import (
    ALTV, EGOV, Run, View, client_update_curves, curves, final_views, index_run, label, loss_curves, server_curves,
    tool_values, update_curves,
)


def _f(x: float, digits: int = 3) -> str:
    return "NA" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _delta(x: float, base: float | None) -> str:
    if base is None or math.isnan(base) or math.isnan(x):
        return _f(x)
    return f"{_f(x)} ({x - base:+.3f})"


def _var(values: Sequence[float]) -> float:
    v = np.asarray(values, dtype=float)
    return float(np.var(v)) if len(v) and not np.isnan(v).any() else math.nan


def one_sided_p(x: Sequence[float], y: Sequence[float]) -> float:
    """p of the one-sided Mann-Whitney U test of the alternative "x is stochastically less than y"."""
    from scipy.stats import mannwhitneyu

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if not len(x) or not len(y) or np.isnan(x).any() or np.isnan(y).any():
        return math.nan
    return float(mannwhitneyu(x, y, alternative="less").pvalue)


def _fmt_p(p: float) -> str:
    if math.isnan(p):
        return "NA"
    return f"{p:.2e}" if p < 1e-3 else f"{p:.5f}"


# -- the tables ---------------------------------------------------------------------------
def table_a1(run: Run, views: Mapping[str, View]) -> Table:
    clients = run.clients
    base = views.get(ALTV)
    rows, csv_rows, scores = [], [], []
    for name, view in views.items():
        macros = [view.local[c].macro for c in clients]
        mean, var = float(np.mean(macros)), _var(macros)
        ref = [base.local[c].macro for c in clients] if base is not None and name != ALTV else None
        cells = [_delta(m, ref[i] if ref else None) for i, m in enumerate(macros)]
        cells.append(_delta(mean, float(np.mean(ref)) if ref else None))
        cells.append(f"{var:.5f}" if not math.isnan(var) else "NA")
        rows.append([label(name)] + cells)
        csv_rows.append([name] + macros + [mean, var])
        scores.append([math.nan] + macros + [mean, math.nan])
    for what, fn in (("Mean (all)", np.mean), ("Var (all)", _var)):
        column = [fn([views[n].local[c].macro for n in views]) for c in clients]
        rows.append([what] + [_f(v) if what.startswith("Mean") else f"{v:.5f}" for v in column] + ["", ""])
        csv_rows.append([what] + column + [math.nan, math.nan])
        scores.append([math.nan] * (len(clients) + 3))
    return Table(
        name="table_a1", title="Table A.1: final macro F1 per client test set",
        caption=("Column k: ALTV = client k's local model on the union of all test sets; EGOV = client k's local model "
                 "on its own test set; an FL method's global model (FedRep: client k's own model) and CENT on client "
                 "k's test set. In brackets the change vs ALTV in the same column. Mean and Var (population) across "
                 "the clients, unweighted; 'Mean (all)' and 'Var (all)' across the rows above."),
        columns=["", *clients, "Mean", "Var"], rows=rows,
        csv_header=["view", *clients, "mean", "var"], csv_rows=csv_rows, scores=scores)


def table_a2(run: Run, views: Mapping[str, View]) -> Table:
    tools = run.tools
    base = views.get(ALTV)
    rows, csv_rows, scores = [], [], []
    for name, view in views.items():
        values = [view.glob.tools[t] for t in tools]
        macro, var = view.glob.macro, _var(values)
        rows.append([label(name)] + [_f(v) for v in values]
                    + [_delta(macro, base.glob.macro if base is not None and name != ALTV else None),
                       f"{var:.5f}" if not math.isnan(var) else "NA"])
        csv_rows.append([name] + values + [macro, var])
        scores.append([math.nan] + values + [macro, math.nan])
    return Table(
        name="table_a2", title="Table A.2: final F1 per tool",
        caption=("FL methods with a global model and CENT: the model on the union of all clients' test sets (tp, fp, "
                 "fn summed over the clients). ALTV, EGOV and FedRep: WAVG of the clients' scores (weights: training "
                 "frames). Mean = macro F1 (in brackets the change vs ALTV); Var across the tools (population)."),
        columns=["", *tools, "Mean (macro)", "Var"], rows=rows,
        csv_header=["view", *tools, "macro_f1", "var"], csv_rows=csv_rows, scores=scores)


def p_values(run: Run, views: Mapping[str, View]) -> dict[str, dict[str, float]]:
    """{FL method: {"ALTV < FLT": p, "EGOV < FLT": p, "FLT < CENT": p}} (NaN where a baseline is missing)."""
    clients, tools = run.clients, run.tools
    sample = {name: tool_values(v, clients, tools) for name, v in views.items()}
    none: list[float] = []
    out = {}
    for name in views:
        if name in (ALTV, EGOV, "cent"):
            continue
        flt = sample[name]
        out[name] = {"ALTV < FLT": one_sided_p(sample.get(ALTV, none), flt),
                     "EGOV < FLT": one_sided_p(sample.get(EGOV, none), flt),
                     "FLT < CENT": one_sided_p(flt, sample.get("cent", none))}
    return out


def table_6_1(pvalues: Mapping[str, Mapping[str, float]]) -> Table:
    tests = ["ALTV < FLT", "EGOV < FLT", "FLT < CENT"]
    return Table(
        name="table_6_1", title="Table 6.1: one-sided Mann-Whitney U p-values",
        caption=("Samples: the final F1 of every client x tool (the per-client scores of Table A.1's rows, per tool). "
                 "'ALTV < FLT': the alternative that the local models' ALTV scores are stochastically smaller than the "
                 "FL method's; p < 0.05 is significant. NA: the run has no LOT (ALTV, EGOV) or no CENT."),
        columns=["Algorithm", *tests], rows=[[label(m)] + [_fmt_p(p[t]) for t in tests] for m, p in pvalues.items()],
        csv_header=["method", "altv_lt_flt", "egov_lt_flt", "flt_lt_cent"],
        csv_rows=[[m] + [p[t] for t in tests] for m, p in pvalues.items()])


# -- the thesis's orderings -------------------------------------------------------------------
MARGIN = 0.02  # "CENT >= FedAvg - a small margin", in Table A.1's mean macro F1


def orderings(views: Mapping[str, View]) -> list[Ordering]:
    """The thesis's findings on Table A.1's means (the clients' macro F1, unweighted): every FL
    method except FedDyn above ALTV; CENT at least FedAvg minus `MARGIN`; FedDyn (the thesis's
    settings) not above ALTV. Only those whose views the run has. p: Table 6.1's one-sided
    Mann-Whitney U test that the left side's client x tool F1 values are larger than the right
    side's (n per side), whichever way the claim points."""
    mean = {n: float(np.mean([s.macro for s in v.local.values()])) for n, v in views.items()}
    sample = {n: [s.tools[t] for s in v.local.values() for t in s.tools] for n, v in views.items()}

    def check(claim: str, left: str, right: str, holds: bool) -> Ordering:
        return Ordering(claim, mean[left], mean[right], holds, one_sided_p(sample[right], sample[left]),
                        len(sample[left]))

    out = []
    for name in mean:
        if ALTV not in mean or name in (ALTV, EGOV, "cent"):
            continue
        if name.removesuffix("-uniform") == "feddyn":
            out.append(check(f"{label(name)} <= ALTV", name, ALTV, mean[name] <= mean[ALTV]))
        else:
            out.append(check(f"{label(name)} > ALTV", name, ALTV, mean[name] > mean[ALTV]))
    if "cent" in mean and "fedavg" in mean:
        out.append(check(f"CENT >= FedAvg - {MARGIN:g}", "cent", "fedavg", mean["cent"] >= mean["fedavg"] - MARGIN))
    return out


def table_orderings(views: Mapping[str, View]) -> Table:
    return orderings_table(
        orderings(views), title="The thesis's orderings on this run", number=_f,
        test="p (left > right)",
        caption=("Table A.1's means (the clients' macro F1, unweighted). The thesis: every FL method except FedDyn beats "
                 "ALTV, CENT is about as good as FL, FedDyn with the thesis's settings is not better than ALTV. "
                 "p: one-sided Mann-Whitney U (Table 6.1's test) of the alternative that the left side's final client x "
                 "tool F1 values are larger than the right side's, n per side; for a '<=' claim a small p speaks "
                 "against it. A single seed on few frames decides nothing."))


# the demo's convergence criterion (docs/studies/surgical.md, fixed before the demo was sized)
SETTLED = 0.02  # over the last 3 rounds the loss moves by less than this share of its final value
LEARNED = 0.01  # and it has fallen by more than this share of its first round's value


class Convergence(NamedTuple):
    method: str
    first: float  # L_1
    last: float  # L_R
    settle: float  # (max - min) / L_R over rounds R-3..R
    fall: float  # (L_1 - L_R) / L_1
    converged: bool  # settle < SETTLED and fall > LEARNED
    server_step: float  # FL methods: how far the server moved the model in rounds R-2..R (sum of the
    mean_update: float  # rounds' shares of its norm), and the clients' weighted average update (LOT, CENT: NaN)
    annealed: bool  # the server's learning rate in round R is below its largest (train.server_anneal)


def convergence(run: Run) -> list[Convergence]:
    """Per method, its mean training loss curve against the demo's criterion: converged when
    settle < SETTLED and fall > LEARNED. Fewer than 4 rounds: settle is NaN and the method has
    not converged."""
    steps, updates = server_curves(run, "server_step"), server_curves(run, "mean_update")
    rates = server_curves(run, "server_lr")
    out = []
    for method, curve in loss_curves(run).items():
        rounds = sorted(curve)
        first, last = curve[rounds[0]], curve[rounds[-1]]
        tail = [curve[r] for r in rounds[-4:]]
        settle = (max(tail) - min(tail)) / abs(last) if len(rounds) >= 4 and last else math.nan
        fall = (first - last) / abs(first) if first else math.nan
        window = rounds[-3:]  # the rounds that moved the loss between the settle window's 4 values
        step, update = (sum(curve_of.get(method, {}).get(r, math.nan) for r in window) for curve_of in (steps, updates))
        rate = rates.get(method, {})
        annealed = bool(rate) and rate.get(rounds[-1], math.nan) < max(rate.values())
        out.append(Convergence(method, first, last, settle, fall, bool(settle < SETTLED and fall > LEARNED), step, update,
                               annealed))
    return out


def _percent(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.2g}%"


def table_convergence(run: Run) -> Table:
    checks = convergence(run)
    return Table(
        name="convergence", title="Has each method's training loss converged?",
        caption=(f"The mean training loss per round (plots/train_loss.png). Settle: how far it moved over the last 3 "
                 f"rounds, (max - min) / final value; fall: (first - final) / first. Converged: settle < "
                 f"{SETTLED:g} and fall > {LEARNED:g} (a loss that never fell has not started, it has not converged; "
                 f"docs/studies/surgical.md). Server steps and clients' updates (FL methods, over the last 3 rounds): how far "
                 f"the server's AdamW moved the global model, and how far the clients' average updates (weighted by "
                 f"training frames) would have, summed over the rounds as shares of the model's norm."),
        columns=["Method", "Loss, round 1", "Loss, last round", "Settle (last 3 rounds)", "Fall", "Converged",
                 "Server steps", "Clients' updates"],
        rows=[[label(c.method), f"{c.first:.3f}", f"{c.last:.3f}", _f(c.settle, 4), _f(c.fall, 3),
               "yes" if c.converged else "no", _percent(c.server_step), _percent(c.mean_update)] for c in checks],
        csv_header=list(Convergence._fields),
        csv_rows=[list(c) for c in checks])


def _noise(method: str) -> str:
    """What makes a method's per-epoch training loss noisy with its model at rest."""
    return "dropout, amplitude spectra redrawn every epoch" if method.startswith("feddg") else "dropout"


def unconverged(run: Run) -> list[str]:
    """Notes on the methods that did not meet the criterion, with what the run says about why:
    a loss that rose, a server that kept moving the model after the clients had stopped, or
    (the server's rate annealed) a model at rest whose per-epoch loss is noisy by itself."""
    out = []
    for c in convergence(run):
        if c.converged or math.isnan(c.settle):
            continue
        name = label(c.method)
        if c.fall < 0:
            out.append(f"{name}: its training loss ended above its first round's ({c.first:.3f} -> {c.last:.3f}): it "
                       f"diverged" + (", as FedDyn with the thesis's settings does in the thesis (§7.1.1.2)."
                                      if c.method.startswith("feddyn") else "."))
        elif c.annealed:
            out.append(f"{name}: its training loss moved by {100 * c.settle:.1f}% over the last 3 rounds, in which the "
                       f"server's steps (its learning rate annealed) came to {_percent(c.server_step)} of the model's "
                       f"norm and the clients' updates to {_percent(c.mean_update)}: the model had come to rest, what "
                       f"moves the loss is the per-epoch loss's own noise ({_noise(c.method)}).")
        elif c.server_step > 10 * c.mean_update and c.mean_update > 0:
            out.append(f"{name}: its training loss moved by {100 * c.settle:.1f}% over the last 3 rounds. In them the "
                       f"clients' average updates came to {_percent(c.mean_update)} of the model's norm (their "
                       f"one-cycle learning rate had annealed), while the server's AdamW, at its constant learning "
                       f"rate, moved the global model by {_percent(c.server_step)}, "
                       f"{c.server_step / c.mean_update:.0f} times as far. The clients had stopped learning: what "
                       f"moves the loss is the server's steps and the per-epoch loss's own noise "
                       f"({_noise(c.method)}), not training the demo cut short (docs/studies/surgical.md).")
        elif c.mean_update == 0 and c.server_step > 0:
            out.append(f"{name}: its training loss moved by {100 * c.settle:.1f}% over the last 3 rounds, in which the "
                       f"server's AdamW still moved the global model by {_percent(c.server_step)} of its norm.")
    return out


def stalled(run: Run, tolerance: float = 0.01) -> list[str]:
    """Notes on methods whose mean training loss moved by less than `tolerance` (relative)
    from the first round to the last: their models are still about the initial model, so
    their scores are that model's thresholded (nearly constant) predictions, not what the
    method learns."""
    out = []
    for method, curve in loss_curves(run).items():
        rounds = sorted(curve)
        first, last = curve[rounds[0]], curve[rounds[-1]]
        if len(rounds) > 1 and abs(last - first) <= tolerance * abs(first):
            out.append(f"{label(method)}: the training loss moved only from {first:.3f} (round {rounds[0]}) to "
                       f"{last:.3f} (round {rounds[-1]}): its models have barely left the initial model, and its "
                       f"scores are that model's nearly constant predictions rather than what the method learns.")
    return out


def unsettled(run: Run, views: Mapping[str, View]) -> list[str]:
    """Notes on views whose Table A.1 mean moved between consecutive rounds, over the last
    quarter of the run (at least 2 rounds), by more than its final distance to ALTV: which of
    the two is ahead at the last round is then chance, not a finding."""
    if ALTV not in views:
        return []
    mean = lambda view: float(np.mean([s.macro for s in view.local.values()]))  # noqa: E731
    per_round = curves(run)
    out = []
    for name, view in views.items():
        rounds = sorted(per_round.get(name, {}))
        if name in (ALTV, EGOV) or len(rounds) < 3:
            continue
        last = [mean(per_round[name][r]) for r in rounds[-max(3, len(rounds) // 4 + 1):]]
        swing = max(abs(b - a) for a, b in zip(last, last[1:]))
        gap = mean(view) - mean(views[ALTV])
        if swing > abs(gap):
            out.append(f"{label(name)}: its Table A.1 mean moved by up to {swing:.3f} from one round to the next over "
                       f"the last {len(last) - 1} rounds, more than its final distance to ALTV ({gap:+.3f}): which of "
                       f"the two is ahead at the last round is not settled.")
    return out


# -- plots ----------------------------------------------------------------------------------
def _panels(titles: Sequence[str], lines: Mapping[str, Mapping[str, Mapping[int, float]]], order: Sequence[str], *,
            ylabel: str, title: str, scale: float = 1.0, log: bool = False) -> bytes:
    """One panel per title; per panel a line per entry of `order` (lines[title][entry][round])."""
    from matplotlib.figure import Figure

    n = max(1, len(titles))
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(4.2 * cols + 1.6, 3.0 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    styles = method_styles(list(order))
    for i, panel in enumerate(titles):
        ax = axes[i // cols][i % cols]
        for entry in order:
            values = lines.get(panel, {}).get(entry)
            if not values:
                continue
            xs = sorted(values)
            ax.plot(xs, [values[x] * scale for x in xs], label=entry, linewidth=1.3, markersize=3, **styles[entry])
        ax.set_title(panel, fontsize=10)
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("symlog", linthresh=1e-6)
        ax.grid(True, alpha=0.3)
    for j in range(len(titles), rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    legend_right(axes[0][cols - 1], len(order))
    fig.suptitle(title, fontsize=11)
    return figure_png(fig)


def plots(run: Run) -> tuple[dict[str, bytes], dict[str, str]]:
    per_round = curves(run)
    names = [label(n) for n in per_round]
    glob = {label(n): {r: v.glob.macro for r, v in values.items()} for n, values in per_round.items()}
    rounds = sorted({r for values in glob.values() for r in values})
    out, captions = {}, {}
    if rounds:
        out["f1_per_round"] = method_lines(names, rounds, glob, xlabel="round", ylabel="macro F1 (%)",
                                           title="Global macro F1 per round", tick_every_unit=len(rounds) <= 20)
        captions["f1_per_round"] = ("Global macro F1 per round: FL global models and CENT on the union of the test sets; "
                                    "ALTV, EGOV and FedRep the WAVG of the clients' scores.")
        per_client = {c: {label(n): {r: v.local[c].macro for r, v in values.items()} for n, values in per_round.items()}
                      for c in run.clients}
        out["f1_per_client"] = _panels(run.clients, per_client, names, ylabel="macro F1 (%)", scale=100,
                                       title="Macro F1 per round on each client (Table A.1's columns)")
        captions["f1_per_client"] = ("Per client, Table A.1's column over the rounds: ALTV = that client's local model "
                                     "on all test sets, EGOV = on its own, FL and CENT = on the client's test set.")
    loss = {label(m): v for m, v in loss_curves(run).items()}
    if loss:
        lr = sorted({r for v in loss.values() for r in v})
        out["train_loss"] = method_lines(list(loss), lr, loss, xlabel="round", ylabel="training loss (weighted BCE)",
                                         title="Mean training loss per round (LOT: over the local models)", scale=1.0,
                                         tick_every_unit=len(lr) <= 20)
        captions["train_loss"] = ("Mean training loss of the last local epoch (the task's weighted BCE, without "
                                  "FedProx's or FedDyn's regulariser), weighted by training frames.")
    for what, name in (("graddiff", "GradDiff"), ("cossim", "CosSim")):
        values = {label(m): v for m, v in update_curves(run, what).items()}
        if values:
            ur = sorted({r for v in values.values() for r in v})
            out[what] = method_lines(list(values), ur, values, xlabel="round", ylabel=name, scale=1.0,
                                     title=f"{name} per round, WAVG over clients", tick_every_unit=len(ur) <= 20)
            captions[what] = (f"{name} of each client's update, WAVG over clients (training frames): "
                              + ("GradDiff = ||w_k - w_new||^2, w_new the new global model." if what == "graddiff" else
                                 "CosSim = cos(w_k - w_t, w_new - w_t), the client's update against the global one."))
    fl = [m for m in run.methods if any(r["method"] == m for r in run.updates)]
    if fl:
        lines = {label(m): client_update_curves(run, m, "cossim") for m in fl}
        out["cossim_per_client"] = _panels([label(m) for m in fl], lines, run.clients, ylabel="CosSim",
                                           title="CosSim per client and round")
        captions["cossim_per_client"] = "CosSim of each client's update with the global update, per FL method."
    return out, captions


# -- the page ---------------------------------------------------------------------------------
HOW_TO_READ = """
<p>This run repeats the Markert thesis's comparison of federated learning methods for surgical
tool presence (6 tools, multi-label, macro F1 over the tools). Five clients: HEI1 and HEI2
(HeiChole, Heidelberg and Salem), CHO1 to CHO3 (Cholec80, split by the black border's width).
Every client scores models on its own test frames, at the client; only counts and scores
leave it.</p>
<ul>
<li><b>ALTV</b> and <b>EGOV</b> are the two readings of local-only training (LOT, one model per
client): ALTV scores client k's model on the union of all test sets (how well it generalises),
EGOV on k's own test set (what k gains for itself).</li>
<li><b>FL methods</b> (FedAvg, FedProx, FedDyn, FedDG) train one global model, scored on each
client's test set (Table A.1) and on the union of all test sets (Table A.2). <b>FedRep</b>
keeps a private head per client: each client scores its own model (EGOV only, as the thesis).
<b>CENT</b> trains one model on every client's training frames pooled.</li>
<li>Table A.1's brackets are the change against ALTV in the same column; Mean and Var are
across the clients, unweighted. WAVG (Table A.2's ALTV, EGOV, FedRep rows) weights clients by
their training frames.</li>
<li>Table 6.1: one-sided Mann-Whitney U tests on the final F1 of every client x tool; a small p
for "ALTV &lt; FLT" says the FL method's scores are larger than ALTV's; a small p for
"FLT &lt; CENT" says CENT's are larger than the FL method's. The thesis: every method except
FedDyn beats ALTV (p &lt; 1e-5), none beats EGOV significantly, CENT is not significantly
better than FL (p about 0.5), FedDyn is worse than CENT.</li>
<li>GradDiff (||w_k - w_new||^2) and CosSim (cosine of client k's update with the global
update) are computed by the server on each aggregation; the thesis reads a falling GradDiff as
convergence and a CosSim near 0 as clients pulling in unrelated directions.</li>
<li>The orderings table checks the thesis's findings on Table A.1's means, with Table 6.1's
test for each; the convergence table says whether each method's training loss had settled
(less than 2% over the last 3 rounds) after falling, so that an ordering is read between
trained models, not between a model and its initialisation.</li>
<li>A tool a client's test set never shows (HEI2's Suction-Irrigation in the thesis) scores
F1 = 0 there and counts in the macro mean, as in the thesis.</li>
</ul>
"""


def _load(run_dir: Path) -> Run:
    records, _ = read_run_records(run_dir)
    return index_run(records, str(Path(run_dir) / "metrics.jsonl"))


def build_report(run_dir: Path, run_info: Mapping[str, Any], notes: list[str]) -> Path:
    run = _load(run_dir)
    views = final_views(run)
    tables = {"table_a1": table_a1(run, views), "table_a2": table_a2(run, views),
              "table_6_1": table_6_1(p_values(run, views)), "orderings": table_orderings(views),
              "convergence": table_convergence(run)}
    figures, captions = plots(run)
    tables, figures = _membership(run_dir, tables, figures)  # [privacy.audit]
    sections = [("how", "How to read", "How to read this", HOW_TO_READ),
                ("tables", "Tables", "Tables", "".join(table_block(t) for t in tables.values()))]
    extra = [("Clients (train/test frames)", ", ".join(f"{c} {int(run.train_frames[c])}" for c in run.clients))]
    page = render_run_page(run_info, run_dir_name=Path(run_dir).name,
                           known_facts=[("study", "Study"), ("architecture", "Model"), ("rounds", "Rounds"),
                                        ("methods", "Methods"), ("seeds", "Seeds"), ("started", "Started"),
                                        ("finished", "Finished")],
                           extra_facts=extra, notes=[*notes, *stalled(run), *unsettled(run, views), *unconverged(run)],
                           sections=sections, plots=figures, captions=captions)
    return write_report(run_dir, tables, figures, page)


def _membership(run_dir: Path, tables: dict, figures: dict | None = None) -> tuple[dict, dict]:
    """`fedcare.privacy.client_audit.with_membership` with this study's caption."""
    from fedcare.privacy.client_audit import membership_caption, with_membership

    return with_membership(run_dir, membership_caption(
        "its training frames", "its test frames, which come from other videos (so the AUC also measures how "
        "much the model fits its training videos' appearance: leakage of videos more than of frames)",
        "own = the client's model (FL methods: the global model; FedRep: with its private head); peer = the "
        "next client's model; CENT and LOT are not audited"), tables, figures)


def summary_markdown(run_dir: Path) -> str:
    """Table A.1 (and Table 6.1 when it has numbers) in Markdown."""
    run = _load(run_dir)
    views = final_views(run)
    parts = [table_a1(run, views).markdown()]
    pvalues = p_values(run, views)
    if any(not math.isnan(p) for v in pvalues.values() for p in v.values()):
        parts.append(table_6_1(pvalues).markdown())
    if orderings(views):
        parts.append(table_orderings(views).markdown())
    if run.rounds:
        parts.append(table_convergence(run).markdown())
    membership = _membership(run_dir, {})[0].get("membership")  # [privacy.audit]
    if membership is not None:
        parts.append(membership.markdown())
    parts += [f"Note: {n}" for n in (*stalled(run), *unsettled(run, views), *unconverged(run))]
    return "\n".join(parts).rstrip()


__all__ = ["build_report", "convergence", "one_sided_p", "orderings", "p_values", "stalled", "summary_markdown", "table_6_1",
           "table_a1", "table_a2", "unconverged", "unsettled"]

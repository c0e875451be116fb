"""The face-verification report, from metrics.jsonl and run.json alone, in the thesis's layouts:

- Table A.1: mean TAR@FAR of the global model and of the tuned model, and the increase, for
  the training clients and the unseen clients separately. Per method: each client's mean over
  runs x evaluation paths, then the mean over clients (reference note §4).
- Fairness (Tables A.2-style): the std of TAR across clients, per run and path, averaged.
- Tests: per method, the client-averaged score of every (run, path); paired Student's t-test
  and Wilcoxon signed-rank (scipy, two-sided) against the first method, matching (run, path).
- Orderings: the thesis's findings (`THESIS_ORDERINGS`) checked on these numbers, each with the
  paired t-test's p (the table layout is `fedcare.report.orderings`'s, shared with the surgical study).
- Plots: per-client TAR before and after tuning."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from fedcare.errors import InputError
from fedcare.evaluation.statistics import nanmean
from fedcare.report import write_report
from fedcare.report.html import render_run_page, table_block
from fedcare.report.orderings import Ordering, orderings_table
from fedcare.report.plots import method_bars
from fedcare.report.tables import Table, pct
from fedcare.studies.rundir import read_run_records

KINDS = ("tar_global", "tar_tuned")
GROUPS = ("trained", "unseen")


def _evals(run_dir: Path) -> list[dict]:
    records, _ = read_run_records(run_dir)
    evals = [r for r in records if r["type"] == "client_eval"]
    if not evals:
        raise InputError(f"{Path(run_dir) / 'metrics.jsonl'}: no client_eval records")
    return evals


def _unseen(run_dir: Path, run_info: dict | None = None) -> set[int]:
    info = run_info if run_info is not None else json.loads((Path(run_dir) / "run.json").read_text())
    return set(info.get("unseen", []))


class Scores:
    """values[method][kind][(seed, path)][client] = TAR."""

    def __init__(self, evals: list[dict], unseen: set[int]):
        self.methods = list(dict.fromkeys(r["method"] for r in evals))
        self.unseen = unseen
        self.values: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
        for r in evals:
            for kind in KINDS:
                self.values[r["method"]][kind][(r["seed"], r["path"])][r["client"]] = r[kind]
        self.clients = sorted({r["client"] for r in evals})

    def group(self, name: str) -> list[int]:
        return [c for c in self.clients if (c in self.unseen) == (name == "unseen")]

    def per_client(self, method: str, kind: str) -> dict[int, float]:
        """Each client's mean over runs x paths."""
        runs = self.values[method][kind].values()
        return {c: nanmean(run.get(c, math.nan) for run in runs) for c in self.clients}

    def mean(self, method: str, kind: str, group: str) -> float:
        per = self.per_client(method, kind)
        return nanmean(per[c] for c in self.group(group))

    def per_run(self, method: str, kind: str, group: str, stat=np.nanmean) -> dict[tuple, float]:
        """(seed, path) -> the statistic over the group's clients (mean, or std for fairness)."""
        out = {}
        for key, run in sorted(self.values[method][kind].items()):
            v = np.array([run.get(c, math.nan) for c in self.group(group)], float)
            out[key] = float(stat(v)) if np.isfinite(v).any() else math.nan
        return out

    def fairness(self, method: str, kind: str, group: str) -> float:
        return nanmean(self.per_run(method, kind, group, lambda v: np.nanstd(v, ddof=0)).values())


def increase(before: float, after: float) -> float:
    return (after - before) / before if before else math.nan


def paired_tests(a: dict, b: dict) -> tuple[float, float, int]:
    """(t-test p, Wilcoxon p, pairs) over the keys both hold with finite values."""
    from scipy import stats

    keys = [k for k in a if k in b and math.isfinite(a[k]) and math.isfinite(b[k])]
    x, y = np.array([a[k] for k in keys]), np.array([b[k] for k in keys])
    if len(keys) < 2 or np.allclose(x, y):
        return math.nan, math.nan, len(keys)
    t = float(stats.ttest_rel(x, y).pvalue)
    w = float(stats.wilcoxon(x, y).pvalue)
    return t, w, len(keys)


# Below 6 pairs the Wilcoxon signed-rank test cannot reach p < 0.05 (its smallest two-sided p is
# 2 / 2^n), and a paired t-test with 1-4 degrees of freedom rests on assuming normal differences
# that so few pairs cannot show: such p-values are printed, marked, and not to be read as evidence.
MIN_PAIRS = 6


def _fmt_p(p: float, pairs: int) -> str:
    if not math.isfinite(p):
        return "–"
    return f"{p:.3f}" if pairs >= MIN_PAIRS else f"{p:.3f} (too few pairs)"


def tables(s: Scores) -> dict[str, Table]:
    groups = [g for g in GROUPS if s.group(g)]
    label = {"trained": "trained clients", "unseen": "unseen clients"}
    cols, rows, csv_rows, scores = ["Method"], [], [], []
    for g in groups:
        cols += [f"{label[g]}: global", f"{label[g]}: tuned", "incr."]
    for m in s.methods:
        row, csv_row, sc = [m], [m], [math.nan]
        for g in groups:
            before, after = s.mean(m, "tar_global", g), s.mean(m, "tar_tuned", g)
            row += [pct(before), pct(after), pct(increase(before, after), 1)]
            csv_row += [before, after, increase(before, after)]
            sc += [before, after, math.nan]
        rows.append(row), csv_rows.append(csv_row), scores.append(sc)
    header = ["method"] + [f"{g}_{k}" for g in groups for k in ("global", "tuned", "increase")]
    far = "TAR@FAR"
    mean = Table("tar", f"Table A.1: mean {far}", "Each client's mean over runs x evaluation paths, then the mean over "
                 "clients; 'global': the trained model with the client's head, 'tuned': after local tuning; "
                 "incr.: relative increase.", cols, rows, header, csv_rows, scores)
    fcols, frows, fcsv = ["Method"], [], []
    for g in groups:
        fcols += [f"{label[g]}: global", f"{label[g]}: tuned"]
    for m in s.methods:
        vals = [s.fairness(m, k, g) for g in groups for k in KINDS]
        frows.append([m] + [pct(v) for v in vals]), fcsv.append([m] + vals)
    fair = Table("fairness", f"Fairness: std of {far} across clients", "Std across clients per run and path, "
                 "averaged (lower is fairer).", fcols, frows, ["method"] + [f"{g}_{k}_std" for g in groups
                                                                          for k in KINDS], fcsv)
    ref = s.methods[0]
    trows, tcsv = [], []
    for m in s.methods[1:]:
        for g in groups:
            for k in KINDS:
                t, w, n = paired_tests(s.per_run(m, k, g), s.per_run(ref, k, g))
                trows.append([f"{m} vs {ref}", label[g], k.removeprefix("tar_"), str(n), _fmt_p(t, n), _fmt_p(w, n)])
                tcsv.append([m, ref, g, k, n, t, w])
    tests = Table("tests", f"Paired tests against {ref}", "Client-averaged TAR per (run, path), paired on run and "
                  "path; two-sided p-values of Student's paired t-test and the Wilcoxon signed-rank test "
                  f"(– : fewer than 2 pairs or no difference). With fewer than {MIN_PAIRS} pairs a p-value says "
                  "nothing (the Wilcoxon test cannot reach 0.05; the t-test's normality cannot be checked): "
                  "those are marked 'too few pairs'; more runs (seeds) give more pairs.", ["Comparison", "Clients", "Model", "Pairs",
                                                                 "t-test p", "Wilcoxon p"],
                  trows, ["method", "reference", "clients", "model", "pairs", "ttest_p", "wilcoxon_p"], tcsv)
    out = {"tar": mean, "fairness": fair, "tests": tests}
    if orderings(s):
        out["orderings"] = table_orderings(s)
    return out


# -- the thesis's orderings (reference/facerec-thesis.md §5, "Headline claims") ---------------
# (finding, left (method, quantity), right (method, quantity), clients, relation); quantity:
# tar_global / tar_tuned (Table A.1), increase (Table A.1's incr.), std_tuned (the fairness table)
_VARIANTS = ("", "-local", "-reg", "-fair")
THESIS_ORDERINGS = [
    *[("HF-MAML beats FL", (f"hfmaml{v}", "tar_tuned"), (f"fedavg{v}", "tar_tuned"), g, ">")
      for v in _VARIANTS for g in GROUPS],
    *[("FedFR is beaten after tuning", ("hfmaml", "tar_tuned"), ("fedfr", "tar_tuned"), g, ">") for g in GROUPS],
    *[("tuning raises TAR", (m, "tar_tuned"), (m, "tar_global"), g, ">") for m in ("fedavg", "hfmaml") for g in GROUPS],
    *[("regularisation: best untuned TAR, above all on new clients", (f"{m}-reg", "tar_global"), (m, "tar_global"),
       "unseen", ">") for m in ("fedavg", "hfmaml")],
    *[("regularisation: smallest tuning gain", (f"{m}-reg", "increase"), (m, "increase"), g, "<")
      for m in ("fedavg", "hfmaml") for g in GROUPS],
    *[("local head slightly better before tuning", (f"{m}-local", "tar_global"), (m, "tar_global"), "trained", ">")
      for m in ("fedavg", "hfmaml")],
    *[("global head slightly better after tuning", (m, "tar_tuned"), (f"{m}-local", "tar_tuned"), "trained", ">")
      for m in ("fedavg", "hfmaml")],
    ("HF-MAML lowers the std across clients", ("hfmaml", "std_tuned"), ("fedavg", "std_tuned"), "trained", "<"),
    ("q-FedAvg brings no fairness gain", ("fedavg-fair", "std_tuned"), ("fedavg", "std_tuned"), "trained", ">="),
]
_SHOWN = {"tar_global": "global", "tar_tuned": "tuned", "increase": "incr.", "std_tuned": "std tuned"}


def _table_value(s: Scores, method: str, quantity: str, group: str) -> float:
    """The number Table A.1 (or the fairness table) shows."""
    if quantity == "increase":
        return increase(s.mean(method, "tar_global", group), s.mean(method, "tar_tuned", group))
    if quantity == "std_tuned":
        return s.fairness(method, "tar_tuned", group)
    return s.mean(method, quantity, group)


def _per_run(s: Scores, method: str, quantity: str, group: str) -> dict[tuple, float]:
    """The same quantity per (run, path), the paired tests' samples."""
    if quantity == "increase":
        before, after = s.per_run(method, "tar_global", group), s.per_run(method, "tar_tuned", group)
        return {k: increase(before[k], after[k]) for k in before if k in after}
    if quantity == "std_tuned":
        return s.per_run(method, "tar_tuned", group, lambda v: np.nanstd(v, ddof=0))
    return s.per_run(method, quantity, group)


def orderings(s: Scores) -> list[Ordering]:
    """The thesis's findings that this run's methods and clients can show: holds on the
    tables' numbers; p: the paired t-test (two-sided, `paired_tests`) over (run, path)."""
    relations = {">": lambda a, b: a > b, "<": lambda a, b: a < b, ">=": lambda a, b: a >= b}
    out = []
    for finding, (lm, lq), (rm, rq), group, rel in THESIS_ORDERINGS:
        if lm not in s.methods or rm not in s.methods or not s.group(group):
            continue
        left, right = _table_value(s, lm, lq, group), _table_value(s, rm, rq, group)
        t, _, n = paired_tests(_per_run(s, lm, lq, group), _per_run(s, rm, rq, group))
        holds = math.isfinite(left) and math.isfinite(right) and relations[rel](left, right)
        out.append(Ordering(f"{finding}: {lm} {_SHOWN[lq]} {rel} {rm} {_SHOWN[rq]} ({group})", left, right, holds, t, n))
    return out


def table_orderings(s: Scores) -> Table:
    return orderings_table(
        orderings(s), title="The thesis's orderings on this run", number=pct, test="p (paired t-test)", min_n=MIN_PAIRS,
        caption=("The Hess thesis's findings (Sec. 5-6) as comparisons of this run's numbers: TAR@FAR (%) and its "
                 "relative increase from Table A.1, the std of tuned TAR across clients from the fairness table; "
                 "'trained'/'unseen': the clients that trained / never trained (the thesis's 1-15 / 16-20). p: "
                 "two-sided paired t-test over (run, path) of the client-averaged values, n pairs (the tests "
                 f"table's test); with fewer than {MIN_PAIRS} pairs it is marked 'only n' and says nothing. The "
                 "thesis's numbers come from 10 runs x 5 paths of 30 rounds on real faces."))


def build_report(run_dir: Path, run_info: dict, notes: list[str]) -> Path:
    s = Scores(_evals(run_dir), _unseen(run_dir, run_info))
    t = tables(s)
    plots = {f"per_client_{k}": method_bars(s.methods, s.clients, {m: s.per_client(m, k) for m in s.methods},
                                            xlabel="client", ylabel="TAR (%)",
                                            title=f"Per-client TAR@FAR, {'tuned' if k == 'tar_tuned' else 'global'} model")
             for k in KINDS}
    pool = ("any client's test split (global testing)" if run_info.get("impostors") == "global"
            else "the client's own test split (local testing)")
    how = ("<p>How to read this: TAR@FAR is the share of genuine pairs (two images of one person) scoring above the "
           "threshold that lets through the given share of impostor pairs; higher is better. An impostor pair is "
           f"one of the client's test images and an image of another person from {pool}. 'global' is the "
           "trained model as received, 'tuned' the same model after a few local batches. Unseen clients never "
           "trained.</p>")
    t, plots = _membership(run_dir, t, plots)  # [privacy.audit]
    sections = [("summary", "Summary", "Summary", how + "".join(table_block(x) for x in t.values()))]
    page = render_run_page(run_info, run_dir_name=Path(run_dir).name, known_facts=[("study", "Study")], notes=notes,
                           sections=sections, plots=plots)
    return write_report(run_dir, t, plots, page)


def summary_markdown(run_dir: Path) -> str:
    """Table A.1, when the run's methods show any the thesis's orderings, and the membership
    audit's table when [privacy.audit] ran, in Markdown."""
    t, _ = _membership(run_dir, tables(Scores(_evals(run_dir), _unseen(run_dir))))  # [privacy.audit]
    return "\n".join(t[name].markdown() for name in ("tar", "orderings", "membership") if name in t).rstrip()


def _membership(run_dir: Path, t: dict, plots: dict | None = None) -> tuple[dict, dict]:
    """`fedcare.privacy.client_audit.with_membership` with this study's caption."""
    from fedcare.privacy.client_audit import membership_caption, with_membership

    return with_membership(run_dir, membership_caption(
        "its training crops", "its test crops of the same identities (never trained on)",
        "own = the client's model with its own head; peer = the next training client's model (a global head "
        "only: a local head's rows are its own client's identities, so n/a)"), t, plots)

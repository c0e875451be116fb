"""What a run's report says about its privacy: the epsilon each method spent, from the
`round` records of metrics.jsonl (`dp_epsilon`: DP-SGD, the largest over the clients;
`client_dp_epsilon`: client-level DP) and the deltas in config.toml, and whether secure
aggregation hid the individual updates, shared by every study's report as notes at the top of
the page; the membership audit's table and plot from the `membership` records
([privacy.audit]); and the one-run audits' epsilon-hat beside epsilon, with the soundness
verdict run.json keeps (`audit_verdict`).
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from fedcare.algorithms.base import DP_EPSILON
from fedcare.privacy.canaries import DP_AUDIT
from fedcare.privacy.canary_clients import AUDIT_PREFIX as CLIENT_AUDIT
from fedcare.privacy.client_dp import CLIENT_DP_EPSILON
from fedcare.privacy.one_run import contradicted
from fedcare.report.tables import Table
from fedcare.runfiles import read_run_records

KINDS = {DP_EPSILON: ("DP-SGD (sample-level)", "dp_sgd"), CLIENT_DP_EPSILON: ("client-level DP", "client_dp")}
NO_GUARANTEE = "inf (no guarantee)"


def epsilon_of(value: Any) -> float:
    """An epsilon as a record holds it. metrics.jsonl is strict JSON, so an infinite epsilon is
    stored as null: no noise (noise_multiplier = 0, clipping only) or so little that the
    accountant's sums overflow (1e-300). Either way there is no guarantee, and it reads as inf."""
    return math.inf if value is None else float(value)


def epsilon_text(value: float, digits: int = 2) -> str:
    return NO_GUARANTEE if math.isinf(value) else f"{value:.{digits}f}"


def privacy_notes(run_dir: Path) -> list[str]:
    """One note per protection used: the largest epsilon per method (and phase) at the end;
    the per-client table is tables/privacy_budget.md (`write_privacy_tables`)."""
    try:
        records, _ = read_run_records(run_dir)
        config = tomllib.loads((Path(run_dir) / "config.toml").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    privacy = config.get("privacy", {})
    notes = []
    for key, (label, table) in KINDS.items():
        spent: dict[str, float] = {}
        for r in records:
            if r.get("type") == "round" and key in r:  # null: infinite (`epsilon_of`)
                name = f"{r.get('method')} ({r['phase']})" if r.get("phase") else str(r.get("method"))
                spent[name] = max(spent.get(name, 0.0), epsilon_of(r[key]))
        if spent:
            delta = privacy.get(table, {}).get("delta", "?")
            if table == "dp_sgd" and privacy.get(table, {}).get("sampling") == "shuffle":
                label += ", approximate (shuffled batches; the accountant assumes Poisson sampling)"
            listed = ", ".join(f"{m}: {epsilon_text(e)}" for m, e in sorted(spent.items()))
            unbounded = (" An infinite epsilon is no privacy guarantee at all: no noise (noise_multiplier = 0, "
                         "clipping only) or too little for the accountant." if math.inf in spent.values() else "")
            notes.append(f"Privacy, {label}: epsilon spent at delta = {delta} (largest over clients and rounds) — "
                         f"{listed}.{unbounded} See docs/privacy.md for "
                         f"what it covers and what it does not.")
    if (note := audit_note(records)) is not None:
        notes.append(note)
    if budget_rows(records, config):
        notes.append("Privacy budget: epsilon spent per client, against target_epsilon, and rounds skipped once it "
                     "was spent: tables/privacy_budget.md.")
    if "secure_aggregation" in privacy:
        threshold = privacy["secure_aggregation"].get("threshold", 2 / 3)
        notes.append(f"Privacy, secure aggregation (SecAgg+): the server received only the weighted sum of each "
                     f"round's updates, never one client's; a round finishes while at least {threshold:.0%} of its "
                     f"clients are left. Evaluation metrics still leave each client in clear (docs/privacy.md).")
    return notes


def write_privacy_tables(run_dir: Path) -> None:
    """tables/privacy_budget.{csv,md} of a run with DP and tables/epsilon_audit.{csv,md} of a run
    with a one-run audit (any study), beside its own tables."""
    from fedcare.report.tables import write_tables

    try:
        records, _ = read_run_records(run_dir)
        config = tomllib.loads((Path(run_dir) / "config.toml").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    tables = {name: t for name, t in ((BUDGET, budget_table(records, config)), (EPSILON_AUDIT, audit_table(records)))
              if t is not None}
    if tables:
        write_tables(tables, Path(run_dir) / "tables")


# -- the budget: epsilon spent per client ----------------------------------------------------
# a record: one client's epsilon over a whole run (fit and every fine-tuning); its `protection`
# is "dp_sgd" or "client_dp", the table of [privacy] it comes from
BUDGET = "privacy_budget"


def budget_rows(records: list[dict], config: dict | None = None) -> list[dict]:
    """Per (method and phase or case, kind, client): epsilon spent, the budget, the rounds it
    was skipped. From "privacy_budget" records where a protocol wrote them; else from the
    rounds' per-client epsilons (DP-SGD: the client's whole ledger after the round, fit and
    fine-tuning; client-level DP: the releases it took part in): whole-run values."""
    privacy = (config or {}).get("privacy", {})
    rows: dict[tuple, dict] = {}
    for r in records:
        if r.get("type") == BUDGET:
            key = (str(r.get("method")), r["protection"], str(r["client"]), r.get("seed"))
            rows[key] = {"method": key[0], "kind": r["protection"], "client": key[2],
                         "epsilon": epsilon_of(r["epsilon"]),
                         "target": r.get("target_epsilon"), "delta": r.get("delta"), "steps": r.get("steps"),
                         "sampling": r.get("sampling"), "skipped": r.get("skipped", 0)}
    if rows:
        return list(rows.values())
    for r in records:
        if r.get("type") != "round":
            continue
        method = f"{r.get('method')} ({r['phase']})" if r.get("phase") else str(r.get("method"))
        for field, kind in ((DP_EPSILON + "_clients", "dp_sgd"), (CLIENT_DP_EPSILON + "_clients", "client_dp")):
            table = privacy.get(kind, {})
            for client, eps in (r.get(field) or {}).items():
                row = rows.setdefault((method, kind, client), {
                    "method": method, "kind": kind, "client": client, "target": table.get("target_epsilon"),
                    "delta": table.get("delta", 1e-5), "steps": None, "skipped": 0,
                    "sampling": table.get("sampling", "poisson") if kind == "dp_sgd" else None})
                row["epsilon"] = max(row.get("epsilon", 0.0), epsilon_of(eps))
        for client in r.get("skipped", []):
            for kind in ("dp_sgd", "client_dp"):
                if (method, kind, client) in rows:
                    rows[(method, kind, client)]["skipped"] += 1
    return list(rows.values())


BUDGET_CAPTION = (
    "Epsilon each client spent at delta, against the budget (privacy.*.target_epsilon; none: no budget was set, "
    "the noise multiplier was given). Sample-level (DP-SGD): every training step of the client, fit and "
    "fine-tuning, composed by the accountant; 'approximate' when batches were shuffled (the accountant assumes "
    "Poisson sampling). Client-level DP: the releases the client took part in (sampling rate 1, no amplification). "
    "Skipped: the client's rounds left out because one more would have crossed the budget. docs/privacy.md."
)


def budget_table(records: list[dict], config: dict | None = None) -> Table | None:
    """The per-client budget table (None without DP); the clients of a method that all spent
    the same, over the same steps and skipped rounds, share one row ("all 6")."""
    rows = budget_rows(records, config)
    if not rows:
        return None
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["kind"]), []).append(r)
    columns = ["Method", "level", "client", "epsilon spent", "budget", "delta", "steps", "rounds skipped"]
    display, csv_rows = [], []
    for group in groups.values():
        same = len(group) > 1 and len({(round(r["epsilon"], 6), r["steps"], r["skipped"]) for r in group}) == 1
        for r in group[:1] if same else group:
            client = f"all {len(group)}" if same else r["client"]
            level = "client-level DP" if r["kind"] == "client_dp" else (
                "DP-SGD" + (" (approximate: shuffled)" if r.get("sampling") == "shuffle" else ""))
            display.append([r["method"], level, client, epsilon_text(r["epsilon"]),
                            "none" if r["target"] is None else f"{r['target']:g}",
                            f"{r['delta']:g}" if r.get("delta") is not None else "?",
                            "" if r["steps"] is None else str(r["steps"]), str(r["skipped"])])
        for r in group:  # the CSV keeps every client
            csv_rows.append([r["method"], r["kind"], r.get("sampling"), r["client"], r["epsilon"], r["target"],
                             r.get("delta"), r["steps"], r["skipped"]])
    return Table(BUDGET, "Privacy budget: epsilon spent per client", BUDGET_CAPTION, columns, display,
                 ["method", "kind", "sampling", "client", "epsilon", "target_epsilon", "delta", "steps",
                  "rounds_skipped"], csv_rows)


# -- the membership audit ([privacy.audit]): "membership" records --------------------------
MEMBERSHIP_VIEWS = ("own", "peer", "server")
VIEW_LABELS = {"own": "own (device breach)", "peer": "peer client", "server": "server (shared tensors)"}


def membership_rows(records: list[dict]) -> list[dict]:
    """Per (method, view), in the order methods first appear: the mean attack AUC over the
    audited (subject, seed) records with its standard error across them, the mean Hanley-McNeil
    SE of one subject's AUC, the mean TPR at FPR 1%, members and non-members per subject, and
    the largest DP-SGD epsilon the method spent (None without DP-SGD)."""
    audited = [r for r in records if r.get("type") == "membership"]
    methods = list(dict.fromkeys(r["method"] for r in audited))
    eps: dict[str, float] = {}
    for r in records:
        if r.get("type") == "round" and DP_EPSILON in r:
            eps[r["method"]] = max(eps.get(r["method"], 0.0), epsilon_of(r[DP_EPSILON]))
    rows = []
    for method in methods:
        for view in MEMBERSHIP_VIEWS:
            rs = [r for r in audited if r["method"] == method and r["view"] == view]
            if not rs:
                rows.append({"method": method, "view": view, "n": 0, "epsilon": eps.get(method)})
                continue
            auc = np.array([r["auc"] for r in rs], dtype=float)
            rows.append({
                "method": method, "view": view, "n": len(rs), "epsilon": eps.get(method),
                "auc": float(auc.mean()), "auc_sem": float(auc.std(ddof=1) / np.sqrt(len(auc))) if len(auc) > 1 else math.nan,
                "auc_se": float(np.mean([r["auc_se"] for r in rs])),
                "tpr_at_1pct_fpr": float(np.mean([r["tpr_at_1pct_fpr"] for r in rs])),
                "members": float(np.mean([r["members"] for r in rs])),
                "non_members": float(np.mean([r["non_members"] for r in rs])),
            })
    return rows


MEMBERSHIP_CAPTION = (
    "The loss attack (Yeom et al. 2018; fedcare.privacy.audit) calls a frame a member when the model's loss on it "
    "is low: a lower bound on what an attacker can learn (a likelihood-ratio attack with shadow models, LiRA, is "
    "stronger: the privacy audit study runs it), never a proof of privacy. AUC 0.5 = the attacker guesses. "
    "Per subject: "
    "members = distinct items of its last balanced training set; non-members = items of the same sessions whose "
    "frame it never trained on, as many as members per (session, label). AUC: mean over subjects and seeds ± its "
    "standard error across them; 'SE per subject': the mean Hanley-McNeil SE of one subject's AUC. TPR at FPR 1% "
    "is the TPR at no false positive when a subject has under 100 non-members. Views: own = the subject's "
    "personal model; peer = the next subject's model; server = the shared tensors, a split model's private part "
    "fitted by the server on the pretraining subjects' frames; n/a = the server receives nothing (local "
    "training) or holds no frames to fit a head on. epsilon: the largest DP-SGD epsilon spent (inf: no DP-SGD, or "
    "DP-SGD without noise: no guarantee). "
    "The data are synthetic; see docs/privacy.md."
)


def membership_table(records: list[dict], caption: str | None = None) -> Table | None:
    """The audit's table (None when the run has no membership record); `caption`: a study's
    own (members, non-members, views) instead of the pain study's."""
    rows = membership_rows(records)
    if not rows:
        return None
    columns = ["Method", "view", "epsilon (DP-SGD)", "subjects x seeds", "AUC", "SE per subject", "TPR at FPR 1%",
               "members", "non-members"]
    display, csv_rows = [], []
    for r in rows:
        eps = "inf" if r["epsilon"] is None or math.isinf(r["epsilon"]) else f"{r['epsilon']:.1f}"
        if not r["n"]:
            display.append([r["method"], VIEW_LABELS[r["view"]], eps, "0", "n/a", "", "", "", ""])
        else:
            sem = "" if math.isnan(r["auc_sem"]) else f" ± {r['auc_sem']:.3f}"
            display.append([r["method"], VIEW_LABELS[r["view"]], eps, str(r["n"]), f"{r['auc']:.3f}{sem}",
                            f"{r['auc_se']:.3f}", f"{r['tpr_at_1pct_fpr']:.3f}", f"{r['members']:.0f}",
                            f"{r['non_members']:.0f}"])
        csv_rows.append([r["method"], r["view"], r["epsilon"], r["n"], r.get("auc"), r.get("auc_sem"),
                         r.get("auc_se"), r.get("tpr_at_1pct_fpr"), r.get("members"), r.get("non_members")])
    return Table("membership", "Membership inference (loss attack) per method and view", caption or MEMBERSHIP_CAPTION,
                 columns, display,
                 ["method", "view", "dp_epsilon", "records", "auc", "auc_sem", "auc_se_per_subject",
                  "tpr_at_1pct_fpr", "members", "non_members"], csv_rows)


def membership_plot(records: list[dict]) -> bytes | None:
    """Attack AUC per method (groups) and view (bars) with the standard error across subjects
    and seeds; the dashed line is a coin's 0.5."""
    from matplotlib.figure import Figure

    from fedcare.report.plots import WIDE, figure_png, legend_right

    rows = membership_rows(records)
    if not rows:
        return None
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig = Figure(figsize=WIDE, layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / len(MEMBERSHIP_VIEWS)
    for i, view in enumerate(MEMBERSHIP_VIEWS):
        got = {r["method"]: r for r in rows if r["view"] == view and r["n"]}
        xs = [j - 0.4 + width * (i + 0.5) for j, m in enumerate(methods) if m in got]
        ys = [got[m]["auc"] for m in methods if m in got]
        err = [0.0 if math.isnan(got[m]["auc_sem"]) else got[m]["auc_sem"] for m in methods if m in got]
        ax.bar(xs, ys, width, yerr=err, capsize=3, label=VIEW_LABELS[view])
    ax.axhline(0.5, color="0.3", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(methods)), methods)
    ax.set_ylim(0, 1)
    ax.set_ylabel("attack AUC")
    ax.set_title("Membership inference (loss attack): AUC per method and view, mean ± SE over subjects and seeds",
                 fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    legend_right(ax, len(MEMBERSHIP_VIEWS))
    return figure_png(fig)


# -- the one-run audits ([privacy.audit] canaries, canary_clients): epsilon-hat beside epsilon ----
# a record a protocol may write itself (the privacy audit study); other studies' rows come from
# their rounds' info (`dp_audit`, `client_dp_audit_*`), the last round of each federation
EPSILON_AUDIT = "epsilon_audit"
LEVELS = {"dp_sgd": "example (gradient canaries)", "client_dp": "client (canary clients)"}


def audit_rows(records: list[dict]) -> list[dict]:
    """Per (method and phase, seed, level, client or "pooled"): the accountant's epsilon, the
    audit's epsilon-hat (and the client-level estimate), m, r, v, confidence and whether
    epsilon-hat <= epsilon. From "epsilon_audit" records where a protocol wrote them; else from
    the last round of each (method, phase, seed) that carried an audit."""
    explicit = [dict(r) for r in records if r.get("type") == EPSILON_AUDIT]
    if explicit:
        return explicit
    last: dict[tuple, dict] = {}
    for r in records:
        if r.get("type") == "round" and (DP_AUDIT in r or CLIENT_AUDIT + "epsilon_hat" in r):
            method = f"{r.get('method')} ({r['phase']})" if r.get("phase") else str(r.get("method"))
            last[(method, r.get("seed"))] = r
    rows = []
    for (method, seed), r in last.items():
        point = {"method": method, "seed": seed, "round": r.get("round")}
        if DP_AUDIT in r:
            for client, result in [("pooled", r[DP_AUDIT]["pooled"]), *sorted(r[DP_AUDIT]["clients"].items())]:
                rows.append({**point, "level": "dp_sgd", "client": client, "estimate": None, **result})
        if CLIENT_AUDIT + "epsilon_hat" in r:
            got = {k.removeprefix(CLIENT_AUDIT): r[k] for k in r if k.startswith(CLIENT_AUDIT)}
            eps = r.get(CLIENT_DP_EPSILON)
            rows.append({**point, "level": "client_dp", "client": "pooled", "epsilon": eps,
                         "epsilon_hat": got["epsilon_hat"], "estimate": got.get("estimate"), "m": int(got["m"]),
                         "r": int(got["r"]), "v": int(got["v"]), "confidence": got["confidence"],
                         "p_value": got.get("p_value")})
    return rows


def audited(records: list[dict]) -> list[dict]:
    """`audit_rows` with `sound`: whether the row's accountant claim stands when every claim of
    the run is tested at once (`fedcare.privacy.one_run.contradicted`, Bonferroni at the audits'
    confidence)."""
    rows = audit_rows(records)
    if not rows:
        return rows
    confidence = rows[0].get("confidence") or 0.95
    wrong = contradicted([_claim_p(r) for r in rows], confidence)
    return [{**r, "sound": not w, "claims": sum(_claim_p(x) is not None for x in rows)} for r, w in zip(rows, wrong)]


def _claim_p(row: dict) -> float | None:
    p = row.get("p_value")
    return None if p is None or (isinstance(p, float) and math.isnan(p)) else float(p)


def audit_verdict(records: list[dict]) -> dict | None:
    """run.json's `privacy_audit`: whether every epsilon-hat is within its accountant's epsilon
    (None when the run has no one-run audit); the contradictions, named."""
    rows = audited(records)
    if not rows:
        return None
    wrong = [f"{r['method']}, {LEVELS.get(r['level'], r['level'])}, client {r['client']}: epsilon-hat "
             f"{r['epsilon_hat']:.2f} > epsilon {r['epsilon']:.2f} (p = {r['p_value']:.1e})" for r in rows
             if not r["sound"]]
    return {"sound": not wrong, "claims_tested": rows[0]["claims"], "confidence": rows[0].get("confidence"),
            "unsound": wrong}


AUDIT_CAPTION = (
    "The one-run audit (Steinke, Nasr & Jagielski 2023): m canaries, each in the run with probability 1/2 from a "
    "seed the auditor keeps; the auditor guesses in or out for the r canaries it is surest of, v correctly; "
    "epsilon-hat is the lower bound on epsilon those guesses prove at the stated confidence and delta. It never "
    "proves privacy: a loose epsilon-hat says the canaries were not found, not that nothing leaks. epsilon-hat above "
    "the accountant's epsilon means the implementation or the accounting is wrong, or chance: sound = no when the "
    "accountant's claim falls with every row's claim tested at once (Bonferroni at the stated confidence, so an "
    "honest run is called unsound with at most that probability; one row's epsilon-hat a little above its epsilon "
    "can be chance among many rows). Example level: "
    "gradient canaries in each client's training, scored on the model the client holds; pooled: every audited "
    "client's canaries together against the largest epsilon. Client level: canary clients at the server; estimate: "
    "Andrew et al. 2024's estimate from the same canaries (not a bound). Last round of each federation. "
    "docs/privacy.md."
)


def audit_table(records: list[dict]) -> Table | None:
    rows = audited(records)
    if not rows:
        return None

    def num(v: Any, digits: int = 2) -> str:
        if v is None:
            return "inf"
        return "inf" if math.isinf(float(v)) else f"{float(v):.{digits}f}"

    seeds = len({r.get("seed") for r in rows}) > 1
    columns = ["Method", *(["seed"] if seeds else []), "level", "client", "epsilon (accountant)", "epsilon-hat",
               "estimate", "m", "r", "v", "sound"]
    display = [[r["method"], *([str(r.get("seed"))] if seeds else []), LEVELS.get(r["level"], r["level"]),
                str(r["client"]), num(r["epsilon"]), num(r["epsilon_hat"]),
                "" if r.get("estimate") is None else num(r["estimate"]), str(r["m"]), str(r["r"]), str(r["v"]),
                "yes" if r["sound"] else "NO"] for r in rows]
    header = ["method", "seed", "level", "client", "epsilon", "epsilon_hat", "estimate", "m", "r", "v", "confidence",
              "delta", "claim_p_value", "sound"]
    csv_rows = [[r["method"], r.get("seed"), r["level"], r["client"], r["epsilon"], r["epsilon_hat"], r.get("estimate"),
                 r["m"], r["r"], r["v"], r.get("confidence"), r.get("delta"), _claim_p(r), r["sound"]] for r in rows]
    return Table(EPSILON_AUDIT, "Privacy audit: the accountant's epsilon and the one-run audit's epsilon-hat",
                 AUDIT_CAPTION, columns, display, header, csv_rows)


def audit_note(records: list[dict]) -> str | None:
    """The report's note: each federation's pooled epsilon-hat beside its epsilon."""
    rows = [r for r in audit_rows(records) if r["client"] == "pooled"]
    if not rows:
        return None

    def eps(v: float | None) -> str:
        return "inf" if v is None or math.isinf(v) else f"{v:.2f}"

    listed = "; ".join(f"{r['method']} ({LEVELS.get(r['level'], r['level'])}): epsilon-hat {r['epsilon_hat']:.2f} vs "
                       f"epsilon {eps(r['epsilon'])}" for r in rows)
    return (f"Privacy audit (one run, {rows[0].get('confidence', 0.95):.0%} confidence): {listed}. epsilon-hat is a "
            f"lower bound the run itself proves, epsilon what the accountant claims; per client: "
            f"tables/{EPSILON_AUDIT}.md.")


def audit_closing_note(records: list[dict]) -> str | None:
    """One paragraph on a run's one-run audits: whether every DP row (pooled and per client) has
    epsilon-hat within epsilon, the closest of them, what the rows without DP found, and the
    verdict (None without an audit)."""
    rows = audited(records)
    if not rows:
        return None
    claimed = [r for r in rows if r["epsilon"] is not None and not math.isinf(r["epsilon"])]
    plain = [r["epsilon_hat"] for r in rows if r not in claimed and r["client"] == "pooled"]
    parts = []
    if claimed:
        within = sum(r["epsilon_hat"] <= r["epsilon"] for r in claimed)
        closest = max(claimed, key=lambda r: r["epsilon_hat"] / r["epsilon"])
        parts.append(f"{within} of {len(claimed)} rows with an accountant's epsilon have epsilon-hat <= epsilon (the "
                     f"closest: {closest['method']}, {LEVELS.get(closest['level'], closest['level'])}, client "
                     f"{closest['client']}: {closest['epsilon_hat']:.2f} against {closest['epsilon']:.2f})")
    if plain:
        parts.append(f"without DP, epsilon-hat {min(plain):.2f} to {max(plain):.2f} pooled, what the canaries prove "
                     f"at least (no accountant to compare with)")
    wrong = [r for r in rows if not r["sound"]]
    verdict = ("Sound: every accountant's claim stands" if not wrong else
               f"UNSOUND: {len(wrong)} claim(s) fall, the implementation or the accounting is wrong")
    return (f"Privacy audit (one run, {rows[0].get('confidence') or 0.95:.0%} confidence): " + "; ".join(parts)
            + f". {verdict} ({rows[0]['claims']} claims tested at once). epsilon-hat is a lower bound, never a "
              f"proof of privacy; docs/privacy.md.")


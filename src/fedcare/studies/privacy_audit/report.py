"""The privacy audit's report, from metrics.jsonl and run.json alone:

    tables/privacy_audit.{csv,md}       per case (method x privacy level): epsilon, accuracy,
                                        the loss attack's AUC and TPR at FPR 1% and 0.1% from a
                                        peer's and the client's own model, means over the clients
    tables/privacy_lira.{csv,md}        the same for offline LiRA (when shadow models ran)
    tables/privacy_inversion.{csv,md}   per inversion case: tensors observed, PSNR, SSIM
    plots/membership_auc.png            the attack's AUC per case, peer and own
    plots/inversion.png                 the true frames and each case's reconstructions
    report.html

Epsilon is null in the records without DP-SGD (no bound) and "inf" in the tables."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedcare.errors import InputError
from fedcare.report import write_report
from fedcare.report.html import render_run_page, table_block
from fedcare.report.tables import Table
from fedcare.studies.privacy_audit.protocol import AUDIT, FRAMES, INVERSION
from fedcare.studies.rundir import METRICS_FILE, read_run_records

AUDIT_COLUMNS = ["privacy", "method", "epsilon", "accuracy", "peer_auc", "peer_tpr_1pct", "peer_tpr_01pct",
                 "own_auc", "own_tpr_1pct", "own_tpr_01pct"]
LIRA_COLUMNS = ["privacy", "method", "epsilon", "peer_lira_auc", "peer_lira_tpr_1pct", "peer_lira_tpr_01pct",
                "own_lira_auc", "own_lira_tpr_1pct", "own_lira_tpr_01pct"]
RMIA_COLUMNS = ["privacy", "method", "epsilon", "peer_rmia_auc", "peer_rmia_tpr_1pct", "peer_rmia_tpr_01pct",
                "own_rmia_auc", "own_rmia_tpr_1pct", "own_rmia_tpr_01pct"]
INVERSION_COLUMNS = ["case", "observed_tensors", "psnr", "ssim"]
KNOWN_FACTS = [
    ("study", "Study"), ("config_file", "Config file"), ("seeds", "Seeds"), ("methods", "Methods"),
    ("clients", "Clients"), ("members", "Members per client"), ("non_members", "Non-members per client"),
    ("rounds", "Rounds"), ("started", "Started"), ("finished", "Finished"), ("training_seconds", "Training time (s)"),
    ("status", "Status"), ("fedcare_version", "fedcare version"),
]
PLOT_CAPTIONS = {
    "membership_auc": "The loss attack's AUC per case, from a peer's model and from the client's own, mean over "
                      "the clients; the dashed line is a coin (0.5)",
    "inversion": "Top row: the true frames; below, what the attacker reconstructs from each observed update",
}


def _records(run_dir: Path) -> tuple[list[dict], list[dict], list[dict], list[dict], list[dict]]:
    """(audit, inversion, inversion_frames, privacy_budget, epsilon_audit) records; ValueError
    when there is neither audit nor inversion."""
    from fedcare.privacy.report import BUDGET, EPSILON_AUDIT

    records, _ = read_run_records(run_dir)
    audit, inversion, frames, budget, epsilon_audit = ([r for r in records if r.get("type") == kind]
                                                       for kind in (AUDIT, INVERSION, FRAMES, BUDGET, EPSILON_AUDIT))
    if not audit and not inversion:
        raise InputError(f"{Path(run_dir) / METRICS_FILE}: no audit or inversion records")
    return audit, inversion, frames, budget, epsilon_audit


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else "n/a" if v is None else str(v)


def _table(name: str, title: str, caption: str, columns: list[str], rows: list[dict]) -> Table:
    """Display cells with 3 decimals, CSV cells raw; a seed column when several seeds ran."""
    if len({r["seed"] for r in rows}) > 1:
        columns = ["seed", *columns]
    values = [[r.get(c) for c in columns] for r in rows]  # .get: records of older runs lack the 0.1% column
    return Table(name, title, caption, columns, [[_fmt(v) for v in row] for row in values], columns, values)


def audit_table(audit: list[dict]) -> Table:
    rows = [{**r, "epsilon": math.inf if r["epsilon"] is None else r["epsilon"]} for r in audit]
    first = audit[0]
    fedbn = ("FedBN under DP-SGD is not run: DP-SGD replaces its BatchNorm by a private GroupNorm, another model. "
             if any(r["method"] == "FedBN" for r in audit) and any(r["epsilon"] is not None for r in audit) else "")
    return _table("privacy_audit", "Membership inference (loss attack) vs DP-SGD, synthetic data",
                  f"Mean over {first['clients']} clients of {first['members']} training (members) and "
                  f"{first['non_members']} held-out (non-members) examples; AUC 0.5 = the attack guesses. {fedbn}"
                  f"{low_fpr_note(first['non_members'])}Synthetic images, not patients.", AUDIT_COLUMNS, rows)


def _attack_table(audit: list[dict], attack: str, name: str, title: str, columns: list[str], describe) -> Table | None:
    """An attack's power per case (the records' `own_<attack>_auc` and the like); None when no
    case ran it. `describe(first record)`: the caption's account of the attack."""
    rows = [{**r, "epsilon": math.inf if r["epsilon"] is None else r["epsilon"]} for r in audit
            if f"own_{attack}_auc" in r]
    if not rows:
        return None
    first = rows[0]
    return _table(name, title, f"{describe(first)}{low_fpr_note(first['non_members'])}Synthetic images, not patients.",
                  columns, rows)


def lira_table(audit: list[dict]) -> Table | None:
    """Offline LiRA's power per case; None when no case ran shadow models."""
    return _attack_table(audit, "lira", "privacy_lira", "Membership inference (offline LiRA) vs DP-SGD, synthetic data",
                         LIRA_COLUMNS, lambda first: (
                             f"Offline LiRA (Carlini et al. 2022) against {first['shadow_models']} shadow federations "
                             f"per case, each trained like the case on every client's public pool (never a member); "
                             f"mean over {first['clients']} clients of {first['members']} members and "
                             f"{first['non_members']} non-members. Compare with the loss attack's table: the same "
                             f"models, the same examples. "))


def rmia_table(audit: list[dict]) -> Table | None:
    """RMIA's power per case with one reference model; None when no case ran it."""
    return _attack_table(audit, "rmia", "privacy_rmia",
                         "Membership inference (RMIA, one reference model) vs DP-SGD, synthetic data", RMIA_COLUMNS,
                         lambda first: (
                             f"RMIA (Zarifzadeh, Liu & Shokri 2024), offline, a = 0.3, gamma = 1: the reference model "
                             f"is the first shadow federation's (trained like the case on every client's public pool), "
                             f"the population each client's second public pool (in neither model); mean over "
                             f"{first['clients']} clients of {first['members']} members and {first['non_members']} "
                             f"non-members. Compare with LiRA's table, which uses all {first['shadow_models']} shadow "
                             f"federations. "))


def low_fpr_note(non_members: int) -> str:
    """What a TPR at FPR 1% / 0.1% can mean with this many non-members per client."""
    reads = [f"{rate}%" for rate, n in (("1", 100), ("0.1", 1000)) if non_members < n]
    if not reads:
        return ""
    return (f"With {non_members} non-members per client one false positive is FPR {100 / non_members:.1f}%: the TPR "
            f"at FPR {' and '.join(reads)} is the TPR at no false positive. ")


def inversion_table(inversion: list[dict], frames: list[dict]) -> Table:
    s = frames[0]["settings"] if frames else {}
    seeds = len({r["seed"] for r in inversion})
    return _table("privacy_inversion", "Gradient inversion of one client's update (pain CNN, synthetic faces)",
                  f"Inverting gradients (Geiping et al. 2020), {s.get('steps', '?')} Adam steps, on one FedSGD step "
                  f"of a batch of {s.get('batch', '?')} synthetic {s.get('image_size', '?')}-px frames at the "
                  f"untrained pain CNN; labels known to the attacker. PSNR (dB) and SSIM of the best-matched "
                  f"reconstructions against the true frames (higher = more recovered); the baseline row is a flat "
                  f"image. Picture: plots/inversion.png. Synthetic faces, "
                  f"{'one seed' if seeds == 1 else f'{seeds} seeds'}.", INVERSION_COLUMNS, inversion)


def tables(audit: list[dict], inversion: list[dict], frames: list[dict], budget: list[dict] = (),
           epsilon_audit: list[dict] = ()) -> dict[str, Table]:
    from fedcare.privacy.report import EPSILON_AUDIT, audit_table as epsilon_audit_table, budget_table

    found = {}
    if audit:
        found["privacy_audit"] = audit_table(audit)
        if (lira := lira_table(audit)) is not None:
            found["privacy_lira"] = lira
        if (rmia := rmia_table(audit)) is not None:
            found["privacy_rmia"] = rmia
    if epsilon_audit:
        found[EPSILON_AUDIT] = epsilon_audit_table(list(epsilon_audit))
    if budget and budget_table(list(budget)) is not None:
        found["privacy_budget"] = budget_table(list(budget))
    if inversion:
        found["privacy_inversion"] = inversion_table(inversion, frames)
    return found


# -- plots ----------------------------------------------------------------------------------
def membership_plot(audit: list[dict]) -> bytes:
    """Grouped bars: per case (method, level), the peer's and the own model's attack AUC."""
    from matplotlib.figure import Figure

    from fedcare.report.plots import WIDE, figure_png, legend_right

    seeds = len({r["seed"] for r in audit}) > 1
    labels = [f"{r['method']}\n{r['privacy']}" + (f"\nseed {r['seed']}" if seeds else "") for r in audit]
    fig = Figure(figsize=(max(WIDE[0], 0.9 * len(audit) + 2), WIDE[1]), layout="constrained")
    ax = fig.add_subplot()
    x = np.arange(len(audit), dtype=float)
    for i, (view, name) in enumerate((("peer_auc", "peer's model"), ("own_auc", "own model"))):
        ax.bar(x - 0.2 + 0.4 * i, [r[view] for r in audit], 0.4, label=name)
    ax.axhline(0.5, color="0.3", linestyle="--", linewidth=1)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("attack AUC")
    ax.set_title("Membership inference (loss attack) per method and privacy level, mean over clients", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    legend_right(ax, 2)
    return figure_png(fig)


def inversion_picture(inversion: list[dict], frames: dict) -> bytes:
    """One row per image set (the true frames first), one column per frame of the batch,
    each reconstruction labelled with its PSNR and SSIM."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from fedcare.report.plots import figure_png

    sets = [("true frames (synthetic)", frames["images"])]
    sets += [(f"{r['case']}\nPSNR {r['psnr']:.1f} dB, SSIM {r['ssim']:.2f}", r["images"]) for r in inversion
             if r["seed"] == frames["seed"] and "images" in r]
    batch = len(frames["images"])
    fig = Figure(figsize=(1.9 * batch + 2.6, 1.9 * len(sets)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(sets), batch, squeeze=False)
    for row, (label, images) in enumerate(sets):
        for c in range(batch):
            axes[row][c].imshow(np.asarray(images[c]), cmap="gray", vmin=0, vmax=1)
            axes[row][c].set_xticks([])
            axes[row][c].set_yticks([])
        axes[row][0].set_ylabel(label, rotation=0, ha="right", va="center", fontsize=8)
    fig.suptitle(f"Gradient inversion of one FedSGD step of the pain CNN (seed {frames['seed']})", fontsize=10)
    fig.tight_layout()
    return figure_png(fig)


# -- the page -------------------------------------------------------------------------------
HOW_TO_READ = [
    "<b>Membership inference.</b> The loss attack calls an example a member (a training example) when the model's "
    "loss on it is low. AUC 0.5: the attacker guesses; TPR at FPR 1%: the share of members it names with few false "
    "alarms. <i>peer</i>: another client's model (FedAvg: the global model; PFDL and FedBN: the shared layers with "
    "the peer's own private ones; local: a model that never saw the victim); <i>own</i>: the victim's own model, "
    "what a breach of its device exposes. The loss attack is the weakest standard attack: a low AUC is a lower "
    "bound on leakage, not a proof of privacy.",
    "<b>LiRA.</b> The likelihood-ratio attack (offline form) compares the model's confidence on each example with "
    "how confident shadow models trained the same way without it are: a hard example the model is sure of gives it "
    "away even when its loss is not the lowest. Stronger than the loss attack, above all at low FPR; still a lower "
    "bound on leakage.",
    "<b>RMIA.</b> The robust membership inference attack (Zarifzadeh et al. 2024) divides the model's probability "
    "of each example by what one reference model (the first shadow federation) gives it, and ranks it against "
    "population examples neither model trained on: strong at low FPR with a single reference model.",
    "<b>epsilon-hat.</b> The one-run audit's lower bound on epsilon at 95% confidence, from canaries inserted in "
    "one training run of each case (gradient canaries for DP-SGD, canary clients for client-level DP): what the "
    "run itself proves it leaks at least, beside what the accountant claims at most (epsilon). epsilon-hat above "
    "epsilon would mean a broken implementation or accounting; a small epsilon-hat is not a proof of privacy.",
    "<b>epsilon.</b> DP-SGD's sample-level guarantee at the experiment's delta over the whole case (every fit and "
    "fine-tuning, Poisson-sampled batches), the largest over the clients, each client's in the budget table; inf: "
    "no DP-SGD, no bound.",
    "<b>Gradient inversion.</b> What an honest-but-curious server rebuilds from one client's FedSGD step: above the "
    "flat-image baseline the faces show; at or below it nothing was recovered. A failed attack is a lower bound "
    "on leakage, not a proof of privacy.",
    "docs/privacy.md explains each number and its limits. The data are synthetic.",
]


def render_page(run_info: Mapping[str, Any], tables_: Mapping[str, Table], plots: Mapping[str, bytes],
                run_dir_name: str, notes: Sequence[str]) -> str:
    sections = [("how", "How to read", "How to read this", "<ul>" + "".join(f"<li>{i}</li>" for i in HOW_TO_READ)
                 + "</ul>")]
    if "privacy_audit" in tables_:
        sections.append(("membership", "Membership inference", "Membership inference vs DP-SGD",
                         table_block(tables_["privacy_audit"])
                         + "".join(table_block(tables_[t]) for t in ("privacy_lira", "privacy_rmia") if t in tables_)))
    if "epsilon_audit" in tables_:
        sections.append(("epsilon-audit", "Audit of epsilon", "The accountant's epsilon and the audit's epsilon-hat",
                         table_block(tables_["epsilon_audit"])))
    if "privacy_budget" in tables_:
        sections.append(("budget", "Privacy budget", "Privacy budget: epsilon spent per client",
                         table_block(tables_["privacy_budget"])))
    if "privacy_inversion" in tables_:
        sections.append(("inversion", "Gradient inversion", "Gradient inversion",
                         table_block(tables_["privacy_inversion"])))
    return render_run_page(run_info, run_dir_name=run_dir_name, known_facts=KNOWN_FACTS, notes=notes,
                           sections=sections, plots=plots, captions=PLOT_CAPTIONS)


def build_report(run_dir: Path, run_info: Mapping[str, Any] | None = None, notes: Sequence[str] = ()) -> Path:
    """Write the tables, plots and report.html of a privacy audit run; returns report.html's path."""
    run_dir = Path(run_dir)
    run_info = dict(run_info or {})
    audit, inversion, frames, budget, epsilon_audit = _records(run_dir)
    found = tables(audit, inversion, frames, budget, epsilon_audit)
    plots = {}
    if audit:
        plots["membership_auc"] = membership_plot(audit)
    if frames:
        plots["inversion"] = inversion_picture(inversion, frames[0])
    page = render_page(run_info, found, plots, str(run_info.get("run_dir") or run_dir.name), notes)
    return write_report(run_dir, found, plots, page)


def summary_markdown(run_dir: Path) -> str:
    """The tables in Markdown (printed after a run), and the one-run audit's closing note."""
    from fedcare.privacy.report import audit_closing_note

    found = tables(*_records(Path(run_dir)))
    note = audit_closing_note(read_run_records(run_dir)[0])
    return "\n".join([*(t.markdown() for t in found.values()), *([f"\n{note}\n"] if note else [])])

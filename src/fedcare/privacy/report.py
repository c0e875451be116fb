"""What a run's report says about its privacy: the epsilon each method spent, from the
`round` records of metrics.jsonl (`dp_epsilon`: DP-SGD, the largest over the clients;
`client_dp_epsilon`: client-level DP) and the deltas in config.toml, and whether secure
aggregation hid the individual updates. Shared by every study's
report as notes at the top of the page."""

from __future__ import annotations

import tomllib
from pathlib import Path

from fedcare.algorithms.base import DP_EPSILON
from fedcare.privacy.client_dp import CLIENT_DP_EPSILON
from fedcare.studies.rundir import read_run_records

KINDS = {DP_EPSILON: ("DP-SGD (sample-level)", "dp_sgd"), CLIENT_DP_EPSILON: ("client-level DP", "client_dp")}


def privacy_notes(run_dir: Path) -> list[str]:
    """One note per protection used: the largest epsilon per method (and phase) at the end."""
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
            if r.get("type") == "round" and r.get(key) is not None:
                name = f"{r.get('method')} ({r['phase']})" if r.get("phase") else str(r.get("method"))
                spent[name] = max(spent.get(name, 0.0), float(r[key]))
        if spent:
            delta = privacy.get(table, {}).get("delta", "?")
            listed = ", ".join(f"{m}: {e:.2f}" for m, e in sorted(spent.items()))
            notes.append(f"Privacy, {label}: epsilon spent at delta = {delta} (largest over clients and rounds) — "
                         f"{listed}. See docs/privacy.md for "
                         f"what it covers and what it does not.")
    if "secure_aggregation" in privacy:
        threshold = privacy["secure_aggregation"].get("threshold", 2 / 3)
        notes.append(f"Privacy, secure aggregation (SecAgg+): the server received only the weighted sum of each "
                     f"round's updates, never one client's; a round finishes while at least {threshold:.0%} of its "
                     f"clients are left. Evaluation metrics still leave each client in clear (docs/privacy.md).")
    return notes

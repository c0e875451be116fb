"""From a surgical run's records to the thesis's scores (§4.2, §5.3): pure functions, no plots.

Scores of one round (`round_views`), per *view*, a row of the thesis's tables:

| view | local score of client c (Table A.1 column c) | global score (Table A.2) |
|---|---|---|
| FL method with a global model (FedAvg, FedProx, FedDyn, FedDG), CENT | the model on c's test set | the model on the union of all test sets: tp/fp/fn summed over the clients, then F1 |
| FedRep | c's own model (shared body + own head) on c's test set | WAVG of the local scores |
| ALTV (LOT) | c's local model on the union of all test sets (summed counts) | WAVG over clients |
| EGOV (LOT) | c's local model on c's own test set | WAVG over clients |

WAVG weights a client by its training frames (the thesis's "relative data amount", the same
c_k = n_k / n as the aggregation). A score is per tool (F1) and macro (the unweighted mean of
the 6 tools' F1). F1 of counts is 2 tp / (2 tp + fp + fn), 0 when a tool is neither present
nor predicted (scikit-learn's zero_division = 0, as the clients compute it): HEI2's test set
without Suction-Irrigation counts 0 for that tool, as in the thesis.

Several seeds: every number is the mean over seeds of the per-seed number.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedcare.errors import InputError
from fedcare.evaluation.statistics import as_float, nanmean

ALTV, EGOV = "ALTV", "EGOV"
PERSONAL = ("fedrep", "fedrep-uniform")  # each client scores its own model: no global model
LABELS = {"fedavg": "FedAvg", "fedprox": "FedProx", "feddyn": "FedDyn", "feddg": "FedDG", "fedrep": "FedRep",
          "cent": "CENT", "lot": "LOT"}


def label(view: str) -> str:
    """The thesis's name of a view ("fedavg-uniform" -> "FedAvg (uniform)")."""
    if view.endswith("-uniform"):
        return f"{LABELS.get(view[:-8], view[:-8])} (uniform)"
    return LABELS.get(view, view)


def f1_of(tp: float, fp: float, fn: float) -> float:
    """F1 from counts; 0 when the tool is neither present nor predicted; NaN if a count is missing."""
    if any(math.isnan(v) for v in (tp, fp, fn)):
        return math.nan
    denominator = 2 * tp + fp + fn
    return 2 * tp / denominator if denominator > 0 else 0.0


@dataclass
class Score:
    """Per-tool F1 and their macro mean."""

    tools: dict[str, float]

    @property
    def macro(self) -> float:
        values = list(self.tools.values())
        return float(np.mean(values)) if values and not any(math.isnan(v) for v in values) else math.nan


def pooled_score(records: Iterable[Mapping[str, Any]], tools: Sequence[str]) -> Score:
    """F1 on the union of the records' test sets: tp, fp, fn summed over the records."""
    records = list(records)
    out = {}
    for t in tools:
        tp, fp, fn = (sum(as_float(r.get(f"{k}/{t}")) for r in records) if records else math.nan
                      for k in ("tp", "fp", "fn"))
        out[t] = f1_of(tp, fp, fn)
    return Score(out)


def own_score(record: Mapping[str, Any], tools: Sequence[str]) -> Score:
    """The scores one client computed on its own test set."""
    return Score({t: as_float(record.get(f"f1/{t}")) for t in tools})


def wavg_score(scores: Mapping[str, Score], weights: Mapping[str, float], tools: Sequence[str]) -> Score:
    """Per tool, the clients' F1 weighted by `weights` (training frames)."""
    clients = sorted(scores)
    total = sum(weights[c] for c in clients)
    return Score({t: sum(weights[c] * scores[c].tools[t] for c in clients) / total if total else math.nan
                  for t in tools})


@dataclass
class View:
    """One view (table row) at one round: local score per client and the global score."""

    local: dict[str, Score]
    glob: Score


@dataclass
class Run:
    """A surgical run's records, indexed."""

    clients: list[str]  # table column order
    tools: list[str]
    train_frames: dict[str, float]
    methods: list[str]  # in the order the run went through them
    seeds: list[Any]
    # (method, seed, round, model or None) -> {client: client_eval record}
    evals: dict[tuple, dict[str, dict]] = field(default_factory=dict)
    rounds: list[dict] = field(default_factory=list)  # the "round" records
    updates: list[dict] = field(default_factory=list)  # the "client_update" records


def index_run(records: Sequence[Mapping[str, Any]], source: str = "metrics.jsonl") -> Run:
    """Index the records; the client table comes from the "clients" record (written first)."""
    info = next((r for r in records if r.get("type") == "clients"), None)
    if info is None:
        raise InputError(f"{source}: no 'clients' record (not a surgical run, or it stopped before it started)")
    sizes = info["clients"]
    clients = list(sizes)
    run = Run(clients=clients, tools=list(info["tools"]),
              train_frames={c: float(sizes[c]["train"]) for c in clients}, methods=[], seeds=[])
    for r in records:
        kind = r.get("type")
        if kind == "client_eval" and "round" in r:
            method = str(r["method"])
            if method not in run.methods:
                run.methods.append(method)
            if r["seed"] not in run.seeds:
                run.seeds.append(r["seed"])
            key = (method, r["seed"], int(r["round"]), r.get("model"))
            run.evals.setdefault(key, {})[str(r["client"])] = dict(r)
        elif kind == "round":
            run.rounds.append(dict(r))
        elif kind == "client_update":
            run.updates.append(dict(r))
    return run


def rounds_of(run: Run, method: str) -> list[int]:
    return sorted({k[2] for k in run.evals if k[0] == method})


def complete_rounds(run: Run, method: str, seed: Any) -> list[int]:
    """Rounds at which every client scored (for LOT: every client's model at every client)."""
    out = []
    for rnd in sorted({k[2] for k in run.evals if k[0] == method and k[1] == seed}):
        if method == "lot":
            ok = all(set(run.evals.get((method, seed, rnd, k), {})) >= set(run.clients) for k in run.clients)
        else:
            ok = set(run.evals.get((method, seed, rnd, None), {})) >= set(run.clients)
        if ok:
            out.append(rnd)
    return out


def views_at(run: Run, method: str, seed: Any, rnd: int) -> dict[str, View]:
    """The views a method gives at one round: {"ALTV": ..., "EGOV": ...} for LOT, {method: ...} otherwise."""
    tools, clients, w = run.tools, run.clients, run.train_frames
    if method == "lot":
        altv = {k: pooled_score(run.evals[(method, seed, rnd, k)].values(), tools) for k in clients}
        egov = {k: own_score(run.evals[(method, seed, rnd, k)][k], tools) for k in clients}
        return {ALTV: View(altv, wavg_score(altv, w, tools)), EGOV: View(egov, wavg_score(egov, w, tools))}
    records = run.evals[(method, seed, rnd, None)]
    local = {c: own_score(records[c], tools) for c in clients}
    glob = wavg_score(local, w, tools) if method in PERSONAL else pooled_score((records[c] for c in clients), tools)
    return {method: View(local, glob)}


def _mean_scores(scores: Sequence[Score], tools: Sequence[str]) -> Score:
    return Score({t: nanmean(s.tools[t] for s in scores) for t in tools})


def seed_mean_views(run: Run, method: str, rnd: int | None = None) -> dict[str, View]:
    """The views at round `rnd` (default: each seed's last complete round), mean over seeds."""
    per_seed = []
    for seed in run.seeds:
        done = complete_rounds(run, method, seed)
        if not done:
            continue
        at = rnd if rnd is not None else done[-1]
        if at in done:
            per_seed.append(views_at(run, method, seed, at))
    if not per_seed:
        return {}
    out = {}
    for name in per_seed[0]:
        local = {c: _mean_scores([v[name].local[c] for v in per_seed], run.tools) for c in run.clients}
        out[name] = View(local, _mean_scores([v[name].glob for v in per_seed], run.tools))
    return out


def final_views(run: Run) -> dict[str, View]:
    """Every view at its last round, in table order: ALTV, EGOV, the FL methods, CENT."""
    views: dict[str, View] = {}
    if "lot" in run.methods:
        views.update(seed_mean_views(run, "lot"))
    for method in run.methods:
        if method not in ("lot", "cent"):
            views.update(seed_mean_views(run, method))
    if "cent" in run.methods:
        views.update(seed_mean_views(run, "cent"))
    return views


def curves(run: Run) -> dict[str, dict[int, View]]:
    """Every view at every round (mean over the seeds that have it)."""
    out: dict[str, dict[int, View]] = defaultdict(dict)
    for method in run.methods:
        for rnd in rounds_of(run, method):
            for name, view in seed_mean_views(run, method, rnd).items():
                out[name][rnd] = view
    order = [n for n in (ALTV, EGOV) if n in out] + [n for n in out if n not in (ALTV, EGOV, "cent")]
    return {n: out[n] for n in order + (["cent"] if "cent" in out else [])}


def update_curves(run: Run, what: str) -> dict[str, dict[int, float]]:
    """WAVG over clients (training frames) of "cossim" or "graddiff" per FL method and round
    (NaN values skipped), mean over seeds."""
    acc: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for r in run.updates:
        acc[(r["method"], r["seed"], int(r["round"]))].append((as_float(r.get(what)), as_float(r.get("n"))))
    per: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (method, _, rnd), values in acc.items():
        keep = [(v, n) for v, n in values if not math.isnan(v) and not math.isnan(n)]
        total = sum(n for _, n in keep)
        if total:
            per[method][rnd].append(sum(v * n for v, n in keep) / total)
    return {m: {rnd: float(np.mean(v)) for rnd, v in sorted(d.items())} for m, d in per.items()}


def client_update_curves(run: Run, method: str, what: str) -> dict[str, dict[int, float]]:
    """Per client, "cossim" or "graddiff" of one method per round (mean over seeds)."""
    per: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in run.updates:
        if r["method"] == method:
            per[str(r["client"])][int(r["round"])].append(as_float(r.get(what)))
    return {c: {rnd: nanmean(v) for rnd, v in sorted(per[c].items())} for c in run.clients if c in per}


def loss_curves(run: Run) -> dict[str, dict[int, float]]:
    """Mean training loss per method and round (LOT: weighted by the models' training frames),
    mean over seeds."""
    acc: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for r in run.rounds:
        acc[(r["method"], r["seed"], int(r["round"]))].append((as_float(r.get("train_loss")), as_float(r.get("n_train"))))
    per: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (method, _, rnd), values in acc.items():
        total = sum(n for _, n in values)
        per[method][rnd].append(sum(v * n for v, n in values) / total if total else math.nan)
    return {m: {rnd: nanmean(v) for rnd, v in sorted(d.items())} for m, d in per.items()}


def server_curves(run: Run, what: str) -> dict[str, dict[int, float]]:
    """Per FL method and round, "server_step" or "mean_update" of its round records (mean over
    seeds; `fedcare.studies.surgical.updates`). Runs recorded before these existed have none."""
    per: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in run.rounds:
        if what in r:
            per[r["method"]][int(r["round"])].append(as_float(r[what]))
    return {m: {rnd: nanmean(v) for rnd, v in sorted(d.items())} for m, d in per.items()}


def tool_values(view: View, clients: Sequence[str], tools: Sequence[str]) -> list[float]:
    """The final per-client x per-tool F1 values of a view (the Mann-Whitney samples)."""
    return [view.local[c].tools[t] for c in clients for t in tools]

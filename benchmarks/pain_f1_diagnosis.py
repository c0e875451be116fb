"""Why the pain demo's F1 is what it is: a diagnostic of a finished run, not a timing.

Two parts, both on the run's own test records (a Group 2 subject's session with pain):

* **What F1 at 0.5 can reach on these records** (always printed): the example-weighted F1 of
  calling every frame pain, and of a detector that finds exactly the frames of PSPI >= k and
  nothing else, next to each method's F1 from the run's `metrics.jsonl`, and the records' PSPI
  histogram. It says how much of the pain must be found, and at which levels, to beat
  calling everything pain.
* **How visible each PSPI level is** (`--visibility`): BC's model, pretrained again by the
  run's own protocol (`PainProtocol.pretrain`) with the run's thread count (its best held-out
  loss is printed beside the run's `pretrain C` record: they are equal), then the ROC-AUC of
  PSPI k frames against PSPI 0 frames of the test subjects, pooled, within a subject, and
  within a sequence. A level the model separates within a sequence but
  not within a subject is visible, but swamped by how sequences differ.

    python benchmarks/pain_f1_diagnosis.py RUN_DIR [--visibility] [--image-size N --data DIR]

RUN_DIR is a finished pain run (`fedcare demo`, `fedcare run`): its `config.toml`,
`metrics.jsonl` and data (`synthetic-data/` or `data.root`) are read. Numbers are in the
README's "What the pain demo shows".
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from sklearn.metrics import f1_score, roc_auc_score

from fedcare.algorithms.training import ClientData, predict
from fedcare.studies.load import load_config
from fedcare.evaluation.statistics import read_records
from fedcare.studies import registry
from fedcare.studies.pain.cohort import VARIANTS_PER_FRAME
from fedcare.studies.rundir import set_threads
from fedcare.tasks import BINARY


def weighted_f1(predicted: list[np.ndarray], truth: list[np.ndarray], weights: list[int]) -> float:
    """Per-record F1 (0 for a record without a true positive), averaged with `weights`, in percent."""
    scores = [f1_score(y, p, zero_division=0) for p, y in zip(predicted, truth)]
    return 100 * float(np.average(scores, weights=weights))


def reachable_f1(run: Path, cohort, records: list[dict]) -> None:
    tests = [r for r in records if r["type"] == "client_eval" and r["positives"] > 0]
    methods = list(dict.fromkeys(r["method"] for r in tests))
    first = [r for r in tests if r["method"] == methods[0] and r["seed"] == tests[0]["seed"]]  # one seed's records
    pspi = [np.repeat(cohort.sessions[r["client"]][r["session"]].pspi, VARIANTS_PER_FRAME) for r in first]
    for r, p in zip(first, pspi):
        if len(p) != r["n"]:
            sys.exit(f"{run}: record of subject {r['client']} session {r['session']} has {r['n']} items, "
                     f"the data {len(p)}: not the data this run used")
    truth = [p >= 1 for p in pspi]
    weights = [r["n"] for r in first]
    pain = np.concatenate(pspi)
    pain = pain[pain >= 1].astype(int)
    levels = np.bincount(pain)
    print(f"{len(first)} test records with pain, {int(sum(weights)) // VARIANTS_PER_FRAME} frames, "
          f"{len(pain) // VARIANTS_PER_FRAME} of them pain ({100 * len(pain) / sum(weights):.1f}%)")
    print("pain frames by PSPI: " + ", ".join(f"{k}: {100 * levels[k] / len(pain):.0f}%"
                                             for k in range(1, len(levels)) if levels[k]))
    print("\nF1 (example-weighted over these records, threshold 0.5)")
    print(f"  {'every frame called pain':<34} {weighted_f1([np.ones_like(t) for t in truth], truth, weights):5.1f}")
    for k in (2, 3, 4):
        print(f"  {f'exactly the frames of PSPI >= {k}':<34} {weighted_f1([p >= k for p in pspi], truth, weights):5.1f}")
    for m in methods:
        rs = [r for r in tests if r["method"] == m]
        f1 = 100 * np.average([r["f1"] for r in rs], weights=[r["n"] for r in rs])
        called = 100 * sum(r["tp"] + r["fp"] for r in rs) / sum(r["n"] for r in rs)
        seeds = len({r["seed"] for r in rs})
        print(f"  {m:<34} {f1:5.1f}   (calls {called:.0f}% of the frames pain; {seeds} seed{'s' * (seeds > 1)})")


def within(groups: np.ndarray, scores: np.ndarray, negative: np.ndarray, positive: np.ndarray) -> float:
    """ROC-AUC of `positive` against `negative` frames inside each group, weighted by positives."""
    aucs, weights = [], []
    for g in np.unique(groups):
        a, b = scores[(groups == g) & negative], scores[(groups == g) & positive]
        if len(a) and len(b):
            aucs.append(roc_auc_score(np.r_[np.zeros(len(a)), np.ones(len(b))], np.r_[a, b]))
            weights.append(len(b))
    return float(np.average(aucs, weights=weights)) if aucs else float("nan")


def visibility(study, runtime, records: list[dict]) -> None:
    """BC's model: the run's protocol pretrains it again (`PainProtocol.pretrain`), then it scores
    the test subjects' frames."""
    p, seed, cohort = study.config.protocol, study.config.seeds[0], runtime.local_data
    written: list[dict] = []
    protocol = study.protocol(runtime, written.append, None)
    model = protocol.new_model(protocol.pretrain(seed, "C", protocol.new_model(seed=seed).state_dict()))
    best = next(r["best_val_loss"] for r in written if r["type"] == "phase")
    scores, pspi, subject, sequence = [], [], [], []
    for k in p.subjects:
        for s, session in enumerate(cohort.sessions[k]):
            data = session.as_client_data()
            first = np.arange(0, len(data), VARIANTS_PER_FRAME)  # the unaugmented crop of each frame
            scores.append(predict(model, ClientData(data.x[first], data.y[first]), BINARY)[0].numpy())
            pspi.append(session.pspi)
            subject.append(np.full(len(session.pspi), k))
            sequence.append(np.full(len(session.pspi), k * 1000 + s))
    scores, pspi, subject, sequence = map(np.concatenate, (scores, pspi, subject, sequence))
    negative = pspi == 0
    recorded = [r["best_val_loss"] for r in records if r["type"] == "phase" and r["method"] == "pretrain C"
                and r["seed"] == seed]  # the run's own
    same = f"; the run's: {recorded[0]:.4f}" if recorded else ""
    print(f"\nBC's model, pretrained again as the run did ({p.image_size} px, best held-out loss {best:.4f}{same}); "
          f"test subjects' frames:")
    print(f"  PSPI 0: {negative.sum()} frames, {100 * (scores[negative] >= 0.5).mean():.0f}% called pain")
    print(f"  {'PSPI':<6} {'frames':>6} {'called pain':>11}   ROC-AUC against PSPI 0: {'pooled':>6} {'subject':>8} {'sequence':>9}")
    for level in (1, 2, 3, 4):
        positive = pspi >= level if level == 4 else pspi == level
        if not positive.any():
            continue
        pooled_auc = roc_auc_score(np.r_[np.zeros(negative.sum()), np.ones(positive.sum())],
                                   np.r_[scores[negative], scores[positive]])
        print(f"  {('>= 4' if level == 4 else str(level)):<6} {positive.sum():>6} {100 * (scores[positive] >= 0.5).mean():>10.0f}%"
              f"   {'':<24}{pooled_auc:>6.2f} {within(subject, scores, negative, positive):>8.2f}"
              f" {within(sequence, scores, negative, positive):>9.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a finished pain run's directory (config.toml, metrics.jsonl)")
    parser.add_argument("--visibility", action="store_true",
                        help="also pretrain BC's model again, as the run did, and print how well it separates each PSPI level")
    parser.add_argument("--image-size", type=int, default=None,
                        help="network input size for --visibility (default: the run's protocol.image_size)")
    parser.add_argument("--data", type=Path, default=None,
                        help="the cohort to read (default: the run's synthetic-data/ or data.root); for "
                             "--visibility at another size, the same cohort generated at that size")
    args = parser.parse_args()
    for name in ("config.toml", "metrics.jsonl"):
        if not (args.run / name).is_file():
            sys.exit(f"{args.run}: no {name}: not a finished fedcare run")
    overrides = [f"protocol.image_size={args.image_size}"] if args.image_size else []
    config = load_config(args.run / "config.toml", overrides=overrides)
    if config.study != "pain":
        sys.exit(f"{args.run}: a {config.study} run; this diagnosis is for the pain study")
    data = args.data or (args.run / "synthetic-data" if (args.run / "synthetic-data").is_dir() else Path(config.data.root))
    config = config.model_copy(update={"data": config.data.model_copy(update={"root": data, "synthetic": None})})
    try:
        records, _ = read_records(args.run / "metrics.jsonl")
    except ValueError as e:
        sys.exit(str(e))
    set_threads(config)  # the run's thread count: float sums, and so the retrained model, depend on it
    study = registry.study_for(config)
    with tempfile.TemporaryDirectory() as workdir:  # the frame store (an unlinked file) goes here
        runtime = study.local_runtime(Path(workdir), None)
        reachable_f1(args.run, runtime.local_data, records)
        if args.visibility:
            visibility(study, runtime, records)

if __name__ == "__main__":
    main()

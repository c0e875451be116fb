"""A hand-made run directory of the pain study (seeded random metrics, one record type it does
not know, a title and a note to escape), for the report tests."""

from __future__ import annotations

import json
import random

METHODS = ["RANDOM", "A<B>", "F(C)"]
SUBJECTS = [43, 48, 52]
SESSIONS = [1, 2, 3]


def write_run(run_dir, synthetic=True, with_tests=True, run_json=True):
    run_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    lines = [{"type": "round", "study": "pain", "method": "pretrain C", "seed": 1, "phase": "pretrain-central",
              "round": r, "val_loss": 1.0 / r, "train_loss": 0.5, "n_val": 100, "clients": 1} for r in (1, 2, 3)]
    for seed in (1, 2):
        for method in METHODS:
            for session in SESSIONS:
                if with_tests:
                    for subject in SUBJECTS:
                        n = rng.randint(50, 150)
                        positives = 0 if session == 2 else rng.randint(1, 20)  # session 2: no positives
                        acc = 0.75 if method == "F(C)" else rng.random()
                        lines.append({
                            "type": "test", "study": "pain", "method": method, "seed": seed, "session": session,
                            "client": subject, "n": n, "positives": positives, "acc": acc,
                            "pr_auc": rng.random(), "f1": rng.random(), "precision": rng.random(),
                            "recall": None, "roc_auc": rng.random(), "loss": 0.3,
                        })
                if method != "RANDOM" and session < 3:
                    lines += [{"type": "round", "study": "pain", "method": method, "seed": seed,
                               "phase": f"session-{session}", "round": r, "val_loss": 0.5 + 0.1 * rng.random(),
                               "train_loss": 0.4, "n_val": 80, "clients": 3} for r in (1, 2, 3)]
                    lines.append({"type": "phase", "study": "pain", "method": method, "seed": seed,
                                  "phase": f"session-{session}", "best_round": 2, "rounds": 3, "best_val_loss": 0.5})
    lines.append({"type": "future-record", "whatever": [1, 2]})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    if run_json:
        (run_dir / "run.json").write_text(json.dumps({
            "study": "pain", "title": "Test run <one>", "synthetic": synthetic, "config_file": "configs/pain/demo.toml",
            "seeds": [1, 2], "methods": METHODS, "started": "2024-05-01T10:00:00+00:00",
            "finished": "2024-05-01T10:03:05+00:00", "fedcare_version": "0.1.0",
            "notes": ["a note with <tags> & ampersands"],
        }))
    return run_dir

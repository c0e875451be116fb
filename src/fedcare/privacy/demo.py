"""`fedcare demo --privacy`: what DP-SGD costs and buys, in minutes, on synthetic data.

Six clients hold few, noisy synthetic images each (an overfitting regime, where membership
leaks most), train FedAvg, PFDL (conv shared, dense private), FedBN and local-only, each
plain and under DP-SGD at two noise levels, and face the loss attack
(`fedcare.privacy.audit`) from two places:

- a peer: another client's model (FedAvg: the global model; PFDL/FedBN: the shared layers
  with the peer's own private ones; local: a model that never saw the victim), scored on the
  victim's training examples against the victim's held-out ones;
- the victim's own model (what a breach of that client's device exposes).

Printed and written as a table (privacy_audit.csv, .md, .json) with epsilon, accuracy and
attack AUC / TPR at FPR 1%, averaged over the clients. Then the gradient-inversion attack
(`fedcare.privacy.inversion`) on one FedSGD step of the pain CNN: privacy_inversion.csv, .md,
.json with PSNR / SSIM per case, and inversion.png with the reconstructions. The data are
synthetic images, not patients; the numbers show the mechanisms, not the pain study's values.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedcare.algorithms import fedavg, fedbn, local, pfdl
from fedcare.algorithms.base import DP_EPSILON
from fedcare.algorithms.training import ClientData, TrainSettings, predict
from fedcare.config import DPSGD, Privacy
from fedcare.privacy import private_algorithm, private_model
from fedcare.privacy.audit import attack_scores, per_example_losses
from fedcare.privacy.inversion import InversionSettings, run_inversion, save_picture
from fedcare.files import atomic_write_text
from fedcare.report.html import render_page, table_block
from fedcare.report.tables import Table, write_tables
from fedcare.runtime.federation import Federation
from fedcare.seeding import torch_generator
from fedcare.tasks import BINARY

CLIENTS, TRAIN, TEST, SIZE = 6, 48, 48, 12
SETTINGS = TrainSettings(lr=0.1, batch_size=16, local_epochs=4, task=BINARY)
ROUNDS = 6
PRIVACY = {"none": None, "DP sigma=0.6": 0.6, "DP sigma=1.5": 1.5}
METHODS = {"FedAvg": lambda s: fedavg(s, "uniform"), "PFDL": lambda s: pfdl(s, "uniform", finetune_epochs=2),
           "FedBN": lambda s: fedbn(s, "uniform"), "local": local}
INVERSION = InversionSettings()


class SmallCNN(nn.Module):
    """The pain CNN's shape in small: a conv block with BatchNorm (`features`), a dense head."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(8 * (SIZE // 2) ** 2, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.classifier(self.features(x)).squeeze(1)


def synthetic_client(client: int, seed: int) -> tuple[ClientData, ClientData]:
    """(train, held-out) images of one client: a weak class pattern, a client-specific offset
    (so personalisation matters) and much noise; labels flipped for 20% (memorisable)."""
    g = torch_generator(seed, "privacy-demo", client)
    pattern = torch.zeros(SIZE, SIZE)
    pattern[: SIZE // 2] = 1.0
    n = TRAIN + TEST
    y = (torch.rand(n, generator=g) < 0.5).float()
    x = 0.6 * torch.randn(n, 1, SIZE, SIZE, generator=g) + 0.3 * y[:, None, None, None] * pattern
    x += 0.3 * torch.randn(1, 1, SIZE, SIZE, generator=g)  # the client's own offset
    flip = torch.rand(n, generator=g) < 0.2
    y[flip] = 1 - y[flip]
    return ClientData(x[:TRAIN], y[:TRAIN]), ClientData(x[TRAIN:], y[TRAIN:])


def audit_method(method: str, sigma: float | None, seed: int) -> dict:
    privacy = Privacy(dp_sgd=DPSGD(noise_multiplier=sigma, max_grad_norm=1.0)) if sigma is not None else None
    torch.manual_seed(seed)
    model = private_model(SmallCNN(), privacy)
    fed = Federation(model, private_algorithm(METHODS[method](SETTINGS), privacy), seed)
    data = {c: synthetic_client(c, seed) for c in range(CLIENTS)}
    info = {}
    for rnd in range(1, ROUNDS + 1):
        info = fed.run_round("train", rnd, {c: d[0] for c, d in data.items()})
    own, peer, acc = [], [], []
    for c, (members, held_out) in data.items():
        mine = fed.personal_model(c)
        own.append(attack_scores(per_example_losses(mine, members, BINARY), per_example_losses(mine, held_out, BINARY)))
        scores, _ = predict(mine, held_out, BINARY)
        acc.append(float(((scores > 0.5).float() == held_out.y).float().mean()))
        other = fed.personal_model((c + 1) % CLIENTS)
        peer.append(attack_scores(per_example_losses(other, members, BINARY),
                                  per_example_losses(other, held_out, BINARY)))
    return {"method": method, "epsilon": info.get(DP_EPSILON, float("inf")), "accuracy": float(np.mean(acc)),
            "peer_auc": float(np.mean([r.auc for r in peer])), "peer_tpr_1pct": float(np.mean([r.tpr_at_1pct_fpr for r in peer])),
            "own_auc": float(np.mean([r.auc for r in own])), "own_tpr_1pct": float(np.mean([r.tpr_at_1pct_fpr for r in own]))}


def run_privacy_demo(out: Path, seed: int = 0, progress=None) -> list[Table]:
    """Every method at every privacy level, then the gradient inversion; writes the tables
    and the inversion's picture into `out` and returns the tables."""
    out.mkdir(parents=True, exist_ok=False)
    torch.set_num_threads(1)  # small models: one thread is fastest, more only contend
    rows, start = [], time.monotonic()
    cases = [(m, p) for p in PRIVACY for m in METHODS if not (m == "FedBN" and PRIVACY[p] is not None)]
    for i, (method, level) in enumerate(cases, start=1):
        row = {"privacy": level, **audit_method(method, PRIVACY[level], seed)}
        rows.append(row)
        if progress:
            progress(f"{method}, {level}", i, len(cases))
    columns = ["privacy", "method", "epsilon", "accuracy", "peer_auc", "peer_tpr_1pct", "own_auc", "own_tpr_1pct"]
    table = Table("privacy_audit", "Membership inference (loss attack) vs DP-SGD, synthetic data",
                  f"Mean over {CLIENTS} clients of {TRAIN} training (members) and {TEST} held-out (non-members) "
                  f"examples; AUC 0.5 = the attack guesses. FedBN under DP-SGD is not run: GroupNorm replaces "
                  f"its BatchNorm, leaving FedAvg. Synthetic images, not patients.",
                  columns, [[_fmt(r[c]) for c in columns] for r in rows], columns, [[r[c] for c in columns] for r in rows])
    (out / "privacy_audit.json").write_text(json.dumps({"rows": rows, "seconds": time.monotonic() - start,
                                                        "synthetic": True}, indent=1))
    inversion = inversion_table(out, seed, progress)
    write_tables({"privacy_audit": table, "privacy_inversion": inversion}, out)
    write_demo_report(out, table, inversion)
    return [table, inversion]


def write_demo_report(out: Path, audit: Table, inversion: Table) -> Path:
    """report.html: both tables and the reconstructions' picture in one self-contained page."""
    picture = base64.b64encode((out / "inversion.png").read_bytes()).decode("ascii")
    body = [table_block(audit), table_block(inversion),
            f'<figure><img alt="true frames and their reconstructions" src="data:image/png;base64,{picture}">'
            f"<figcaption>Top row: the true frames; below, what the attacker reconstructs from each update "
            f"(inversion.png).</figcaption></figure>",
            "<p>docs/privacy.md explains each number and its limits.</p>"]
    return atomic_write_text(out / "report.html", render_page("fedcare demo --privacy", True, body))


def inversion_table(out: Path, seed: int, progress=None) -> Table:
    """The gradient inversion's table (and privacy_inversion.json, inversion.png in `out`)."""
    start, s = time.monotonic(), INVERSION
    true, rows, recons = run_inversion(seed, s, progress)
    save_picture(out / "inversion.png", true, rows, recons)
    (out / "privacy_inversion.json").write_text(json.dumps(
        {"rows": rows, "settings": asdict(s), "seconds": time.monotonic() - start, "synthetic": True}, indent=1))
    columns = ["case", "observed_tensors", "psnr", "ssim"]
    return Table("privacy_inversion", "Gradient inversion of one client's update (pain CNN, synthetic faces)",
                 f"Inverting gradients (Geiping et al. 2020), {s.steps} Adam steps, on one FedSGD step of a batch of "
                 f"{s.batch} synthetic {s.image_size}-px frames at the untrained pain CNN; labels known to the attacker. "
                 f"PSNR (dB) and SSIM of the best-matched reconstructions against the true frames (higher = more "
                 f"recovered); the baseline row is a flat image. Picture: inversion.png. Synthetic faces, one seed.",
                 columns, [[_fmt(r[c]) for c in columns] for r in rows], columns, [[r[c] for c in columns] for r in rows])


def _fmt(v):
    return f"{v:.3f}" if isinstance(v, float) else str(v)

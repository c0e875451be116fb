"""What the one-run audits cost: the same training run with and without its canaries, side by
side in one process (docs/privacy.md, "The one-run audit"). The privacy audit demo's setting:
six synthetic clients of 48 images, its small CNN, FedAvg for six rounds of four local epochs,
under DP-SGD (sigma 1, C 1) with and without 1,000 gradient canaries per client
(`[privacy.audit] canaries`), and under client-level DP (sigma 1, C 1) with and without 1,000
canary clients (`canary_clients`). The runs alternate, `--repeats` times each, after one
uncounted round of each (imports); the printed ratio is the median time with the audit over the
median without. No shadow model is trained: offline
LiRA in the same demo trains 4 more federations per case (5x).

    PYTHONPATH=src python benchmarks/one_run_audit.py --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedcare.algorithms import fedavg
from fedcare.algorithms.training import TrainSettings
from fedcare.config import DPSGD, ClientDP, Privacy, PrivacyAudit
from fedcare.privacy import private_algorithm, private_model
from fedcare.runtime.federation import Federation
from fedcare.studies.privacy_audit.config import AuditData
from fedcare.studies.privacy_audit.data import synthetic_client
from fedcare.studies.privacy_audit.methods import SmallCNN
from fedcare.tasks import BINARY

CASES = {
    "DP-SGD (sigma 1), 1,000 gradient canaries per client": (
        Privacy(dp_sgd=DPSGD(noise_multiplier=1.0)), PrivacyAudit(canaries=1000)),
    "client-level DP (sigma 1), 1,000 canary clients": (
        Privacy(client_dp=ClientDP(noise_multiplier=1.0)), PrivacyAudit(canary_clients=1000)),
}


def train(privacy: Privacy, rounds: int) -> float:
    """Seconds for `rounds` rounds of FedAvg on the demo's clients under `privacy`."""
    data = AuditData()
    clients = {c: synthetic_client(c, 0, data)[0] for c in range(data.clients)}
    torch.manual_seed(0)
    model = private_model(SmallCNN(data.image_size), privacy)
    settings = TrainSettings(lr=0.1, batch_size=16, local_epochs=4, task=BINARY)
    federation = Federation(model, private_algorithm(fedavg(settings, "uniform"), privacy), seed=0)
    start = time.perf_counter()
    for rnd in range(1, rounds + 1):
        federation.run_round("train", rnd, clients)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("| run | without the audit (s) | with it (s) | ratio |\n|---|---:|---:|---:|")
    for name, (privacy, audit) in CASES.items():
        audited = privacy.model_copy(update={"audit": audit})
        plain, with_audit = [], []
        train(privacy, 1), train(audited, 1)  # warm-up, not counted: first imports (dp-accounting, Opacus)
        for _ in range(args.repeats):  # alternated: a load that changes moves both alike
            plain.append(train(privacy, args.rounds))
            with_audit.append(train(audited, args.rounds))
        a, b = statistics.median(plain), statistics.median(with_audit)
        print(f"| {name} | {a:.2f} | {b:.2f} | {b / a:.2f}x |")


if __name__ == "__main__":
    main()

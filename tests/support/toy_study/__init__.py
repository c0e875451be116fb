"""A toy study, registered from outside fedcare (the `toy` fixture of tests/studies/conftest.py
copies this folder into a temporary one and names it in FEDCARE_STUDIES): identities as points,
an embedding model trained with a cosine-margin head that needs the labels (as ArcFace does), and
verification (TAR@FAR) computed at each client. Nothing outside this folder knows it."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from fedcare.algorithms import fedavg, local
from fedcare.algorithms.training import TrainSettings
from fedcare.runtime.local import LocalRuntime
from fedcare.studies.base import Study
from fedcare.tasks import EmbeddingTask
from fedcare.runtime.refs import Split

from .config import ToyExperiment
from .data import ToySite, generate
from .protocol import ToyProtocol


class Embedder(nn.Module):
    def __init__(self, identities: int):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.head = nn.Linear(4, identities, bias=False)  # one direction per identity

    def forward(self, x):
        return self.body(x)  # the embedding; the head is used by the loss only


def margin_loss(model: Embedder, x, y, scale: float = 8.0, margin: float = 0.3):
    """Cosine logits with an additive angular margin on the true identity: needs the labels."""
    cosine = F.linear(F.normalize(model(x)), F.normalize(model.head.weight)).clamp(-1 + 1e-6, 1 - 1e-6)
    target = F.one_hot(y, cosine.shape[1]).bool()
    logits = scale * torch.where(target, torch.cos(torch.acos(cosine) + margin), cosine)
    return F.cross_entropy(logits, y)


class ToyStudy(Study):
    name = "toy"
    config_model = ToyExperiment
    description = "a toy embedding study (tests)"
    protocol_class = ToyProtocol
    report_module = __name__ + ".report"  # whatever this package is called

    def new_model(self) -> nn.Module:
        d = self.config.data
        return Embedder(d.clients * d.identities_per_client)

    def algorithm(self, name: str):
        task = EmbeddingTask(head_loss=margin_loss)
        settings = TrainSettings(lr=self.config.lr, batch_size=8, local_epochs=1, task=task)
        return {"fedavg": fedavg, "local": local}[name](settings)

    def local_runtime(self, workdir: Path, progress) -> LocalRuntime:
        d = self.config.data
        root = d.root or generate(workdir / "synthetic-data", d.clients, d.identities_per_client, d.examples_per_identity)
        sites = {k: ToySite(k, root) for k in range(d.clients)}
        return LocalRuntime(sites, self.composed.algorithm, synthetic=all(s.synthetic for s in sites.values()))

    def sample_ref(self) -> Split:
        return Split("train")

    def clients(self) -> list[int]:
        return list(range(self.config.data.clients))

    def open_site(self, site: str, data_dir: Path, cache_dir: Path | None = None) -> ToySite:
        return ToySite(self.site_client(site), data_dir)



STUDY = ToyStudy

"""The facerec methods by name: "<algorithm>[-local]" (see config.FACEREC_METHODS), built from
the algorithm library with the ArcFace loss and wrapped in `FaceClient` (client-sized heads,
tuned evaluation).

- fedavg: FedAvg, `local_steps` batches per round (`local_unit = "epochs"`: passes), SGD with
  momentum; the optimizer (and its momentum) starts afresh each round.
- hfmaml: federated HF-MAML = the library's Per-FedAvg (α, β, δ of Table 4.5), `local_steps`
  steps of three batches each.
- "-local": the ArcFace head (`head`) stays at the client; otherwise it is shared and averaged
  like the backbone, and each client's loss masks the classes it does not hold (Eq. 3.2-3.3)."""

from __future__ import annotations

import torch

from fedcare.algorithms import Algorithm, perfedavg
from fedcare.algorithms.base import ClientHalf, ServerHalf
from fedcare.algorithms.split import SHARE_ALL, ParameterSplit
from fedcare.algorithms.training import SGD, ClientData, Randomness, TrainSettings, train_steps
from fedcare.models.face_resnet import arcface_loss
from fedcare.studies.facerec.client import FaceClient
from fedcare.studies.facerec.config import FacerecExperiment
from fedcare.tasks import EmbeddingTask

HEAD = "head"


def labels_of(method: str) -> str:
    """Which labels (and head) a method trains with: "local" or "global"."""
    return "local" if method.endswith("-local") else "global"


def loss_factory(config: FacerecExperiment):
    """The client's ArcFace loss: with the global head, classes absent from its data masked."""
    t = config.train

    def for_data(data: ClientData):
        classes = getattr(data, "classes", 0)
        present = None
        if classes:
            present = torch.zeros(classes, dtype=torch.bool)
            present[data.y.unique()] = True
            if bool(present.all()):
                present = None  # a local head: every class is the client's
        return arcface_loss(t.arcface_scale, t.arcface_margin, present)

    return for_data


def settings(config: FacerecExperiment) -> TrainSettings:
    t = config.train
    return TrainSettings(lr=t.lr, batch_size=t.batch_size, local_epochs=t.local_steps,
                         task=EmbeddingTask(far=config.protocol.far), loss=loss_factory(config),
                         optimizer=SGD(momentum=t.momentum))


class StepsClient(ClientHalf):
    """FedAvg's client with `steps` batches per round (the thesis's 50 "epochs" of one batch)."""

    def __init__(self, settings: TrainSettings, split: ParameterSplit, steps: int):
        super().__init__(settings, split)
        self.steps = steps

    def fit(self, model, message, state, data, rng: Randomness):
        self.load(model, message, state).train()
        loss = train_steps(model, model.parameters(), data, self.settings, steps=self.steps,
                           generator=rng.torch("fit-order"))
        return self.outgoing(model, len(data), loss)


def make_algorithm(method: str, config: FacerecExperiment) -> Algorithm:
    t, o, p = config.train, config.options, config.protocol
    s = settings(config)
    split = ParameterSplit(private_paths=(HEAD,)) if labels_of(method) == "local" else SHARE_ALL
    base = method.removesuffix("-local")
    if base == "fedavg":
        if t.local_unit == "epochs":
            algo = Algorithm(method, ClientHalf(s, split), ServerHalf(split, t.aggregation))
        else:
            algo = Algorithm(method, StepsClient(s, split, t.local_steps), ServerHalf(split, t.aggregation))
    elif base == "hfmaml":
        algo = perfedavg(s, alpha=o.hfmaml_alpha, beta=o.hfmaml_beta, delta=o.hfmaml_delta,
                         steps_per_round=t.local_steps, head_paths=(HEAD,) if split is not SHARE_ALL else None,
                         weighting=t.aggregation)
    else:
        raise ValueError(f"unknown facerec method {method!r}")
    client = FaceClient(algo.client, s, t.tune_steps, p.genuine_pairs, p.impostor_pairs, p.far)
    return Algorithm(method, client, algo.server)

"""The facerec methods by name: "<algorithm>[-local]" (see config.FACEREC_METHODS), built from
the algorithm library with the ArcFace loss and wrapped in `FaceClient` (client-sized heads,
tuned evaluation).

- fedavg: FedAvg, `local_steps` batches per round (`local_unit = "epochs"`: passes), SGD with
  momentum; the optimizer (and its momentum) starts afresh each round.
- hfmaml: federated HF-MAML = the library's Per-FedAvg (α, β, δ of Table 4.5), `local_steps`
  steps of three batches each.
- "-local": the ArcFace head (`head`) stays at the client; otherwise it is shared and averaged
  like the backbone, and each client's loss masks the classes it does not hold (Eq. 3.2-3.3).
- "-reg" (the thesis's "Penalty"): embedding regularisation, Eq. 3.4: the loss plus
  C (1 − cos(f_emb^global(x), f_emb^local(x))), f_emb^global the embedding that the model
  received this round gives the batch (a frozen copy, in training mode like the model trained,
  no gradient), C = `options.reg_c` (10). With HF-MAML the thesis puts the term in the inner
  step only (Algorithm 6); the library's meta step takes one loss, so here it is in all three
  gradients of a step (a deviation, docs/studies/facerec.md).
- "-fair": q-FedAvg (q = 0.001, L = 100) around the algorithm's client training: the client
  also sends its ArcFace loss at the received model, the server takes the q-FFL step.
Regularised and fair variants use the global head (the thesis compares them with it).
- fedfr: FedFR as the thesis adapted it (§2.6): local ArcFace head, no global data, no hard
  negatives, no pretraining; loss α1 ArcFace + α2 MOON contrastive + α3 binary (SphereFace2)
  loss on a second private head, α = 1, 5, 10; FedAvg's local batches. The contrastive term's
  f_prev is the client's model after its previous round (kept in its state, the backbone and
  embedding only); in its first round the received model stands in (MOON's start)."""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
from torch import nn
from torch.nn import functional as F

from fedcare.algorithms import Algorithm
from fedcare.algorithms.base import ClientHalf, ServerHalf
from fedcare.algorithms.perfedavg import PerFedAvgClient
from fedcare.algorithms.qfedavg import QFedAvgClient, QFedAvgServer
from fedcare.algorithms.split import SHARE_ALL, ParameterSplit, load_tensors
from fedcare.algorithms.training import SGD, ClientData, Randomness, TrainSettings, train_steps
from fedcare.models.face_resnet import arcface_loss, binary_loss, moon_contrastive
from fedcare.studies.facerec.client import FaceClient
from fedcare.studies.facerec.config import FacerecExperiment
from fedcare.tasks import EmbeddingTask

HEAD = "head"


def labels_of(method: str) -> str:
    """Which labels (and head) a method trains with: "local" or "global"."""
    return "local" if method.endswith("-local") or method == "fedfr" else "global"


def loss_factory(config: FacerecExperiment):
    """The client's ArcFace loss: with the global head, classes absent from its data masked."""
    t = config.train

    def for_data(data: ClientData):
        classes = getattr(data, "classes", 0)
        present = None
        if classes:
            present = torch.zeros(classes, dtype=torch.bool, device="cpu")  # from the labels, on the host
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

    batched_fit = False  # a fit of its own: not the library's to batch over clients

    def __init__(self, settings: TrainSettings, split: ParameterSplit, steps: int):
        super().__init__(settings, split)
        self.steps = steps

    def fit(self, model, message, state, data, rng: Randomness):
        self.load(model, message, state).train()
        loss = train_steps(model, model.parameters(), data, self.settings, steps=self.steps,
                           generator=rng.torch("fit-order"))
        return self.outgoing(model, len(data), loss)


class QStepsClient(QFedAvgClient, StepsClient):
    """q-FedAvg's client (F_k at the received model) around FedAvg's local batches."""


class QPerFedAvgClient(QFedAvgClient, PerFedAvgClient):
    """q-FedAvg's client (F_k at the received model) around HF-MAML's local steps."""


class Regularised(ClientHalf):
    """An algorithm's client half trained on the loss plus Eq. 3.4's embedding term."""

    batched_fit = False  # a fit of its own: not the library's to batch over clients

    def __init__(self, inner: ClientHalf, c: float):
        super().__init__(inner.settings, inner.split)
        self.inner, self.c = inner, c

    def fit(self, model, message, state, data, rng):
        received = _frozen(self.inner.load(model, message, state))
        arcface = self.settings.batch_loss(data)

        def loss(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            emb = m(x)
            with torch.no_grad():
                reference = received(x)
            return arcface.embedded(m, emb, y) + self.c * (1 - F.cosine_similarity(emb, reference, dim=1).mean())

        inner_settings = self.inner.settings
        self.inner.settings = replace(inner_settings, loss=lambda _: loss)
        try:
            return self.inner.fit(model, message, state, data, rng)
        finally:
            self.inner.settings = inner_settings


PREVIOUS = "extra/previous/"  # FedFR: the client's last local backbone and embedding, in its state


class FedFRClient(StepsClient):
    def __init__(self, settings: TrainSettings, split: ParameterSplit, steps: int, weights: tuple[float, float, float]):
        super().__init__(settings, split, steps)
        self.weights = weights

    def fit(self, model, message, state, data, rng: Randomness):
        self.load(model, message, state).train()
        received = _frozen(model)
        previous = _frozen(model)
        saved = {k[len(PREVIOUS):]: v for k, v in state.items() if k.startswith(PREVIOUS)}
        if saved:
            load_tensors(previous, saved)
        arcface = self.settings.batch_loss(data)
        a1, a2, a3 = self.weights

        def loss(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            emb = m(x)
            with torch.no_grad():
                g, p = received(x), previous(x)
            return (a1 * arcface.embedded(m, emb, y) + a2 * moon_contrastive(emb, g, p)
                    + a3 * binary_loss(emb, m.binary_head, y))

        run = replace(self.settings, loss=lambda _: loss)
        total = train_steps(model, model.parameters(), data, run, steps=self.steps, generator=rng.torch("fit-order"))
        reply, private = self.outgoing(model, len(data), total)
        shared = {k: v.detach().clone() for k, v in model.state_dict().items() if not k.startswith(PRIVATE_HEADS)}
        return reply, {**private, **{PREVIOUS + k: v for k, v in shared.items()}}


PRIVATE_HEADS = ("head.", "binary_head.")


def _frozen(model: nn.Module) -> nn.Module:
    """A copy of `model` in training mode (batch statistics, as the model trained) without gradients."""
    copy_ = copy.deepcopy(model).train()
    for p in copy_.parameters():
        p.requires_grad_(False)
    return copy_


def make_algorithm(method: str, config: FacerecExperiment) -> Algorithm:
    t, o, p = config.train, config.options, config.protocol
    s = settings(config)
    split = ParameterSplit(private_paths=(HEAD,)) if labels_of(method) == "local" else SHARE_ALL
    if method == "fedfr":
        split = ParameterSplit(private_paths=(HEAD, "binary_head"))
    base, _, variant = method.partition("-")
    server = ServerHalf(split, t.aggregation)
    if variant == "fair":
        server = QFedAvgServer(o.qfedavg_q, o.qfedavg_lipschitz, o.qfedavg_weighting, split)
    if base == "fedavg":
        if t.local_unit == "epochs":
            client = (QFedAvgClient if variant == "fair" else ClientHalf)(s, split)
        else:
            client = (QStepsClient if variant == "fair" else StepsClient)(s, split, t.local_steps)
    elif base == "hfmaml":
        client = (QPerFedAvgClient if variant == "fair" else PerFedAvgClient)(
            s, split, alpha=o.hfmaml_alpha, beta=o.hfmaml_beta, delta=o.hfmaml_delta, steps_per_round=t.local_steps,
            first_order=False)
    elif base == "fedfr":
        client = FedFRClient(s, split, t.local_steps, (o.fedfr_arcface, o.fedfr_contrastive, o.fedfr_binary))
    else:
        raise ValueError(f"unknown facerec method {method!r}")
    if variant == "reg":
        client = Regularised(client, o.reg_c)
    face = FaceClient(client, s, t.tune_steps, p.genuine_pairs, p.impostor_pairs, p.far)
    return Algorithm(method, face, server)

"""What every facerec method does at the client besides its algorithm's training:

- **Local heads.** With a local ArcFace head the head's rows are the client's own identities,
  so its size is the client's: the head is private (never in a message) and a client's first
  head is drawn for its class count from (run seed, "head", client) when it first trains or
  is evaluated (a new client 16-20 gets a fresh head, reference note §3 [inferred]). The
  working model takes each client's head shape (`FaceResNet.client_sized`), so this works the
  same in process and at a Flower site.
- **Tuned evaluation** (thesis Algorithms 7-9): the client's model (shared weights + its own
  head) is scored, then a copy is tuned for `tune_steps` batches on the client's training
  split (SGD lr 0.01, momentum 0.9: Per-FedAvg's `adapt`) and scored again, on the same
  sampled genuine and impostor pairs of its test split. Tuning and pairs draw from
  (run seed, client, evaluation path). With global testing (`protocol.impostors`) an impostor
  pair's second image is any test image of another identity, of any client (the site's
  `ImpostorPool`); only the drawn pool images are read and embedded."""

from __future__ import annotations

import copy
import math

import numpy as np
from torch import nn

from fedcare.algorithms.base import ClientHalf, DelegatingClient
from fedcare.algorithms.messages import ClientState, Message
from fedcare.algorithms.perfedavg import adapt
from fedcare.algorithms.training import ClientData, Randomness, TrainSettings, predict
from fedcare.evaluation.verification import pairs_tar_at_far, sample_pairs
from fedcare.models.face_resnet import BINARY_WEIGHT, HEAD_WEIGHT, init_head
from fedcare.seeding import numpy_rng, torch_generator


class FaceClient(DelegatingClient):
    """An algorithm's client half (`inner`) with client-sized heads and tuned evaluation."""

    def __init__(self, inner: ClientHalf, tune: TrainSettings, tune_steps: int, genuine: int, impostor: int,
                 far: float):
        super().__init__(inner)
        self.tune, self.tune_steps = tune, tune_steps
        self.genuine, self.impostor, self.far = genuine, impostor, far

    def own_head(self, state: ClientState, data: ClientData, rng: Randomness) -> ClientState:
        """The state with this client's head: drawn now if the head is private and not yet sized."""
        classes = getattr(data, "classes", None)
        new = dict(state)
        for key in (HEAD_WEIGHT, BINARY_WEIGHT):
            head = state.get(key)
            if head is not None and classes is not None and head.shape[0] != classes:
                new[key] = init_head(classes, head.shape[1], torch_generator(rng.seed, key, rng.client))
        return new

    # -- the algorithm's half, with the client's own head ----------------------------------
    def fit(self, model, message, state, data, rng):
        return self.inner.fit(model, message, self.own_head(state, data, rng), data, rng)

    # -- evaluation --------------------------------------------------------------------
    def evaluate(self, model: nn.Module, message: Message, state: ClientState, data: ClientData, metrics: str,
                 rng: Randomness | None = None) -> dict:
        if metrics != "tuned-verification":
            return self.inner.evaluate(model, message, state, data, metrics, rng)
        tune, path = data.tune, data.path
        model = self.load(model, message, self.own_head(state, tune, rng))
        pairs_rng = numpy_rng(rng.seed, "pairs", rng.client, path)
        if data.pool is None:  # local testing: impostors from the client's own test split
            genuine, impostor = sample_pairs(data.y.numpy(), pairs_rng, self.genuine, self.impostor)
            scored = data
        else:  # global testing: the second images from the pool, embedded after the client's own
            genuine, impostor = sample_pairs(data.identities.numpy(), pairs_rng, self.genuine, self.impostor,
                                             pool=data.pool.labels)
            drawn, position = np.unique(impostor[:, 1], return_inverse=True)
            impostor = np.stack([impostor[:, 0], len(data) + position.reshape(-1)], axis=1)
            scored = ClientData.concat([data, data.pool.subset(drawn)])
        counts = {"n": len(data), "path": path, "genuine_pairs": len(genuine), "impostor_pairs": len(impostor)}
        if not len(genuine) or not len(impostor) or len(tune) < 2:  # nothing to score or to tune on: undefined
            return {**counts, **dict.fromkeys(("tar_global", "tar_tuned", "far_global", "far_tuned"), math.nan)}
        task = self.settings.task
        before = pairs_tar_at_far(predict(model, scored, task)[0], genuine, impostor, self.far)
        tuned = adapt(copy.deepcopy(model), tune, self.tune, steps=self.tune_steps,
                      generator=torch_generator(rng.seed, "tune", rng.client, path))
        after = pairs_tar_at_far(predict(tuned, scored, task)[0], genuine, impostor, self.far)
        return {**counts, "tar_global": before["tar"], "tar_tuned": after["tar"], "far_global": before["far"],
                "far_tuned": after["far"]}

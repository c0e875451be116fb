"""The face-verification study's data: a CelebA copy (or a synthetic one generated into the run
directory) cropped and partitioned by `fedcare.data.celeba.federation`, and one site per client.

A site resolves these references on its own client's crops:

- `Training(labels)`: its training split (`FaceData`), labelled over all clients (labels
  "global": the global ArcFace head) or over its own identities ("local": a local head);
- `Evaluation(labels, path)`: its test split for evaluation path `path`, carrying the
  training split for tuning (`EvalData`) and, with ``protocol.impostors = "global"``, the
  global impostor pool (`ImpostorPool`: every client's test split; CelebA is public, and
  every site reads the whole copy to partition it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from fedcare.algorithms.training import ClientData
from fedcare.data.celeba.faces import DetectorParams
from fedcare.data.celeba.federation import ClientFaces, FaceSplit, FederatedFaces, federated_celeba
from fedcare.data.common import SYNTHETIC_MARKER, DataError
from fedcare.runtime.refs import DataRef
from fedcare.runtime.sites import SiteError
from fedcare.studies.facerec.config import FacerecExperiment
from fedcare.studies.rundir import Progress

SYNTHETIC_DIR = "synthetic-celeba"
LABELS = ("global", "local")


@dataclass
class FaceData(ClientData):
    """Face crops (N, 3, H, W) uint8 and labels; `classes`: the size of the head they index."""

    classes: int = 0


class ImpostorPool:
    """The thesis's D_global (Algorithm 7, "global testing"): the test splits of all clients,
    labelled by identity over all clients; crops are read only for the images drawn."""

    def __init__(self, faces: FederatedFaces):
        tests = [c.test for c in faces.clients]
        self.rows = np.concatenate([t.rows for t in tests])
        self.labels = np.concatenate([t.global_labels for t in tests]).astype(np.int64)
        self.faces = faces.faces

    def subset(self, index: np.ndarray) -> FaceData:
        images = self.faces.images(self.rows[index])
        return FaceData(torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2))),
                        torch.from_numpy(self.labels[index]))


@dataclass
class EvalData(ClientData):
    """A client's test crops for one evaluation path, with its tuning data (training split)
    and, for global testing, the impostor pool and its test images' global identities."""

    tune: FaceData | None = None
    path: int = 0
    pool: ImpostorPool | None = None
    identities: torch.Tensor | None = None


def generate(config: FacerecExperiment, workdir: Path, progress: Progress | None) -> Path:
    """The configured synthetic copy in the run directory (a resumed run has it already)."""
    from fedcare.data.celeba.synthetic import generate_celeba

    syn, root = config.data.synthetic, workdir / SYNTHETIC_DIR
    if not root.is_dir():
        generate_celeba(root, seed=syn.seed, identities=syn.identities, images_per_identity=syn.images_per_identity,
                        progress=(lambda d, t: progress("generating synthetic CelebA", d, t)) if progress else None)
    return root


def load_faces(root: Path, config: FacerecExperiment, cache: Path | None,
               progress: Progress | None = None) -> FederatedFaces:
    d = config.data
    params = DetectorParams(scale_factor=d.detector_scale_factor, min_size=d.detector_min_size, size=d.image_size)
    try:
        return federated_celeba(root, d.partition, seed=d.partition_seed, n_identities=d.identities,
                                n_clients=d.clients, attribute_scale=d.attribute_scale, cache_dir=d.cache or cache,
                                params=params,
                                progress=(lambda done, t: progress("cropping faces", done, t)) if progress else None)
    except ValueError as e:  # too few usable identities for the options: name them
        if isinstance(e, DataError):
            raise
        raise DataError(f"{root}: {e} (data.partition = {d.partition!r}, data.identities = {d.identities}, "
                        f"data.clients = {d.clients})") from None


def _tensors(split: FaceSplit, labels: str) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.from_numpy(np.ascontiguousarray(split.images.transpose(0, 3, 1, 2)))
    y = split.global_labels if labels == "global" else split.labels
    return images, torch.from_numpy(np.asarray(y, np.int64))


@dataclass(frozen=True)
class Training(DataRef):
    """A client's training split, labelled for the "global" or a "local" head."""

    kind: ClassVar[str] = "train"
    labels: str


@dataclass(frozen=True)
class Evaluation(DataRef):
    """A client's test split for evaluation path `path`, labelled for the "global" or a "local" head."""

    kind: ClassVar[str] = "eval"
    labels: str
    path: int


class FaceSite:
    """One client's crops (train and test splits) and, for global testing, the impostor pool."""

    data_refs: ClassVar[tuple[type[DataRef], ...]] = (Training, Evaluation)

    def __init__(self, faces: ClientFaces, global_classes: int, synthetic: bool, pool: ImpostorPool | None = None):
        self.client = faces.client
        self.synthetic = synthetic
        self.faces = faces
        self.pool = pool
        self.classes = {"global": global_classes, "local": faces.n_classes}
        self._cache: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def _split(self, name: str, labels: str) -> tuple[torch.Tensor, torch.Tensor]:
        if (name, labels) not in self._cache:
            self._cache[name, labels] = _tensors(getattr(self.faces, name), labels)
        return self._cache[name, labels]

    def summary(self) -> dict:
        f = self.faces
        return {"classes": f.n_classes, "global_classes": self.classes["global"], "train": len(f.train), "val": len(f.val), "test": len(f.test)}

    def inventory(self) -> dict:
        """Exact counts for the preflight (`fedcare.runtime.preflight`, which suppresses the
        small ones before they leave the site): images and identities per split, and the
        identities of the whole partition, which every site derives from the same copy."""
        splits = {name: {"examples": len(split.rows), "identities": len(np.unique(split.identities))}
                  for name in ("train", "val", "test") for split in [getattr(self.faces, name)]}
        return {"unit": "images", "splits": splits, "dataset": {"global_identities": self.classes["global"]}}

    def train(self, labels: str) -> FaceData:
        return FaceData(*self._split("train", labels), classes=self.classes[labels])

    def data(self, ref: DataRef) -> ClientData:
        if isinstance(ref, (Training, Evaluation)) and ref.labels in LABELS:
            if isinstance(ref, Training):
                return self.train(ref.labels)
            if ref.path >= 0:
                data = EvalData(*self._split("test", ref.labels), tune=self.train(ref.labels), path=ref.path)
                if self.pool is not None:  # global testing
                    data.pool, data.identities = self.pool, self._split("test", "global")[1]
                return data
        raise SiteError(f"client {self.client}: unknown data reference {ref!r} "
                        f"(expected Training(labels) or Evaluation(labels, path), labels one of {', '.join(LABELS)})")


def sites(faces: FederatedFaces, root: Path, impostors: str = "local") -> dict[int, FaceSite]:
    """One site per client; with `impostors` "global" every site holds the impostor pool."""
    synthetic = (Path(root) / SYNTHETIC_MARKER).is_file()
    pool = ImpostorPool(faces) if impostors == "global" else None
    return {c.client: FaceSite(c, faces.n_global_classes, synthetic, pool) for c in faces.clients}

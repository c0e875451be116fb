"""From a CelebA root to per-client train/val/test face crops: the Hess study's data in one call.

    from fedcare.data.celeba.federation import federated_celeba

    data = federated_celeba("/data/CelebA", partition="lognormal", seed=0)
    for client in data.training_clients():          # clients 1-15
        x, y = client.train.images, client.train.labels   # (n, 128, 128, 3) uint8 RGB, local labels
    for client in data.unseen_clients():            # clients 16-20: tuning and evaluation only
        ...

Steps: ``load_celeba`` (strict), Haar crops through the on-disk cache (``FaceCropper``), then the
partition (``identity_partition``) over the images that have a face:

* equal / lognormal: identities are considered in ``selection_order`` and cropped in batches in
  that order until ``n_identities`` of them have at least ``min_faces`` faces, so only those
  identities' images (plus the few rejected on the way) are ever decoded;
* attribute: every image is cropped (the thesis filtered all of CelebA), then Table 4.1's filters
  are applied to the images with a face.

Images are read from the cache only when ``FaceSplit.images`` is first used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from fedcare.data.celeba.faces import DetectorParams, FaceCropper, FaceSet
from fedcare.data.celeba.reader import CelebaDataset, load_celeba
from fedcare.data.celeba.identity_partition import (
    N_CLIENTS,
    N_IDENTITIES,
    ClientSplit,
    FacePartition,
    attribute_partition,
    equal_partition,
    lognormal_partition,
    selection_order,
)
from fedcare.errors import InputError

__all__ = ["PARTITIONS", "ClientFaces", "FaceSplit", "FederatedFaces", "federated_celeba"]

PARTITIONS = ("equal", "lognormal", "attribute")
_BATCH = 64  # identities cropped per step of the selection walk


@dataclass
class FaceSplit:
    """One split of one client. ``rows`` index the CelebaDataset; ``identities`` are CelebA person
    ids, ``labels`` the client-local classes, ``global_labels`` the classes over all clients."""

    rows: np.ndarray
    identities: np.ndarray
    labels: np.ndarray
    global_labels: np.ndarray
    faces: FaceSet = field(repr=False)

    def __len__(self) -> int:
        return len(self.rows)

    @cached_property
    def images(self) -> np.ndarray:
        """(n, 128, 128, 3) uint8 RGB crops, read from the cache on first use."""
        return self.faces.images(self.rows)

    @property
    def files(self) -> list[str]:
        return [self.faces.dataset.filenames[r] for r in self.rows.tolist()]


@dataclass
class ClientFaces:
    client: int  # 1..20
    unseen: bool  # 16-20: never in federated training
    n_classes: int  # local classes (persons on this client)
    train: FaceSplit
    val: FaceSplit
    test: FaceSplit


@dataclass
class FederatedFaces:
    dataset: CelebaDataset
    faces: FaceSet
    partition: FacePartition
    clients: list[ClientFaces]
    n_global_classes: int
    cache_stats: dict

    def client(self, number: int) -> ClientFaces:
        return next(c for c in self.clients if c.client == number)

    def training_clients(self) -> list[ClientFaces]:
        return [c for c in self.clients if not c.unseen]

    def unseen_clients(self) -> list[ClientFaces]:
        return [c for c in self.clients if c.unseen]


def federated_celeba(
    root: Path | str,
    partition: str = "lognormal",
    *,
    seed: int = 0,
    n_identities: int = N_IDENTITIES,
    n_clients: int = N_CLIENTS,
    min_faces: int = 3,
    sigma: float = 3.0,
    min_identities: int = 1,
    attribute_scale: float = 1.0,
    attribute_clients: Path | str | None = None,
    min_images_per_identity: int = 2,
    cache_dir: Path | str | None = None,
    params: DetectorParams | None = None,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> FederatedFaces:
    """Load, crop and partition a CelebA copy (see the module docstring and
    ``fedcare.data.celeba.identity_partition`` for the rules). partition: "equal", "lognormal" or
    "attribute". Raises DataError (naming the file) for a bad copy, ValueError for bad options
    or too few usable identities."""
    if partition not in PARTITIONS:
        raise InputError(f"partition must be one of {', '.join(PARTITIONS)}, got {partition!r}")
    ds = load_celeba(root)
    cropper = FaceCropper(cache_dir=cache_dir, params=params, workers=workers)
    if partition == "attribute":
        faces = cropper.faces(ds, progress=progress)
        part = attribute_partition(ds.identities[faces.rows], ds.attributes[faces.rows], seed=seed,
                                   clients=attribute_clients, scale=attribute_scale,
                                   min_images_per_identity=min_images_per_identity)
    else:
        all_ids = ds.identity_ids()
        order = selection_order(all_ids, seed)
        steps: list[FaceSet] = []
        eligible = 0
        for start in range(0, len(order), _BATCH):
            step = cropper.faces(ds, order[start : start + _BATCH].tolist())
            steps.append(step)
            counts = np.unique(ds.identities[step.rows], return_counts=True)[1]
            eligible += int((counts >= min_faces).sum())
            if progress is not None:
                progress(min(eligible, n_identities), n_identities)
            if eligible >= n_identities:
                break
        faces = _merge(steps)
        kwargs = dict(seed=seed, n_identities=n_identities, n_clients=n_clients, min_faces=min_faces,
                      candidates=all_ids)
        if partition == "equal":
            part = equal_partition(ds.identities[faces.rows], **kwargs)
        else:
            part = lognormal_partition(ds.identities[faces.rows], sigma=sigma, min_identities=min_identities, **kwargs)
    face_ids = ds.identities[faces.rows]
    clients = []
    for c in part.clients:
        splits = [_split(c, idx, face_ids, faces, part) for idx in (c.train, c.val, c.test)]
        clients.append(ClientFaces(c.client, c.unseen, len(c.identities), *splits))
    return FederatedFaces(ds, faces, part, clients, len(part.global_identities), cropper.stats.as_dict())


def _split(c: ClientSplit, idx: np.ndarray, face_ids: np.ndarray, faces: FaceSet, part: FacePartition) -> FaceSplit:
    return FaceSplit(rows=faces.rows[idx], identities=face_ids[idx], labels=c.local_labels(idx, face_ids),
                     global_labels=part.global_labels(idx, face_ids), faces=faces)


def _merge(sets: list[FaceSet]) -> FaceSet:
    """One FaceSet over the identities of several (disjoint) cropping passes."""
    first = sets[0]
    boxes, entries = {}, {}
    for s in sets:
        boxes.update(s.boxes)
        entries.update(s._entries)

    def cat(name: str) -> np.ndarray:
        return np.sort(np.concatenate([getattr(s, name) for s in sets])).astype(np.int64)

    return FaceSet(first.dataset, first.params, first.detector, cat("rows"), cat("no_face"), cat("unreadable"),
                   boxes, entries)

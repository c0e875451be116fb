"""The privacy audit's data, all synthetic:

- the membership audit's clients (`AuditSite`): each holds few noisy images of a weak class
  pattern with its own offset and 20% of its labels flipped (memorisable), drawn in memory from
  (run seed, client); references `SeededSplit("train", seed)` (the members),
  `SeededSplit("test", seed)` (held out: the non-members) and `Shadow(seed, index)`;
- the gradient inversion's frames (`InversionFrames`): one subject written by fedcare's pain
  generator into the run directory and read back with the pain study's preprocessing.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from fedcare.algorithms.training import ClientData, as_float
from fedcare.runtime.refs import DataRef, SeededSplit
from fedcare.config import ConfigError
from fedcare.seeding import numpy_rng, torch_generator
from fedcare.studies.privacy_audit.config import AuditData
from fedcare.studies.rundir import SYNTHETIC_DIR


def synthetic_client(client: int, seed: int, data: AuditData, shadows: int = 0) -> tuple[ClientData, ...]:
    """(train, held-out, shadow 1, ..., shadow `shadows`) images of one client: a weak class
    pattern, a client-specific offset (so personalisation matters) and much noise; labels
    flipped for 20% (memorisable). The shadow sets (each as large as the training set) are the
    public pool of the client's distribution that LiRA's shadow models train on: drawn after
    the client's own sets from the same generator, so they share its offset and never contain
    a member or a held-out example (and the client's own sets do not depend on them)."""
    g = torch_generator(seed, "privacy-demo", client)
    size = data.image_size
    pattern = torch.zeros(size, size)
    pattern[: size // 2] = 1.0
    n = data.train + data.test
    y = (torch.rand(n, generator=g) < 0.5).float()
    x = 0.6 * torch.randn(n, 1, size, size, generator=g) + 0.3 * y[:, None, None, None] * pattern
    offset = 0.3 * torch.randn(1, 1, size, size, generator=g)  # the client's own
    x += offset
    flip = torch.rand(n, generator=g) < 0.2
    y[flip] = 1 - y[flip]
    sets = [ClientData(x[: data.train], y[: data.train]), ClientData(x[data.train :], y[data.train :])]
    for _ in range(shadows):
        ys = (torch.rand(data.train, generator=g) < 0.5).float()
        xs = 0.6 * torch.randn(data.train, 1, size, size, generator=g) + 0.3 * ys[:, None, None, None] * pattern
        flip = torch.rand(data.train, generator=g) < 0.2
        ys[flip] = 1 - ys[flip]
        sets.append(ClientData(xs + offset, ys))
    return tuple(sets)


@dataclass(frozen=True)
class Shadow(DataRef):
    """LiRA's `index`-th shadow training set of a client (1..shadows) for run seed `seed`."""

    kind: ClassVar[str] = "shadow"
    seed: int
    index: int


class AuditSite:
    """One audit client (a `fedcare.runtime.sites.Site`); its sets are drawn once per run seed."""

    synthetic = True
    data_refs: ClassVar[tuple[type[DataRef], ...]] = (SeededSplit, Shadow)

    def __init__(self, client: int, data: AuditData, shadows: int = 0):
        self.client = client
        self.config = data
        self.shadows = shadows
        self._sets: dict[int, tuple[ClientData, ...]] = {}

    def summary(self) -> dict:
        return {"train": self.config.train, "test": self.config.test}

    def data(self, ref: DataRef) -> ClientData:
        if isinstance(ref, Shadow) and 1 <= ref.index <= self.shadows:
            index = 1 + ref.index
        elif isinstance(ref, SeededSplit) and ref.name in ("train", "test"):
            index = int(ref.name == "test")
        else:
            raise ValueError(f"unknown privacy audit data reference {ref!r}")
        if ref.seed not in self._sets:  # one seed at a time
            self._sets = {ref.seed: synthetic_client(self.client, ref.seed, self.config, self.shadows)}
        return self._sets[ref.seed][index]


# -- the gradient inversion's frames ------------------------------------------------------
INVERSION_SUBJECT, PAIN_FROM = 42, 1.0  # pain = PSPI >= 1, the pain study's threshold


def synthetic_frames(count: int, image_size: int, seed: int, folder: Path | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` synthetic pain frames (B, 1, S, S) in [0, 1] and their labels, drawn from one
    subject written by fedcare's generator into `folder` (kept there: a resumed run reads it
    again; default a temporary folder) and read back by the UNBC loader with the pain study's
    preprocessing (histogram equalisation, centre crop: `fedcare.data.transforms`)."""
    if folder is None:
        with tempfile.TemporaryDirectory(prefix="fedcare-inversion-") as tmp:
            return synthetic_frames(count, image_size, seed, Path(tmp) / "cohort")
    from fedcare.data.unbc.synthetic import generate_pain_cohort
    from fedcare.data.transforms import centre_crop, preprocess
    from fedcare.data.unbc.reader import load_unbc, read_grey

    if not folder.is_dir():  # the generator writes the folder whole or not at all
        folder.parent.mkdir(parents=True, exist_ok=True)
        generate_pain_cohort(folder, seed=seed, subjects=[INVERSION_SUBJECT], frame_scale=0.01,
                             image_size=2 * image_size, min_frames_per_sequence=2)
    sessions: dict[int, list[tuple[np.ndarray, float]]] = {}
    for frame in load_unbc(folder).frames:  # read and preprocessed as the pain study does (black frames dropped)
        grey = read_grey(frame.image)
        if frame.subject == INVERSION_SUBJECT and grey.mean() >= 1.0:
            image = centre_crop(preprocess(grey, image_size), image_size)
            sessions.setdefault(frame.session, []).append((image, float(frame.pspi >= PAIN_FROM)))
    items = [item for s in sorted(sessions) for item in sessions[s]]
    images, labels = np.stack([i for i, _ in items]), np.array([y for _, y in items])
    if len(images) < count:
        raise ConfigError(f"inversion.batch = {count}: the synthetic subject has only {len(images)} frames")
    pick = np.sort(numpy_rng(seed, "inversion-frames").choice(len(images), count, replace=False))
    x = as_float(torch.from_numpy(images[pick]).unsqueeze(1).contiguous())
    return x, torch.from_numpy(labels[pick].astype(np.float32))


class InversionFrames:
    """The attacked batch of each run seed, its subject generated into the run directory."""

    def __init__(self, workdir: Path, count: int, image_size: int):
        self.workdir, self.count, self.image_size = Path(workdir), count, image_size

    def batch(self, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        folder = self.workdir / SYNTHETIC_DIR / f"inversion-subject-seed{seed}"
        return synthetic_frames(self.count, self.image_size, seed, folder)

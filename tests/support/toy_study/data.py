"""The toy study's data: points around one centre per identity, one file per client, and the
site that reads a client's file (`Split("train")` and `Split("test")` halves of it)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from fedcare.algorithms.training import ClientData
from fedcare.data.common import SYNTHETIC_MARKER, DataError
from fedcare.runtime.refs import Split


def generate(out: Path, clients: int, identities: int, examples: int, seed: int = 0) -> Path:
    """client-<k>.npz with x (examples, 8) and y (identity labels, global over clients)."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clients * identities, 8)) * 3
    for k in range(clients):
        ids = np.repeat(np.arange(k * identities, (k + 1) * identities), examples)
        x = centres[ids] + rng.normal(size=(len(ids), 8))
        np.savez(out / f"client-{k}.npz", x=x.astype(np.float32), y=ids)
    (out / SYNTHETIC_MARKER).write_text(json.dumps({"generator": "toy"}))
    return out


class ToySite:
    data_refs = (Split,)  # Split("train"), Split("test")

    def __init__(self, client: int, root: Path):
        path = Path(root) / f"client-{client}.npz"
        if not path.is_file():
            raise DataError(f"{path}: no such file")
        arrays = np.load(path)
        self.client = client
        self.synthetic = (Path(root) / SYNTHETIC_MARKER).is_file()
        x, y = torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"])
        half = torch.arange(len(y)) % 2 == 0
        self.sets = {"train": ClientData(x[half], y[half]), "test": ClientData(x[~half], y[~half])}

    def summary(self) -> dict:
        return {"train": len(self.sets["train"])}

    def data(self, ref: Split) -> ClientData:
        return self.sets[ref.name]

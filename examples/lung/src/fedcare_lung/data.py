"""The lung study's data: the patients of lifelines' NCCTG lung cancer table, their one-year
status, the clients (one per institution), and a site's data by reference.

- **Label**: died within `horizon_days` of entry (1), or known alive at that day (0); a
  patient censored before it has no known status and is left out, as is the one patient
  without an institution.
- **Clients**: an institution with at least `min_patients` patients of known status is a
  client ("inst<k>"); the smaller ones form one client "other" (or are left out).
- **Features**: age, sex, ECOG and Karnofsky scores (physician's and patient's), calories per
  meal, weight loss. A site fills a missing value with the median of its own training split and
  standardises with its own training split's mean and SD: no number leaves the site.
- **Splits**: each client's patients split into train and test per run seed, stratified by the
  label, from the site's own generator (seed, "split", client).
"""

from __future__ import annotations

import csv
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedcare.api import ClientData, DataError, SeededSplit, numpy_rng, parse_data_ref

FILE = "lung.csv"
FEATURES = ("age", "sex", "ph.ecog", "ph.karno", "pat.karno", "meal.cal", "wt.loss")
COLUMNS = ("inst", "time", "status", *FEATURES)
OTHER = "other"


@dataclass
class Patients:
    institution: np.ndarray  # int
    x: np.ndarray  # (n, len(FEATURES)) float, NaN where missing
    y: np.ndarray  # 0/1 float: died within the horizon
    left_out: dict[str, int]  # why patients were left out -> how many


def lifelines_copy() -> Path:
    """lung.csv inside the installed lifelines package, found without importing it."""
    spec = importlib.util.find_spec("lifelines")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("lifelines is not installed (pip install lifelines), and data.root names no copy of lung.csv")
    return Path(spec.submodule_search_locations[0]) / "datasets" / FILE


def read_patients(path: Path, horizon_days: int) -> Patients:
    """The patients of a lung.csv; DataError naming the file for a missing file or column or a
    value that is not a number."""
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    missing = [c for c in COLUMNS if rows and c not in rows[0]]
    if not rows or missing:
        raise DataError(f"{path}: no patients, or no column {', '.join(missing)}")

    def number(row: dict, column: str, line: int) -> float:
        text = (row[column] or "").strip()
        try:
            return float(text) if text and text != "NA" else np.nan
        except ValueError:
            raise DataError(f"{path}: line {line}: {column} = {text!r} is not a number") from None

    table = np.array([[number(r, c, i) for c in COLUMNS] for i, r in enumerate(rows, start=2)])
    inst, time, status = table[:, 0], table[:, 1], table[:, 2]
    died = (status == 1) & (time <= horizon_days)
    known = died | (time > horizon_days)
    keep = known & ~np.isnan(inst)
    left_out = {f"censored before day {horizon_days}": int((~known).sum()),
                "no institution": int((known & np.isnan(inst)).sum())}
    x = table[keep, 3:].copy()
    x[:, 1] -= 1  # sex: 1 male, 2 female -> 0/1
    return Patients(inst[keep].astype(int), x, died[keep].astype(np.float32), left_out)


def client_of(patients: Patients, min_patients: int, small_sites: str) -> np.ndarray:
    """Each patient's client ("inst<k>", "other", or "" when left out)."""
    institutions, counts = np.unique(patients.institution, return_counts=True)
    big = {int(i) for i, n in zip(institutions, counts) if n >= min_patients}
    small = OTHER if small_sites == "merge" else ""
    return np.array([f"inst{i}" if i in big else small for i in patients.institution])


def split(y: np.ndarray, test_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices, stratified: each label's share of the test set as near
    `test_fraction` as whole patients allow, at least one of each label left for training."""
    train, test = [], []
    for label in (0.0, 1.0):
        index = rng.permutation(np.flatnonzero(y == label))
        n_test = min(int(round(test_fraction * len(index))), max(len(index) - 1, 0))
        test += list(index[:n_test])
        train += list(index[n_test:])
    return np.sort(train), np.sort(test)


class LungSite:
    """One client's patients (a `fedcare.api.Site`): `SeededSplit("train" or "test", seed)` is
    its split for that run seed, imputed and standardised from its own training split."""

    synthetic = False
    data_refs = (SeededSplit,)

    def __init__(self, client: str, x: np.ndarray, y: np.ndarray, test_fraction: float):
        if len(y) < 4 or len(np.unique(y)) < 2:
            raise DataError(f"client {client}: {len(y)} patients of known status, {int(y.sum())} of whom died: "
                            "too few to split into training and test data")
        self.client, self.x, self.y, self.test_fraction = client, x, y, test_fraction

    def summary(self) -> dict:
        return {"patients": len(self.y)}

    def data(self, ref: SeededSplit) -> ClientData:
        which, seed = parse_data_ref(ref)
        train, test = split(self.y, self.test_fraction, numpy_rng(seed, "split", self.client))
        fit = self.x[train]
        median = np.nan_to_num(np.nanmedian(fit, axis=0))  # a column missing at every training patient: 0
        filled = np.where(np.isnan(self.x), median, self.x)
        mean, sd = filled[train].mean(axis=0), filled[train].std(axis=0)
        z = (filled - mean) / np.where(sd > 0, sd, 1.0)
        rows = train if which == "train" else test
        return ClientData(torch.from_numpy(z[rows].astype(np.float32)), torch.from_numpy(self.y[rows]))


def sites(path: Path, horizon_days: int, min_patients: int, small_sites: str, test_fraction: float,
          only: str | None = None) -> tuple[dict[str, LungSite], Patients]:
    """Every client's site (or only client `only`'s) from one lung.csv, and its patients."""
    patients = read_patients(path, horizon_days)
    clients = client_of(patients, min_patients, small_sites)
    names = sorted({str(c) for c in clients if c and (only is None or c == only)})  # plain str: checkpoints keep them
    if only is not None and not names:
        raise DataError(f"{path}: no patients of client {only!r} (clients here: {', '.join(sorted(set(clients) - {''}))})")
    return {c: LungSite(c, patients.x[clients == c], patients.y[clients == c], test_fraction) for c in names}, patients

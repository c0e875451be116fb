"""The Hess thesis's three client partitions of face images: equal, lognormal and attribute.

Every function works on arrays of *samples* (one per face image): ``identities[i]`` is sample
i's person and ``attributes[i]`` its 40 CelebA attributes (bool, ``celeba.ATTRIBUTES`` order).
Sample indices in the results refer to those arrays. Nothing here reads files or images.

Conventions (where the thesis is silent, the choice is stated here):

* **Clients** are numbered 1..20 as in the thesis. Clients 16-20 are the **unseen** clients
  (``UNSEEN_CLIENTS``): they never take part in federated training; their train split is only
  for local tuning. ``FacePartition.training_clients()`` lists clients 1-15.
* **Seeds**: one int seed; every random choice draws from its own stream
  ``np.random.default_rng([seed, stream, ...])`` (selection 1, assignment 2, lognormal sizes 3,
  per-identity splits 4, attribute sampling 5), so changing one step leaves the others alone.
* **Identity selection** (equal, lognormal): a seeded permutation of all identity ids (sorted
  first) is walked, and identities with at least ``min_faces`` samples (default 3: one each for
  train, validation and test) are taken until ``n_identities`` (1,500) are selected
  (``selection_order``, ``select_identities``).
* **Equal**: the selected identities, shuffled, are cut into 20 consecutive groups of 75 (when
  20 does not divide C, sizes differ by one, by largest remainder).
* **Lognormal** (thesis Eq. 3.1): ``S_i ~ lognormal(mu=3, sigma=3)`` for the 20 clients; client i
  gets ``C * S_i / sum(S)`` whole identities, rounded by **largest remainder**: every client gets
  the floor, and the ``C - sum(floors)`` identities left go one each to the clients with the
  largest fractional parts (ties: lower client number), so the counts sum exactly to C. With
  sigma = 3 a client can round to 0; then, so that every client has data, a client below
  ``min_identities`` (default 1) takes identities one at a time from the client holding the most
  (ties: lower number). The identities are the shuffled selection cut in client order.
* **Per-identity split** (all partitions): each identity's samples on a client, shuffled, are
  split 70/10/20 into train/val/test: ``n_test = floor(0.2 n + 0.5)``, ``n_val = floor(0.1 n + 0.5)``,
  at least one test sample when n >= 2 and one validation sample when n >= 3, the rest (at least
  one) train. So every identity with >= 3 samples is in all three splits.
* **Attribute** (Table 4.1, ``celeba_attribute_clients.toml``): a client's candidates are the
  samples matching every attribute of its filter. **De-duplication**: clients are served one
  after the other, the client with the fewest candidates first (ties: lower number); each takes
  only samples no earlier client took, so every image is on at most one client and a narrow
  filter is not emptied by a broad one that overlaps it (clients 11 and 12 are subsets of 10).
  **Sampling**: the client's untaken candidates are grouped by identity; groups with fewer than
  ``min_images_per_identity`` (default 2) samples are skipped (a class needs a train and a test
  image); the groups, in a seeded random order, are taken whole while the client holds fewer
  than its target ``round(size * scale)`` (Table 4.1 sizes, ``scale=1``), so a client overshoots
  its target by less than one identity's images, or holds all it can get when candidates run
  short. An identity may end up on several clients (different images), as in the thesis.
* **Labels**: ``ClientSplit.identities`` are the client's person ids, sorted; a sample's local
  label is its person's position there (a local ArcFace head). Global labels number the persons
  in order of first appearance over clients 1..20 (each client's persons sorted): clients 1, 2,
  ... get consecutive blocks, as in the thesis's example; in the attribute partition a person on
  two clients keeps one global label.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedcare.data.celeba.reader import ATTRIBUTES
from fedcare.data.common import DataError
from fedcare.errors import InputError

__all__ = [
    "ATTRIBUTE_CLIENTS_FILE", "N_CLIENTS", "N_IDENTITIES", "SPLIT_FRACTIONS", "TABLE_4_2", "UNSEEN_CLIENTS",
    "AttributeClient", "ClientSplit", "FacePartition", "attribute_partition", "equal_partition",
    "largest_remainder", "load_attribute_clients", "lognormal_counts", "lognormal_partition",
    "select_identities", "selection_order", "split_sizes",
]

N_CLIENTS = 20
N_IDENTITIES = 1500
UNSEEN_CLIENTS: tuple[int, ...] = (16, 17, 18, 19, 20)
SPLIT_FRACTIONS = (0.7, 0.1, 0.2)  # train, validation, test, per identity
LOGNORMAL_MU, LOGNORMAL_SIGMA = 3.0, 3.0
ATTRIBUTE_CLIENTS_FILE = Path(__file__).parent.parent / "celeba_attribute_clients.toml"  # data/: package data

# Thesis Table 4.2: the lognormal partition's (train, test) images per client, for comparison.
TABLE_4_2: dict[int, tuple[int, int]] = {
    1: (134, 32), 2: (1488, 376), 3: (748, 184), 4: (95, 23), 5: (259, 66), 6: (2585, 650), 7: (27, 7),
    8: (346, 86), 9: (1955, 495), 10: (220, 58), 11: (264, 65), 12: (389, 99), 13: (2203, 554), 14: (222, 54),
    15: (287, 69), 16: (276, 71), 17: (4657, 1163), 18: (4307, 1076), 19: (1326, 334), 20: (773, 196),
}

_SELECT, _ASSIGN, _SIZES, _SPLIT, _ATTR = 1, 2, 3, 4, 5


@dataclass
class ClientSplit:
    """One client's samples (indices into the arrays given to the partition function)."""

    client: int  # 1-based, as in the thesis
    unseen: bool  # clients 16-20: never trained on
    identities: np.ndarray  # sorted person ids on this client; local label = position here
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    target: int | None = None  # attribute partition: the wanted number of images
    candidates: int | None = None  # attribute partition: samples matching the filter (before de-duplication)

    @property
    def samples(self) -> np.ndarray:
        return np.sort(np.concatenate([self.train, self.val, self.test]))

    def local_labels(self, indices: np.ndarray, identities: np.ndarray) -> np.ndarray:
        """Local class (0..len(self.identities)-1) of these samples."""
        ids = identities[np.asarray(indices, np.int64)]
        labels = np.searchsorted(self.identities, ids)
        if len(ids) and (labels.max() >= len(self.identities) or np.any(self.identities[labels] != ids)):
            raise ValueError(f"client {self.client}: a sample's identity is not on this client")
        return labels


@dataclass
class FacePartition:
    kind: str  # "equal", "lognormal" or "attribute"
    seed: int
    clients: list[ClientSplit]
    info: dict = field(default_factory=dict)  # e.g. the lognormal draws S_i

    def client(self, number: int) -> ClientSplit:
        for c in self.clients:
            if c.client == number:
                return c
        raise KeyError(f"no client {number} (clients are {[c.client for c in self.clients]})")

    def training_clients(self) -> list[ClientSplit]:
        """Clients that take part in federated training (1-15)."""
        return [c for c in self.clients if not c.unseen]

    def unseen_clients(self) -> list[ClientSplit]:
        """Clients 16-20: evaluated (and locally tuned) only."""
        return [c for c in self.clients if c.unseen]

    def federated_train_indices(self) -> dict[int, np.ndarray]:
        """client -> train split, for the clients that train (the unseen clients are absent)."""
        return {c.client: c.train for c in self.training_clients()}

    @property
    def global_identities(self) -> np.ndarray:
        """Person ids in global-label order (first appearance over clients in order)."""
        seen: dict[int, int] = {}
        for c in self.clients:
            for person in c.identities.tolist():
                seen.setdefault(int(person), len(seen))
        return np.array(list(seen), np.int64)

    def global_labels(self, indices: np.ndarray, identities: np.ndarray) -> np.ndarray:
        order = self.global_identities
        position = {int(p): i for i, p in enumerate(order)}
        return np.array([position[int(p)] for p in identities[np.asarray(indices, np.int64)]], np.int64)

    def sizes(self) -> dict[int, dict[str, int]]:
        return {c.client: {"identities": len(c.identities), "train": len(c.train), "val": len(c.val),
                           "test": len(c.test)} for c in self.clients}


# --------------------------------------------------------------------------- building blocks


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def largest_remainder(total: int, weights: Sequence[float] | np.ndarray) -> np.ndarray:
    """Integers proportional to `weights` that sum exactly to `total`: the floors, plus one for
    each of the largest fractional parts (ties: lower index)."""
    w = np.asarray(weights, np.float64)
    if total < 0 or len(w) == 0 or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"largest_remainder: need total >= 0 and non-negative weights with a positive sum, got {total}, {w}")
    exact = total * w / w.sum()
    out = np.floor(exact).astype(np.int64)
    rest = total - int(out.sum())
    out[np.argsort(-(exact - out), kind="stable")[:rest]] += 1
    return out


def split_sizes(n: int, fractions: Sequence[float] = SPLIT_FRACTIONS) -> tuple[int, int, int]:
    """(train, val, test) sizes of one identity's n samples (see the module docstring)."""
    _, f_val, f_test = fractions
    test = math.floor(f_test * n + 0.5)
    val = math.floor(f_val * n + 0.5)
    if n >= 2:
        test = max(test, 1)
    if n >= 3:
        val = max(val, 1)
    while n >= 1 and n - test - val < 1:
        if val > 0:
            val -= 1
        else:
            test -= 1
    return n - test - val, val, test


def _split(samples_by_person: dict[int, np.ndarray], seed: int, client: int) -> tuple[np.ndarray, ...]:
    parts: list[list[np.ndarray]] = [[], [], []]
    for person in sorted(samples_by_person):
        idx = np.sort(samples_by_person[person])
        idx = np.random.default_rng([seed, _SPLIT, client, person]).permutation(idx)
        n_train, n_val, _ = split_sizes(len(idx))
        for part, chunk in zip(parts, (idx[:n_train], idx[n_train : n_train + n_val], idx[n_train + n_val :])):
            part.append(chunk)
    return tuple(np.sort(np.concatenate(p)).astype(np.int64) if p else np.zeros(0, np.int64) for p in parts)


def _by_person(indices: np.ndarray, identities: np.ndarray) -> dict[int, np.ndarray]:
    indices = np.asarray(indices, np.int64)
    ids = identities[indices]
    order = np.argsort(ids, kind="stable")
    uniq, starts = np.unique(ids[order], return_index=True)
    return {int(p): indices[g] for p, g in zip(uniq, np.split(order, starts[1:]))}


def selection_order(identity_ids: Sequence[int] | np.ndarray, seed: int) -> np.ndarray:
    """The order in which identities are considered for selection: a seeded permutation of the
    sorted distinct ids."""
    ids = np.unique(np.asarray(identity_ids, np.int64))
    return np.random.default_rng([_check_seed(seed), _SELECT]).permutation(ids)


def select_identities(identities: np.ndarray, n_identities: int, seed: int, *, min_faces: int = 3,
                      candidates: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """The first `n_identities` persons of ``selection_order(candidates)`` with at least
    `min_faces` samples in `identities` (the per-sample person ids); candidates default to the
    persons in `identities`. ValueError when too few persons qualify."""
    identities = np.asarray(identities, np.int64)
    counts = dict(zip(*(a.tolist() for a in np.unique(identities, return_counts=True))))
    pool = np.unique(identities) if candidates is None else np.asarray(candidates, np.int64)
    chosen = [p for p in selection_order(pool, seed).tolist() if counts.get(p, 0) >= min_faces][:n_identities]
    if len(chosen) < n_identities:
        raise InputError(f"only {len(chosen)} identities have >= {min_faces} face images; {n_identities} were asked "
                         f"for (use fewer identities or a lower min_faces)")
    return np.array(chosen, np.int64)


def lognormal_counts(n_identities: int, n_clients: int, seed: int, *, mu: float = LOGNORMAL_MU,
                     sigma: float = LOGNORMAL_SIGMA, min_identities: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(identities per client, the draws S) of the lognormal partition (see the module docstring)."""
    if n_identities < n_clients * min_identities:
        raise InputError(f"{n_identities} identities cannot give {n_clients} clients {min_identities} each")
    s = np.random.default_rng([_check_seed(seed), _SIZES]).lognormal(mu, sigma, size=n_clients)
    counts = largest_remainder(n_identities, s)
    for k in range(n_clients):
        while counts[k] < min_identities:
            donor = int(np.argmax(counts))  # argmax: the lowest number among ties
            counts[donor] -= 1
            counts[k] += 1
    return counts, s


def _identity_partition(kind: str, identities: np.ndarray, counts: np.ndarray, seed: int, n_identities: int,
                        min_faces: int, candidates, info: dict) -> FacePartition:
    identities = np.asarray(identities, np.int64)
    chosen = select_identities(identities, n_identities, seed, min_faces=min_faces, candidates=candidates)
    shuffled = np.random.default_rng([seed, _ASSIGN]).permutation(chosen)
    groups = np.split(shuffled, np.cumsum(counts)[:-1])
    samples = _by_person(np.arange(len(identities)), identities)
    clients = []
    for k, people in enumerate(groups, start=1):
        train, val, test = _split({int(p): samples[int(p)] for p in people}, seed, k)
        clients.append(ClientSplit(k, k in UNSEEN_CLIENTS, np.sort(people), train, val, test))
    return FacePartition(kind, seed, clients, info)


def equal_partition(identities: np.ndarray, *, seed: int = 0, n_identities: int = N_IDENTITIES,
                    n_clients: int = N_CLIENTS, min_faces: int = 3,
                    candidates: Sequence[int] | np.ndarray | None = None) -> FacePartition:
    """Equal class partition: ``n_identities`` selected persons, ``n_identities / n_clients``
    (75) per client, each person's samples split 70/10/20."""
    seed = _check_seed(seed)
    counts = largest_remainder(n_identities, np.ones(n_clients))
    return _identity_partition("equal", identities, counts, seed, n_identities, min_faces, candidates,
                               {"identities_per_client": counts.tolist()})


def lognormal_partition(identities: np.ndarray, *, seed: int = 0, n_identities: int = N_IDENTITIES,
                        n_clients: int = N_CLIENTS, mu: float = LOGNORMAL_MU, sigma: float = LOGNORMAL_SIGMA,
                        min_identities: int = 1, min_faces: int = 3,
                        candidates: Sequence[int] | np.ndarray | None = None) -> FacePartition:
    """Lognormal class partition (thesis Eq. 3.1; see the module docstring)."""
    seed = _check_seed(seed)
    counts, s = lognormal_counts(n_identities, n_clients, seed, mu=mu, sigma=sigma, min_identities=min_identities)
    return _identity_partition("lognormal", identities, counts, seed, n_identities, min_faces, candidates,
                               {"identities_per_client": counts.tolist(), "S": s.tolist(), "mu": mu, "sigma": sigma})


# --------------------------------------------------------------------------- attribute partition


@dataclass(frozen=True)
class AttributeClient:
    client: int
    size: int
    filter: dict[str, bool]


def load_attribute_clients(path: Path | str | None = None) -> list[AttributeClient]:
    """The clients' attribute filters from a TOML file (default: Table 4.1,
    ``celeba_attribute_clients.toml``). DataError naming the file and the key for an unknown
    attribute, a non-boolean value or a missing field."""
    path = Path(path) if path is not None else ATTRIBUTE_CLIENTS_FILE
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise DataError(f"{path}: not valid TOML ({e})") from None
    entries = data.get("client")
    if not isinstance(entries, list) or not entries:
        raise DataError(f"{path}: expected [[client]] tables")
    out, seen = [], set()
    for i, entry in enumerate(entries, start=1):
        where = f"{path}: [[client]] #{i}"
        extra = sorted(set(entry) - {"client", "size", "filter"})
        if extra:
            raise DataError(f"{where}: unknown key {extra[0]!r} (expected client, size, filter)")
        number, size, flt = entry.get("client"), entry.get("size"), entry.get("filter")
        if not isinstance(number, int) or number < 1 or number in seen:
            raise DataError(f"{where}: 'client' must be a new positive integer, got {number!r}")
        if not isinstance(size, int) or size < 1:
            raise DataError(f"{where}: 'size' must be a positive integer, got {size!r}")
        if not isinstance(flt, dict) or not flt:
            raise DataError(f"{where}: 'filter' must be a table of attribute = true/false")
        for key, value in flt.items():
            if key not in ATTRIBUTES:
                close = difflib.get_close_matches(key, ATTRIBUTES, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise DataError(f"{where} (client {number}): filter key {key!r} is not a CelebA attribute{hint}")
            if not isinstance(value, bool):
                raise DataError(f"{where} (client {number}): filter.{key} must be true or false, got {value!r}")
        seen.add(number)
        out.append(AttributeClient(number, size, dict(flt)))
    return out


def attribute_partition(identities: np.ndarray, attributes: np.ndarray, *, seed: int = 0,
                        clients: Sequence[AttributeClient] | Path | str | None = None, scale: float = 1.0,
                        min_images_per_identity: int = 2, unseen: Sequence[int] = UNSEEN_CLIENTS) -> FacePartition:
    """Attribute-based partition (thesis Table 4.1; de-duplication and sampling rules in the
    module docstring). `attributes` is (n, 40) bool; `clients` the filters (default Table 4.1)
    or a TOML path; targets are ``round(size * scale)``."""
    seed = _check_seed(seed)
    identities = np.asarray(identities, np.int64)
    attributes = np.asarray(attributes, bool)
    if attributes.shape != (len(identities), len(ATTRIBUTES)):
        raise ValueError(f"attributes must have shape ({len(identities)}, {len(ATTRIBUTES)}), got {attributes.shape}")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale!r}")
    specs = list(clients) if isinstance(clients, Sequence) and not isinstance(clients, str) else \
        load_attribute_clients(clients)
    match = {}
    for spec in specs:
        ok = np.ones(len(identities), bool)
        for key, value in spec.filter.items():
            ok &= attributes[:, ATTRIBUTES.index(key)] == value
        match[spec.client] = ok
    taken = np.zeros(len(identities), bool)
    result: dict[int, ClientSplit] = {}
    for spec in sorted(specs, key=lambda s: (int(match[s.client].sum()), s.client)):
        target = max(1, int(round(spec.size * scale)))
        groups = _by_person(np.flatnonzero(match[spec.client] & ~taken), identities)
        people = [p for p in sorted(groups) if len(groups[p]) >= min_images_per_identity]
        chosen: dict[int, np.ndarray] = {}
        held = 0
        for p in np.random.default_rng([seed, _ATTR, spec.client]).permutation(np.array(people, np.int64)).tolist():
            if held >= target:
                break
            chosen[p] = groups[p]
            held += len(groups[p])
        for idx in chosen.values():
            taken[idx] = True
        train, val, test = _split(chosen, seed, spec.client)
        result[spec.client] = ClientSplit(spec.client, spec.client in unseen, np.array(sorted(chosen), np.int64),
                                          train, val, test, target=target, candidates=int(match[spec.client].sum()))
    info = {"scale": scale, "min_images_per_identity": min_images_per_identity,
            "service_order": [s.client for s in sorted(specs, key=lambda s: (int(match[s.client].sum()), s.client))]}
    return FacePartition("attribute", seed, [result[k] for k in sorted(result)], info)

"""Client partitioners shared by the studies.

Every partitioner is deterministic given the numpy Generator passed in (callers derive it with
``fedcare.seeding.numpy_rng(seed, "partition")``; nothing here touches global RNG state) and
returns ``list[np.ndarray]``: one sorted int64 array of sample indices per client. Every sample
is assigned to exactly one client unless a function's docstring says otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedcare.errors import InputError

__all__ = [
    "dirichlet_label_split",
    "iid_split",
    "natural_split",
    "quantity_skew_split",
    "train_test_split_per_client",
]

DIRICHLET_MAX_TRIES = 1000


def _check_clients(n: int, n_clients: int, min_size: int = 1) -> None:
    if int(n_clients) != n_clients or n_clients < 1:
        raise ValueError(f"n_clients must be a positive integer, got {n_clients!r}")
    if n < n_clients * min_size:
        raise InputError(f"cannot give {n_clients} clients at least {min_size} sample(s) each from {n} samples")


def _sorted(parts: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def dirichlet_label_split(
    labels: Sequence[int] | np.ndarray,
    n_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 10,
    max_tries: int = DIRICHLET_MAX_TRIES,
    scheme: str = "classic",
) -> list[np.ndarray]:
    """Label-skewed split (Yurochkin et al. 2019; the per-class Dirichlet allocation of
    NIID-Bench / FedLab / PersonalizedFL).

    ``scheme="classic"``: for every class c (in sorted label order) the class's samples are
    shuffled and cut among the clients in proportions p_c ~ Dir(alpha, ..., alpha). As in the
    common implementation, a client that already holds at least n / n_clients samples gets
    proportion 0 for the remaining classes of that draw ("balance"), which keeps client sizes
    from exploding at small alpha. No empty client: the whole draw is repeated until every
    client holds at least ``min(min_size, n // n_clients)`` samples, at most ``max_tries``
    times; then ValueError. Small alpha -> few classes per client; large alpha -> close to IID.

    ``scheme="pairs"`` is the FedHealth 2 authors' variant ([code] PersonalizedFL, after
    epfml/quasi-global-momentum): the shuffled samples are cut into ceil(N/2) chunks of
    int(2n/N) samples (the last takes the rest) and each chunk is split between 2 clients (1
    for the last chunk if N is odd) by the per-class Dirichlet above; a chunk's draw is repeated
    until each of its clients holds at least half of an equal share (their rule; ``min_size``
    is not used). Unlike the classic form it stays feasible for alpha -> 0 with fewer classes
    than clients (e.g. alpha = 0.01, 10 classes, 20 clients), where the classic form can leave
    at most one client per class non-empty and raises. Its skew is milder: the balance rule
    caps each client of a pair at half the chunk, so a client typically holds several classes.
    """
    if scheme not in ("classic", "pairs"):
        raise ValueError(f"scheme must be 'classic' or 'pairs', got {scheme!r}")
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {y.shape}")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha!r}")
    n = len(y)
    _check_clients(n, n_clients)
    if scheme == "pairs":
        return _dirichlet_pairs(y, n_clients, float(alpha), rng, max_tries)
    need = max(1, min(int(min_size), n // n_clients))
    return _dirichlet_classic(np.arange(n), y, n_clients, float(alpha), rng, need, max_tries)


def _dirichlet_classic(index: np.ndarray, y: np.ndarray, n_clients: int, alpha: float,
                       rng: np.random.Generator, need: int, max_tries: int) -> list[np.ndarray]:
    n = len(index)
    by_class = [index[y == c] for c in np.unique(y)]
    cap = n / n_clients
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        sizes = np.zeros(n_clients, dtype=np.int64)
        for idx in by_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(n_clients, alpha))
            p = p * (sizes < cap)
            if p.sum() <= 0:  # every client full (only from rounding): spread this class uniformly
                p = np.ones(n_clients)
            p = p / p.sum()
            cuts = (np.cumsum(p) * len(idx)).astype(np.int64)[:-1]
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].append(chunk)
                sizes[client] += len(chunk)
        if sizes.min() >= need:
            return _sorted([np.concatenate(p) for p in parts])
    raise InputError(
        f"dirichlet_label_split: no split with every one of {n_clients} clients holding >= {need} samples "
        f"after {max_tries} draws (alpha={alpha}, {n} samples); lower min_size, raise alpha, use fewer "
        f"clients or scheme='pairs'"
    )


def _dirichlet_pairs(y: np.ndarray, n_clients: int, alpha: float, rng: np.random.Generator,
                     max_tries: int) -> list[np.ndarray]:
    n = len(y)
    order = rng.permutation(n)
    n_chunks = -(-n_clients // 2)
    step = int(2 / n_clients * n)
    parts: list[np.ndarray] = []
    for k in range(n_chunks):
        chunk = order[k * step :] if k == n_chunks - 1 else order[k * step : (k + 1) * step]
        workers = min(2, n_clients - 2 * k)
        need = max(1, int(0.5 * len(chunk) / workers))
        parts += _dirichlet_classic(chunk, y[chunk], workers, alpha, rng, need, max_tries)
    return parts


def natural_split(groups: Sequence | np.ndarray) -> list[np.ndarray]:
    """One client per natural id (subject, site, ...): client k holds the samples whose group is
    the k-th id in sorted order (``np.unique(groups)`` gives the ids)."""
    g = np.asarray(groups)
    if g.ndim != 1:
        raise ValueError(f"groups must be one-dimensional, got shape {g.shape}")
    if len(g) == 0:
        raise ValueError("groups is empty")
    ids, inverse = np.unique(g, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse, minlength=len(ids)))[:-1]
    return _sorted(np.split(order, bounds))


def iid_split(n: int, n_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A random permutation cut into n_clients near-equal parts (sizes differ by at most 1)."""
    _check_clients(n, n_clients)
    return _sorted(np.array_split(rng.permutation(n), n_clients))


def quantity_skew_split(n: int, n_clients: int, sigma: float, rng: np.random.Generator,
                        min_size: int = 1) -> list[np.ndarray]:
    """Quantity skew with IID labels: client sizes proportional to LogNormal(0, sigma) draws
    (sigma = 0 gives equal sizes; larger sigma, more unequal), rounded by largest remainder on top
    of ``min_size`` samples per client; the samples are a random permutation cut at those sizes."""
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma!r}")
    _check_clients(n, n_clients, min_size)
    weights = rng.lognormal(0.0, float(sigma), size=n_clients)
    spare = n - n_clients * min_size
    share = weights / weights.sum() * spare
    sizes = np.floor(share).astype(np.int64)
    rest = spare - int(sizes.sum())
    sizes[np.argsort(-(share - sizes), kind="stable")[:rest]] += 1
    sizes += min_size
    return _sorted(np.split(rng.permutation(n), np.cumsum(sizes)[:-1]))


def train_test_split_per_client(
    indices: Sequence[int] | np.ndarray,
    test_fraction: float,
    rng: np.random.Generator,
    labels: Sequence[int] | np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Split one client's sample indices into (train, test), both sorted.

    ``round(test_fraction * n)`` samples go to test (FedHealth 2: 0.5), clamped so that a client
    with >= 2 samples keeps at least one of each; a client with one sample keeps it for training.
    With ``labels`` (indexed by sample index, i.e. ``labels[indices]`` are this client's labels)
    the split is done per class (stratified, like the authors' "evenly" split); a class with a
    single sample goes to train.
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    idx = np.asarray(indices, dtype=np.int64)

    def cut(part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        part = rng.permutation(part)
        n = len(part)
        k = 0 if n < 2 else min(max(round(test_fraction * n), 1), n - 1)
        return part[k:], part[:k]

    if labels is None:
        train, test = cut(idx)
    else:
        y = np.asarray(labels)[idx]
        pieces = [cut(idx[y == c]) for c in np.unique(y)]
        train = np.concatenate([p[0] for p in pieces]) if pieces else idx[:0]
        test = np.concatenate([p[1] for p in pieces]) if pieces else idx[:0]
    return np.sort(train), np.sort(test)

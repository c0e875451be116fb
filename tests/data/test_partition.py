"""Client partitioners: coverage, determinism and the skew each one is meant to produce."""

import numpy as np
import pytest

from fedcare.data.partition import (
    dirichlet_label_split,
    iid_split,
    natural_split,
    quantity_skew_split,
    train_test_split_per_client,
)
from fedcare.seeding import numpy_rng


def _labels(n=2000, classes=10, seed=0):
    return np.random.default_rng(seed).integers(0, classes, size=n)


def _assert_partition(parts, n):
    assert all(p.dtype == np.int64 for p in parts)
    joined = np.concatenate(parts)
    assert len(joined) == n  # nothing assigned twice ...
    assert np.array_equal(np.sort(joined), np.arange(n))  # ... nothing left out
    assert all(np.array_equal(p, np.sort(p)) for p in parts)


def _max_class_share(parts, y):
    return float(np.mean([np.bincount(y[p], minlength=10).max() / len(p) for p in parts]))


def _entropy(parts, y):
    out = []
    for p in parts:
        q = np.bincount(y[p], minlength=10) / len(p)
        q = q[q > 0]
        out.append(-(q * np.log(q)).sum())
    return float(np.mean(out))


@pytest.mark.parametrize(
    "split",
    [
        lambda y, rng: dirichlet_label_split(y, 20, 0.1, rng),
        lambda y, rng: dirichlet_label_split(y, 20, 10.0, rng),
        lambda y, rng: iid_split(len(y), 20, rng),
        lambda y, rng: quantity_skew_split(len(y), 20, 1.0, rng),
    ],
    ids=["dirichlet-0.1", "dirichlet-10", "iid", "quantity"],
)
def test_every_sample_once_and_deterministic_from_the_seed(split):
    y = _labels()
    a = split(y, numpy_rng(7, "partition"))
    _assert_partition(a, len(y))
    assert len(a) == 20 and min(len(p) for p in a) >= 1
    b = split(y, numpy_rng(7, "partition"))
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    c = split(y, numpy_rng(8, "partition"))
    assert any(not np.array_equal(p, q) for p, q in zip(a, c))


def test_dirichlet_small_alpha_skews_labels_far_more_than_large_alpha():
    y = _labels(3000)
    skewed = dirichlet_label_split(y, 20, 0.05, numpy_rng(0, "partition"))
    flat = dirichlet_label_split(y, 20, 100.0, numpy_rng(0, "partition"))
    assert _max_class_share(skewed, y) > 0.5  # most of a client's samples from one class
    assert _max_class_share(flat, y) < 0.2  # close to the 0.1 of IID labels
    assert _entropy(skewed, y) < 0.5 * _entropy(flat, y)
    assert _entropy(flat, y) > 0.9 * np.log(10)


def test_dirichlet_guarantees_min_size_and_refuses_the_impossible():
    y = _labels(600)
    parts = dirichlet_label_split(y, 20, 0.1, numpy_rng(1, "partition"), min_size=10)
    assert min(len(p) for p in parts) >= 10
    with pytest.raises(ValueError, match="scheme='pairs'"):  # 10 classes cannot feed 20 clients at alpha -> 0
        dirichlet_label_split(y, 20, 0.001, numpy_rng(1, "partition"), max_tries=20)
    with pytest.raises(ValueError, match="20 clients"):
        dirichlet_label_split(y[:5], 20, 0.1, numpy_rng(1, "partition"))
    with pytest.raises(ValueError, match="after 3 draws"):  # 2 samples per client needed, 1 class each
        dirichlet_label_split(np.repeat(np.arange(4), 2), 4, 1e-3, numpy_rng(1, "partition"), min_size=2, max_tries=3)


def test_dirichlet_pairs_scheme_of_the_authors_code():
    y = _labels(2000)
    parts = dirichlet_label_split(y, 20, 0.01, numpy_rng(2, "partition"), scheme="pairs")
    _assert_partition(parts, 2000)
    assert len(parts) == 20
    assert min(len(p) for p in parts) >= int(0.5 * 200 / 2)  # half of an equal share of its chunk
    for a, b in zip(parts[0::2], parts[1::2]):  # a pair shares one chunk of 2n/N samples
        assert len(a) + len(b) == 200
    assert _max_class_share(parts, y) > _max_class_share(iid_split(2000, 20, numpy_rng(2, "partition")), y) + 0.05
    odd = dirichlet_label_split(y, 5, 0.1, numpy_rng(2, "partition"), scheme="pairs")
    _assert_partition(odd, 2000)
    assert [len(p) for p in odd][-1] == 2000 - 2 * int(2 / 5 * 2000)


def test_quantity_skew_sizes_vary_more_with_larger_sigma_and_labels_stay_iid():
    def cv(sigma):
        values = []
        for seed in range(5):
            sizes = np.array([len(p) for p in quantity_skew_split(5000, 20, sigma, numpy_rng(seed, "partition"))])
            assert sizes.sum() == 5000 and sizes.min() >= 1
            values.append(sizes.std() / sizes.mean())
        return float(np.mean(values))

    assert cv(0.0) == 0.0  # equal sizes
    assert cv(0.2) < cv(1.0) < cv(2.0)
    y = _labels(5000)
    parts = quantity_skew_split(5000, 10, 0.5, numpy_rng(0, "partition"))
    assert _max_class_share([p for p in parts if len(p) > 200], y) < 0.2


def test_iid_split_sizes_differ_by_at_most_one():
    sizes = [len(p) for p in iid_split(103, 10, numpy_rng(0, "partition"))]
    assert sorted(set(sizes)) == [10, 11] and sum(sizes) == 103


def test_natural_split_one_client_per_id_in_sorted_order():
    groups = np.array(["b", "a", "b", "c", "a", "b"])
    parts = natural_split(groups)
    assert [p.tolist() for p in parts] == [[1, 4], [0, 2, 5], [3]]
    subjects = np.array([109, 101, 105, 101])
    assert [p.tolist() for p in natural_split(subjects)] == [[1, 3], [2], [0]]
    _assert_partition(natural_split(np.random.default_rng(0).integers(0, 7, 500)), 500)


def test_train_test_split_per_client_halves_and_stratifies():
    idx = np.arange(100, 200)
    train, test = train_test_split_per_client(idx, 0.5, numpy_rng(0, "train-test"))
    assert len(train) == len(test) == 50
    assert not set(train) & set(test) and set(train) | set(test) == set(idx)
    again = train_test_split_per_client(idx, 0.5, numpy_rng(0, "train-test"))
    assert np.array_equal(train, again[0])
    labels = np.zeros(300, np.int64)
    labels[100:130] = 1  # 30 of class 1, 70 of class 0 in this client
    tr, te = train_test_split_per_client(idx, 0.5, numpy_rng(0, "train-test"), labels=labels)
    assert np.bincount(labels[te]).tolist() == [35, 15] and np.bincount(labels[tr]).tolist() == [35, 15]
    one = train_test_split_per_client(np.array([4]), 0.5, numpy_rng(0, "train-test"))
    assert one[0].tolist() == [4] and one[1].tolist() == []
    two = train_test_split_per_client(np.array([4, 9]), 0.9, numpy_rng(0, "train-test"))
    assert len(two[0]) == 1 and len(two[1]) == 1

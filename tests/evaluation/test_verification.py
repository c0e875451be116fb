"""Verification (fedcare.evaluation.verification): TAR@FAR is scikit-learn's ROC read at the FAR
asked for, ties included; sampled pairs are genuine and impostor pairs scored by cosine, the
impostors drawn from a pool for global testing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_curve

from fedcare.evaluation.verification import pairs_tar_at_far, sample_pairs, tar_at_far


@pytest.mark.parametrize("seed, far, n", [(0, 0.1, 1000), (1, 0.1, 1000), (2, 0.05, 1000), (3, 0.3, 1000),
                                          (4, 0.29, 100), (5, 0.1, 37)])
def test_tar_at_far_is_scikit_learns_roc_read_at_the_far_asked_for(seed, far, n):
    rng = np.random.default_rng(seed)
    genuine, impostor = rng.normal(1.0, 1.0, 1000), rng.normal(0.0, 1.0, n)
    tar, reached, threshold = tar_at_far(genuine, impostor, far)
    fpr, tpr, _ = roc_curve(np.r_[np.ones(1000), np.zeros(n)], np.r_[genuine, impostor], drop_intermediate=False)
    assert tar == pytest.approx(tpr[fpr <= far].max())  # the ROC's best TAR at the FAR asked for
    assert reached == pytest.approx(fpr[fpr <= far].max())  # no ties: exactly floor(far * n) impostors pass
    assert (impostor > threshold).mean() == reached


def test_tar_at_far_with_tied_impostor_scores_stays_within_the_far():
    # 10 impostors, FAR 0.2 allows 2; the top three tie, so the ROC's point below 0.2 accepts none
    impostor = np.array([0.9, 0.9, 0.9] + [0.1] * 7)
    genuine = np.array([0.95, 0.5, 0.05])
    fpr, tpr, _ = roc_curve(np.r_[np.ones(3), np.zeros(10)], np.r_[genuine, impostor], drop_intermediate=False)
    assert tar_at_far(genuine, impostor, 0.2)[:2] == (pytest.approx(tpr[fpr <= 0.2].max()), 0.0)
    assert tar_at_far(genuine, impostor, 0.3)[:2] == (pytest.approx(2 / 3), pytest.approx(0.3))


def test_sampled_pairs_are_genuine_and_impostor_and_score_by_cosine():
    y = np.array([0, 0, 0, 1, 1, 2])  # identity 2 has a single image: never the d of a genuine pair
    genuine, impostor = sample_pairs(y, np.random.default_rng(0), 200, 300)
    assert genuine.shape == (200, 2) and impostor.shape == (300, 2)
    assert (y[genuine[:, 0]] == y[genuine[:, 1]]).all() and (genuine[:, 0] != genuine[:, 1]).all()
    assert (y[impostor[:, 0]] != y[impostor[:, 1]]).all() and 5 not in genuine
    e = torch.tensor([[1.0, 0], [2, 0], [1, 0.1], [0, 1], [0, 3], [-1, 0]])
    result = pairs_tar_at_far(e, genuine, impostor, 0.1)
    cos = torch.nn.functional.normalize(e, dim=1) @ torch.nn.functional.normalize(e, dim=1).T
    expected = tar_at_far(cos[genuine[:, 0], genuine[:, 1]].numpy(), cos[impostor[:, 0], impostor[:, 1]].numpy())
    assert result["tar"] == pytest.approx(expected[0]) and result["threshold"] == pytest.approx(expected[2])


def test_global_testing_draws_impostors_from_the_pool_and_keeps_the_genuine_pairs():
    y = np.array([0, 0, 1, 1])  # the client's identities 0 and 1
    pool = np.array([0, 0, 1, 1, 5, 5, 6, 7])  # every client's test images; 5-7 are other clients' people
    local = sample_pairs(y, np.random.default_rng(0), 100, 400)
    genuine, impostor = sample_pairs(y, np.random.default_rng(0), 100, 400, pool=pool)
    assert np.array_equal(genuine, local[0])  # the same rng draws the genuine pairs first
    assert impostor.shape == (400, 2) and (y[impostor[:, 0]] != pool[impostor[:, 1]]).all()
    assert set(pool[impostor[:, 1]]) == {0, 1, 5, 6, 7}  # the client's other person and the other clients'
    assert np.isin(pool[impostor[:, 1]], [5, 6, 7]).mean() > 0.5  # 4 or 5 of the 6 partners are outside
    assert len(sample_pairs(y, np.random.default_rng(0), 10, 10, pool=np.array([0]))[1]) == 10  # d of identity 1
    assert len(sample_pairs(y[:2], np.random.default_rng(0), 10, 10, pool=np.array([0, 0]))[1]) == 0


def test_scores_of_a_diverged_model_give_no_tar_instead_of_zero():
    genuine, impostor = np.array([0.9, np.nan]), np.array([0.1, 0.2, 0.3])
    assert all(np.isnan(v) for v in tar_at_far(genuine, impostor, 0.1))
    assert all(np.isnan(v) for v in tar_at_far(np.array([0.9, 0.8]), np.array([np.nan, 0.2]), 0.1))
    assert tar_at_far(np.array([0.9, 0.8]), np.array([0.1, 0.2]), 0.5)[0] == 1.0

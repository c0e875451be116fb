"""RMIA with one reference model (fedcare.privacy.rmia): the score by hand, and a toy whose
answer is known, where one reference model is enough for RMIA to find members the loss attack
misses and where offline LiRA, which needs a variance, cannot run."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit

from fedcare.privacy.audit import attack_power
from fedcare.privacy.rmia import OFFLINE_A, probabilities, ratios, scores


def test_the_score_by_hand():
    # Pr(x) = (1.3 / 2) p_ref + 0.35; LR = p_target / Pr(x)
    assert ratios(np.array([0.5]), np.array([0.5]))[0] == pytest.approx(0.5 / (0.65 * 0.5 + 0.35))
    assert OFFLINE_A == 0.3
    x_target, x_ref = np.array([0.9, 0.2]), np.array([0.3, 0.2])
    z_target, z_ref = np.array([0.5, 0.6, 0.1]), np.array([0.5, 0.5, 0.1])
    lr_x, lr_z = ratios(x_target, x_ref), ratios(z_target, z_ref)
    expected = [(lr_x[i] / lr_z > 1).mean() for i in range(2)]
    assert scores(x_target, x_ref, z_target, z_ref).tolist() == pytest.approx(expected)
    assert probabilities(np.array([0.0, np.log(2)])).tolist() == pytest.approx([1.0, 0.5])
    with pytest.raises(ValueError, match="population"):
        scores(x_target, x_ref, np.zeros(0), np.zeros(0))


def test_one_reference_model_finds_members_the_loss_attack_misses():
    """Examples of very different difficulty (logit mu_i spread wide); training raises a member's
    logit by 2. The reference model never trained on any of them; population z: other examples
    of the same distribution, in neither model. The loss attack ranks by the target's
    confidence alone, so easy non-members outrank hard members; RMIA divides each example's
    probability by what the reference model gives it."""
    rng = np.random.default_rng(0)
    n = 2000
    mu = rng.normal(0, 3, 2 * n + 1000)  # members, non-members, population
    member = np.r_[np.ones(n), np.zeros(n + 1000)]
    target = expit(mu + rng.normal(0, 0.3, len(mu)) + 2 * member)
    reference = expit(mu + rng.normal(0, 0.3, len(mu)))
    x = slice(0, 2 * n)
    z = slice(2 * n, None)
    rmia = scores(target[x], reference[x], target[z], reference[z])
    found = attack_power(rmia[:n], rmia[n:])
    loss = attack_power(target[:n], target[n : 2 * n])  # higher probability = lower loss
    assert found.auc > 0.8 > 0.75 > loss.auc
    assert found.tpr_at_1pct_fpr > 0.3 > loss.tpr_at_1pct_fpr


def test_a_target_that_never_saw_the_members_gives_nothing():
    rng = np.random.default_rng(1)
    mu = rng.normal(0, 3, 3000)
    target, reference = expit(mu + rng.normal(0, 0.3, 3000)), expit(mu + rng.normal(0, 0.3, 3000))
    rmia = scores(target[:2000], reference[:2000], target[2000:], reference[2000:])
    result = attack_power(rmia[:1000], rmia[1000:2000])
    assert abs(result.auc - 0.5) < 3 * result.auc_se

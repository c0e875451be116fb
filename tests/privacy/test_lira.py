"""Offline LiRA (fedcare.privacy.lira): the likelihood ratio by hand, a toy whose answer is
known (examples of very different difficulty: LiRA's per-example calibration finds members the
loss attack cannot tell from easy non-members), and trained models: one that memorised its
members is caught, one that never saw them gives AUC about 0.5. The privacy audit study's
shadow sets never hold a member."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm
from torch import nn

from fedcare.algorithms.training import ClientData, TrainSettings, train_epochs
from fedcare.privacy.audit import attack_power, attack_scores, per_example_losses
from fedcare.privacy.lira import logit_confidence, offline_scores
from fedcare.studies.privacy_audit.config import AuditData
from fedcare.runtime.refs import Split
from fedcare.studies.privacy_audit.data import AuditSite, Shadow, synthetic_client
from fedcare.tasks import BINARY


def test_logit_confidence_and_the_offline_ratio_by_hand():
    # p = 0.8 of the true label: loss -log 0.8, phi = log(0.8 / 0.2) = log 4
    assert logit_confidence(np.array([-math.log(0.8)]))[0] == pytest.approx(math.log(4))
    assert np.isfinite(logit_confidence(np.array([0.0]))).all()  # a float32 loss of exactly 0
    # two examples, two shadows each: means 1 and 4, variances 2 and 2 -> pooled sigma sqrt(2)
    shadows = np.array([[0.0, 3.0], [2.0, 5.0]])
    scores = offline_scores(np.array([1 + math.sqrt(2), 4.0]), shadows)
    assert scores == pytest.approx([math.log(0.8413447460685429), math.log(0.5)])  # log Phi(1), log Phi(0)
    with pytest.raises(ValueError, match="2 shadow models"):
        offline_scores(np.zeros(2), np.zeros((1, 2)))


def test_lira_beats_the_loss_attack_at_low_fpr_when_examples_differ_in_difficulty():
    """Confidences drawn as LiRA models them: example i's out confidence ~ N(mu_i, 1), the mu_i
    spread wide (easy and hard examples); training raises a member's confidence by 3. The loss
    attack ranks by confidence alone, so easy non-members outrank hard members; LiRA compares
    each example with its own out distribution: TPR at FPR 1% about Phi(3 - z_0.99) = 0.75."""
    rng = np.random.default_rng(0)
    n, shadows = 4000, 8
    mu = rng.normal(0, 5, 2 * n)  # members first, then non-members
    out = mu + rng.normal(0, 1, (shadows, 2 * n))
    target = mu + rng.normal(0, 1, 2 * n) + np.r_[np.full(n, 3.0), np.zeros(n)]
    loss = attack_power(target[:n], target[n:])  # higher confidence = lower loss: the loss attack
    lira_scores = offline_scores(target, out)
    lira = attack_power(lira_scores[:n], lira_scores[n:])
    expected = norm.cdf(3 - norm.ppf(0.99))
    assert lira.tpr_at_1pct_fpr == pytest.approx(expected, abs=0.05)
    assert loss.tpr_at_1pct_fpr < 0.1 and lira.tpr_at_01pct_fpr > 0.3 > loss.tpr_at_01pct_fpr
    assert lira.auc > 0.95 > 0.7 > loss.auc


def random_labels(seed: int, n: int = 64) -> ClientData:
    g = torch.Generator().manual_seed(seed)
    return ClientData(torch.randn(n, 20, generator=g), (torch.rand(n, generator=g) < 0.5).float())


def trained(data: ClientData, seed: int) -> nn.Module:
    """An MLP that memorises `data` (random labels), from its own initialisation."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    train_epochs(model, model.parameters(), data, TrainSettings(lr=1.0, batch_size=64, local_epochs=60),
                 generator=torch.Generator().manual_seed(seed))
    return model


def test_lira_on_trained_models_catches_memorisation_and_nothing_without_members():
    members, non_members = random_labels(1), random_labels(2)
    shadows = [trained(random_labels(100 + s), 10 + s) for s in range(4)]  # never saw members or non-members

    def lira(model: nn.Module):
        def confidences(m: nn.Module, data: ClientData) -> np.ndarray:
            return logit_confidence(per_example_losses(m, data, BINARY))

        return attack_power(*(offline_scores(confidences(model, d), np.stack([confidences(s, d) for s in shadows]))
                              for d in (members, non_members)))

    caught = lira(trained(members, 0))
    assert caught.auc > 0.75 and caught.tpr_at_1pct_fpr > 0
    unseen = lira(trained(random_labels(3), 0))  # trained like the target, on other examples
    assert abs(unseen.auc - 0.5) < 3 * unseen.auc_se


def test_tpr_at_low_fpr_by_hand():
    # 200 non-members at 0..199, members at 198.5 and 250: FPR 1% allows two false positives
    result = attack_power(np.array([198.5, 250.0]), np.arange(200.0))
    assert result.tpr_at_1pct_fpr == 1.0 and result.tpr_at_01pct_fpr == 0.5
    assert attack_scores(np.array([0.1]), np.array([0.2])).tpr_at_01pct_fpr == 1.0  # lower loss: member


def test_the_audit_shadow_sets_are_fresh_draws_and_leave_the_clients_sets_unchanged():
    data = AuditData(clients=2, train=8, test=8, image_size=4)
    train, test, *shadow = synthetic_client(0, 0, data, shadows=2)
    plain = synthetic_client(0, 0, data)
    assert torch.equal(train.x, plain[0].x) and torch.equal(test.y, plain[1].y)  # the members do not move
    assert len(shadow) == 2 and all(len(s) == 8 for s in shadow)
    every = torch.cat([train.x, test.x, *(s.x for s in shadow)]).flatten(1)
    assert len(torch.unique(every, dim=0)) == len(every)  # no shadow image is a member or a held-out one
    site = AuditSite(0, data, shadows=2)
    assert torch.equal(site.data(Shadow(0, 2)).x, shadow[1].x)
    for ref in (Shadow(0, 3), Shadow(0, 0), Split("train")):
        with pytest.raises(ValueError, match="unknown privacy audit data reference"):
            site.data(ref)

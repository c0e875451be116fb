"""The membership-inference audit (fedcare.privacy.audit): the issue's sanity checks.

On a deliberately overfit model (random labels memorised) the loss attack's AUC must be
above 0.8; on an untrained model it must be about 0.5. Plus the scoring by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedcare.algorithms.training import ClientData, TrainSettings, train_epochs
from fedcare.privacy.audit import attack_scores, auc_standard_error, loss_attack
from fedcare.tasks import BINARY


def random_labels(seed: int, n: int = 64) -> ClientData:
    """Pure noise: whatever the model learns about these examples is memorisation."""
    g = torch.Generator().manual_seed(seed)
    return ClientData(torch.randn(n, 20, generator=g), (torch.rand(n, generator=g) < 0.5).float())


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))


def test_overfit_model_is_caught():
    model, members, non_members = mlp(), random_labels(1), random_labels(2)
    train_epochs(model, model.parameters(), members, TrainSettings(lr=1.0, batch_size=64, local_epochs=60),
                 generator=torch.Generator().manual_seed(0))
    result = loss_attack(model, members, non_members, BINARY)
    assert result.auc > 0.8
    assert result.tpr_at_1pct_fpr > 0.05  # confident hits, not only a shifted average
    assert (result.members, result.non_members) == (64, 64)


def test_untrained_model_gives_nothing_away():
    result = loss_attack(mlp(), random_labels(1, 200), random_labels(2, 200), BINARY)
    assert abs(result.auc - 0.5) < 3 * result.auc_se + 0.02
    assert result.auc_se == pytest.approx(auc_standard_error(result.auc, 200, 200))


def test_scores_by_hand():
    # members' losses all below non-members': perfect attack; equal: a coin
    perfect = attack_scores(np.array([0.1, 0.2, 0.3]), np.array([0.5, 0.6, 0.7]))
    assert perfect.auc == 1.0 and perfect.tpr_at_1pct_fpr == 1.0
    inverted = attack_scores(np.array([0.5, 0.6]), np.array([0.1, 0.2]))
    assert inverted.auc == 0.0 and inverted.tpr_at_1pct_fpr == 0.0
    coin = attack_scores(np.array([0.3, 0.3]), np.array([0.3, 0.3]))
    assert coin.auc == 0.5
    with pytest.raises(ValueError, match="members and non-members"):
        attack_scores(np.array([]), np.array([0.1]))


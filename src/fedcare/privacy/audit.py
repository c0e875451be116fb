"""Membership inference: does a model give away which examples it was trained on?

The loss attack (Yeom et al. 2018): an example is called a member when the model's loss on
it is low. Its power is measured on known members (a client's training examples) against
held-out non-members of the same distribution: the attack's ROC AUC (0.5: no better than a
coin) and its TPR at FPR 1% and 0.1% (Carlini et al. 2022: what matters is confident hits at
few false alarms; with fewer than 1,000 non-members the 0.1% read is the TPR at no false
positive at all). Who attacks decides which model is scored: a peer sees the global model, the
server sees the shared tensors (the global model under FedAvg, the shared layers only under
PFDL and FedBN), a client's own model is what a breach of that client's device exposes.

Limits, written in docs/privacy.md: the loss attack is the weakest standard attack (the
likelihood-ratio attack with shadow models, LiRA, is stronger: `fedcare.privacy.lira`), so a
low AUC is a lower bound on leakage, never a proof of privacy; and on few examples the AUC
itself is uncertain (its standard error is given).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
from sklearn.metrics import roc_auc_score, roc_curve
from torch import nn

from fedcare.algorithms.training import ClientData, as_float
from fedcare.device import device_of
from fedcare.tasks import Task


@dataclass(frozen=True)
class AttackResult:
    auc: float
    auc_se: float  # Hanley & McNeil's standard error of the AUC
    tpr_at_1pct_fpr: float
    members: int
    non_members: int
    tpr_at_01pct_fpr: float  # at FPR 0.1%

    def as_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def per_example_losses(model: nn.Module, data: ClientData, task: Task, batch_size: int = 256) -> np.ndarray:
    """The task's loss on every example alone, with the model in inference mode."""
    was_training = model.training
    model.eval()
    losses = []
    for start in range(0, len(data), batch_size):
        outputs = model(as_float(data.x[start : start + batch_size].to(device_of(model)))).cpu()
        y = data.y[start : start + batch_size]
        losses += [float(task.loss(outputs[i : i + 1], y[i : i + 1])) for i in range(len(y))]
    model.train(was_training)
    return np.asarray(losses)


def attack_scores(member_losses: np.ndarray, non_member_losses: np.ndarray) -> AttackResult:
    """The loss attack's power: members should score higher (= lower loss)."""
    return attack_power(-np.asarray(member_losses), -np.asarray(non_member_losses))


def attack_power(member_scores: np.ndarray, non_member_scores: np.ndarray) -> AttackResult:
    """The power of any membership score (higher: called a member sooner): AUC and the TPR at
    FPR 1% and 0.1%, each the ROC's best TPR at a false-positive rate at most that."""
    if len(member_scores) == 0 or len(non_member_scores) == 0:
        raise ValueError("a membership attack needs members and non-members")
    labels = np.r_[np.ones(len(member_scores)), np.zeros(len(non_member_scores))]
    scores = np.r_[member_scores, non_member_scores]
    auc = float(roc_auc_score(labels, scores))
    fpr, tpr, _ = roc_curve(labels, scores)

    def tpr_at(rate: float) -> float:
        return float(np.max(tpr[fpr <= rate])) if np.any(fpr <= rate) else 0.0

    return AttackResult(auc, auc_standard_error(auc, len(member_scores), len(non_member_scores)), tpr_at(0.01),
                        len(member_scores), len(non_member_scores), tpr_at(0.001))


def auc_standard_error(auc: float, n_pos: int, n_neg: int) -> float:
    """Hanley & McNeil (1982)."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    var = (auc * (1 - auc) + (n_pos - 1) * (q1 - auc * auc) + (n_neg - 1) * (q2 - auc * auc)) / (n_pos * n_neg)
    return math.sqrt(max(var, 0.0))


def loss_attack(model: nn.Module, members: ClientData, non_members: ClientData, task: Task) -> AttackResult:
    """The loss attack on `model`, members vs non-members."""
    return attack_scores(per_example_losses(model, members, task), per_example_losses(model, non_members, task))

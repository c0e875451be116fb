"""Declared tasks: their losses, scores and client-side metrics, checked against torch and
scikit-learn; the multi-label task is not treated as multiclass (no softmax over labels)."""

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import f1_score, precision_recall_fscore_support, roc_curve
from torch.nn import functional as F

from fedcare.algorithms.training import ClientData, predict
from fedcare.evaluation.metrics import multilabel_metrics
from fedcare.evaluation.verification import all_pairs_tar_at_far, tar_at_far
from fedcare.tasks import BINARY, MULTICLASS, EmbeddingTask, MultilabelTask, positive_weights


def _labels(n=40, labels=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, labels, generator=g) < torch.tensor([0.5, 0.2, 0.0])).float()  # the last label never occurs
    logits = torch.randn(n, labels, generator=g) + 2 * (y - 0.5)
    return logits, y


def test_binary_and_multiclass_losses_scores_and_metrics():
    logits, y = torch.tensor([2.0, -1.0, 0.5]), torch.tensor([1.0, 0.0, 0.0])
    assert torch.equal(BINARY.loss(logits, y), F.binary_cross_entropy_with_logits(logits, y))
    scores = BINARY.scores(logits)
    m = BINARY.metrics("binary", scores, 0.25, ClientData(torch.zeros(3, 1), y))
    assert m["n"] == 3 and m["loss"] == 0.25 and m["acc"] == pytest.approx(2 / 3)  # 0.62 >= 0.5 is a false positive
    logits3 = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    assert torch.allclose(MULTICLASS.scores(logits3).sum(1), torch.ones(2))
    m = MULTICLASS.metrics("accuracy", MULTICLASS.scores(logits3), 0.1, ClientData(torch.zeros(2), torch.tensor([0, 1])))
    assert m["accuracy"] == 0.5
    with pytest.raises(ValueError, match="no metrics 'accuracy'.*loss, binary"):
        BINARY.metrics("accuracy", scores, 0.0, ClientData(torch.zeros(3, 1), y))


def test_multilabel_scores_are_per_label_sigmoids_not_a_softmax():
    logits, y = _labels()
    task = MultilabelTask(labels=("a", "b", "c"))
    scores, _ = predict(torch.nn.Identity(), ClientData(logits, y), task)
    assert torch.equal(scores, torch.sigmoid(logits))
    assert not torch.allclose(scores.sum(1), torch.ones(len(y)))  # a softmax would make rows sum to 1


def test_multilabel_per_client_pos_weight_is_negatives_over_positives():
    logits, y = _labels()
    weight = positive_weights(y)
    pos = y.sum(0)
    assert weight[0] == (len(y) - pos[0]) / pos[0] and weight[1] == (len(y) - pos[1]) / pos[1]
    assert weight[2] == 1.0  # a label without positives: its weight never matters
    task = MultilabelTask(pos_weight="client")
    loss = task.batch_loss(ClientData(logits, y))(torch.nn.Identity(), logits, y)
    assert torch.equal(loss, F.binary_cross_entropy_with_logits(logits, y, pos_weight=weight))
    fixed = MultilabelTask(pos_weight=torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(fixed.batch_loss(ClientData(logits, y))(torch.nn.Identity(), logits, y),
                       F.binary_cross_entropy_with_logits(logits, y, pos_weight=torch.tensor([1.0, 2.0, 3.0])))
    plain = MultilabelTask().batch_loss(ClientData(logits, y))(torch.nn.Identity(), logits, y)
    assert torch.equal(plain, F.binary_cross_entropy_with_logits(logits, y))
    with pytest.raises(ValueError, match="pos_weight"):
        MultilabelTask(pos_weight="global")


def test_multilabel_metrics_equal_scikit_learn():
    logits, y = _labels()
    scores = torch.sigmoid(logits).numpy()
    m = multilabel_metrics(y.numpy(), scores, ("grasper", "clipper", "stapler"))
    pred = (scores >= 0.5).astype(int)
    p, r, f, _ = precision_recall_fscore_support(y.numpy().astype(int), pred, average=None, zero_division=0)
    assert [m[f"f1/{n}"] for n in ("grasper", "clipper", "stapler")] == pytest.approx(list(f))
    assert [m[f"recall/{n}"] for n in ("grasper", "clipper", "stapler")] == pytest.approx(list(r))
    assert m["macro_f1"] == pytest.approx(f1_score(y.numpy().astype(int), pred, average="macro", zero_division=0))
    assert m["positives/stapler"] == 0 and m["f1/stapler"] == 0.0  # an absent tool counts as F1 0 in the macro mean
    # the counts: summed over clients they give the F1 of the union of their data
    tp, fp, fn = m["tp/clipper"], m["fp/clipper"], m["fn/clipper"]
    assert tp + fn == m["positives/clipper"] and 2 * tp / (2 * tp + fp + fn) == pytest.approx(m["f1/clipper"])
    assert all(math.isnan(v) for k, v in multilabel_metrics(y.numpy()[:0], scores[:0]).items() if "/" not in k)


def test_tar_at_far_is_a_point_of_scikit_learns_roc_curve():
    rng = np.random.default_rng(0)
    genuine, impostor = rng.normal(0.6, 0.2, 300), rng.normal(0.2, 0.2, 500)
    tar, far, threshold = tar_at_far(genuine, impostor, 0.1)
    assert far == 0.1  # 50 of the 500 impostor scores above the threshold, as the FAR allows
    scores = np.concatenate([genuine, impostor])
    fpr, tpr, thresholds = roc_curve(np.r_[np.ones(300), np.zeros(500)], scores, drop_intermediate=False)
    # sklearn counts scores >= t; ours are strictly above `threshold`: the next larger score
    i = np.flatnonzero(thresholds > threshold)[-1]
    assert (fpr[i], tpr[i]) == pytest.approx((far, tar))
    assert tar_at_far([0.9, 0.8, 0.1], [0.5, 0.2, 0.3, 0.4], 0.25)[:2] == (pytest.approx(2 / 3), 0.25)


def test_embedding_task_verifies_at_the_client_from_normalised_embeddings():
    embeddings = torch.tensor([[1.0, 0.0], [2.0, 0.1], [0.0, 3.0], [0.1, 1.0], [-1.0, 0.0]])
    labels = torch.tensor([0, 0, 1, 1, 2])
    task = EmbeddingTask(head_loss=lambda model, x, y: model(x).sum(), far=0.5)
    scores = task.scores(embeddings)
    assert torch.allclose(scores.norm(dim=1), torch.ones(5))
    m = task.metrics("verification", scores, math.nan, ClientData(embeddings, labels))
    assert (m["genuine_pairs"], m["impostor_pairs"]) == (2, 8)
    assert m == {"loss": m["loss"], "n": 5, **all_pairs_tar_at_far(embeddings, labels, 0.5)}
    assert m["tar"] == 1.0 and m["far"] <= 0.5  # both genuine pairs are near-parallel
    with pytest.raises(TypeError, match="margin head"):
        task.loss(embeddings, labels)
    assert math.isnan(task.evaluation_loss(embeddings, labels))


def test_a_diverged_models_scores_give_no_accuracy_instead_of_argmaxs_pick():
    """NaN logits gave "accuracy" 0.0 or 0.1 (argmax picks class 0), and the summary showed it as
    a result ("fedavg 10.0 ± 9.4", issue 35 item 13); now it is NA, as the binary metrics are."""
    y = torch.tensor([0, 1, 2, 0])
    nan_scores = MULTICLASS.scores(torch.full((4, 3), math.nan))
    assert math.isnan(MULTICLASS.metrics("accuracy", nan_scores, math.nan, ClientData(torch.zeros(4), y))["accuracy"])
    fine = MULTICLASS.metrics("accuracy", MULTICLASS.scores(torch.eye(3)[y]), 0.1, ClientData(torch.zeros(4), y))
    assert fine["accuracy"] == 1.0

"""Pitfalls other DP implementations fell into in 2025-2026, closed in fedcare:

- DP-SGD divides the noisy sum by a public constant, the configured batch size, never by the
  client's example count (Opacus 1.0-1.6 normalised by a batch size derived from the private
  dataset size: meta-pytorch/opacus #819, #571);
- a Poisson sampler includes each example independently (google-deepmind/jax_privacy #121):
  batch sizes follow Binomial(n, q), two examples' inclusions are uncorrelated;
- client-level DP clips and noises floating-point tensors only: a BatchNorm counter is
  averaged as without DP, never clipped or noised (flwr #8381, fixed in Flower 1.45).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import binom, chisquare
from torch import nn

from fedcare.algorithms import fedavg
from fedcare.algorithms.base import NUM_EXAMPLES, ServerHalf
from fedcare.algorithms.messages import Message
from fedcare.algorithms.training import ClientData, TrainSettings
from fedcare.config import DPSGD, ClientDP, Privacy
from fedcare.privacy import private_algorithm
from fedcare.privacy.client_dp import ClientDPServer
from fedcare.privacy.dp_sgd import PoissonBatches
from fedcare.runtime.federation import Federation


class Line(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 1)
        with torch.no_grad():
            self.fc.weight.copy_(torch.tensor([[0.2, -0.1, 0.3]]))
            self.fc.bias.zero_()

    def forward(self, x):
        return self.fc(x).squeeze(1)


@pytest.mark.parametrize("n", [5, 9])
def test_dp_sgd_divides_by_the_configured_batch_size_when_a_client_holds_fewer_examples(n):
    """n < batch 16: q = 1, every example in the one step of an epoch; without noise the step
    is lr * (sum of the clipped per-example gradients) / 16, whatever n is."""
    g = torch.Generator().manual_seed(n)
    x, y = 2 * torch.randn(n, 3, generator=g), (torch.rand(n, generator=g) < 0.5).float()
    model = Line()
    w0 = torch.cat([model.fc.weight.flatten(), model.fc.bias]).detach()
    clip, lr = 0.5, 0.1
    settings = TrainSettings(lr=lr, batch_size=16, local_epochs=1)
    algo = private_algorithm(fedavg(settings), Privacy(dp_sgd=DPSGD(noise_multiplier=0.0, max_grad_norm=clip)))
    fed = Federation(model, algo, seed=0)
    fed.run_round("train", 1, {0: ClientData(x, y)})
    w1 = torch.cat([fed.global_message.tensors["fc.weight"].flatten(), fed.global_message.tensors["fc.bias"]])
    # binary cross-entropy's per-example gradient: (sigmoid(w.x + b) - y) (x, 1)
    residual = torch.sigmoid(x @ w0[:3] + w0[3]) - y
    per_example = torch.cat([residual[:, None] * x, residual[:, None]], 1)
    clipped = per_example * (clip / (per_example.norm(dim=1) + 1e-6)).clamp(max=1)[:, None]
    torch.testing.assert_close(w1, w0 - lr * clipped.sum(0) / 16, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(w1, w0 - lr * clipped.sum(0) / n, atol=1e-4)  # not by the example count


def test_poisson_batch_sizes_follow_binomial_n_q():
    n, batch = 50, 10  # q = 0.2
    sampler, g = PoissonBatches(), torch.Generator().manual_seed(0)
    sizes = np.array([len(idx) for _ in range(1000) for idx in sampler.epoch(n, batch, g)])
    assert len(sizes) == 5000
    # chi-square goodness of fit against Binomial(50, 0.2), the tails pooled so every bin expects >= 5
    edges = np.arange(3, 18)
    expected = np.diff(binom.cdf(np.r_[-1, edges, n], n, 0.2)) * len(sizes)
    observed = np.histogram(sizes, bins=np.r_[-0.5, edges + 0.5, n + 0.5])[0]
    assert chisquare(observed, expected).pvalue > 0.001
    assert sizes.var() == pytest.approx(n * 0.2 * 0.8, rel=0.1)  # a fixed-size draw would have variance 0


def test_poisson_inclusions_are_independent_per_example():
    n, batch = 40, 10  # q = 0.25
    sampler, g = PoissonBatches(), torch.Generator().manual_seed(1)
    masks = []
    for _ in range(1000):
        for idx in sampler.epoch(n, batch, g):
            mask = np.zeros(n, dtype=bool)
            mask[idx.numpy()] = True
            masks.append(mask)
    masks = np.array(masks, dtype=float)  # (4000 steps, 40 examples)
    assert masks.mean() == pytest.approx(0.25, abs=0.01)
    corr = np.corrcoef(masks.T)[np.triu_indices(n, 1)]
    # independent: every pairwise correlation within noise (SE 1/sqrt(4000) = 0.016); a sampler
    # that draws a batch size first and then examples without replacement makes them negative
    assert abs(corr.mean()) < 0.005
    assert np.abs(corr).max() < 0.08


class WithCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.bn = nn.BatchNorm1d(2)


def test_client_level_dp_clips_and_noises_floating_point_tensors_only():
    current = {k: v.clone() for k, v in WithCounter().state_dict().items()}
    assert current["bn.num_batches_tracked"].dtype == torch.int64
    replies = {}
    for c, (scale, batches) in enumerate([(5.0, 7), (0.01, 3), (2.0, 10)]):
        tensors = {k: (v + scale if v.is_floating_point() else v + batches) for k, v in current.items()}
        replies[c] = Message(tensors, {NUM_EXAMPLES: 10.0})
    plain = ServerHalf(weighting="uniform").aggregate(Message(current), replies)
    server = ClientDPServer(ServerHalf(weighting="uniform"), ClientDP(noise_multiplier=1.0, clipping_norm=0.5),
                            "FedAvg")
    private = server.aggregate(Message(current), replies)
    counter = private.tensors["bn.num_batches_tracked"]
    assert counter.dtype == torch.int64
    assert torch.equal(counter, plain.tensors["bn.num_batches_tracked"])  # averaged as without DP
    assert counter.item() == round((7 + 3 + 10) / 3)
    # the floating-point tensors were clipped (their update is far smaller than the plain mean's) and noised
    floats = [k for k in current if current[k].is_floating_point()]
    moved = torch.cat([(private.tensors[k] - current[k]).flatten() for k in floats])
    plain_moved = torch.cat([(plain.tensors[k] - current[k]).flatten() for k in floats])
    assert plain_moved.abs().mean() > 2 and moved.std() > 0.05


def test_client_level_dp_canary_clients_leave_integer_tensors_alone():
    current = Message({k: v.clone() for k, v in WithCounter().state_dict().items()})
    server = ClientDPServer(ServerHalf(weighting="uniform"), ClientDP(noise_multiplier=0.5), "FedAvg",
                            canary_clients=10)
    server.bind_seed(3)
    reply = Message({k: v + (1 if not v.is_floating_point() else 0.1) for k, v in current.tensors.items()},
                    {NUM_EXAMPLES: 1.0})
    out = server.aggregate(current, {0: reply, 1: reply})
    assert torch.equal(out.tensors["bn.num_batches_tracked"], reply.tensors["bn.num_batches_tracked"])
    assert out.scalars["client_dp_audit_m"] == 10  # the canaries did take part

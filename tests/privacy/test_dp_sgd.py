"""DP-SGD at the client (fedcare.privacy.dp_sgd): the issue's must-hold checks.

- the accountant's epsilon equals an independent computation (the RDP of the subsampled
  Gaussian written out here, Mironov et al. 2019 integer orders, with the RDP -> (eps, delta)
  conversion of Balle et al. 2020) within 1%;
- noise 0 and infinite clipping is plain SGD;
- with DP on, each example's gradient is clipped (checked by hand on a tiny linear model);
- BatchNorm becomes GroupNorm, or is refused with a message; the ledger survives restore.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy.special import comb, logsumexp
from torch import nn

from fedcare.algorithms import fedavg, pfdl
from fedcare.algorithms.base import DP_EPSILON
from fedcare.algorithms.training import TrainingDiverged, TrainSettings, train_epochs
from fedcare.config import DPSGD, Privacy
from fedcare.privacy import PrivacyError, private_algorithm, private_model
from fedcare.privacy.dp_sgd import LEDGER, PerExampleClipNoise, epsilon
from fedcare.runtime.federation import Federation

from support.tiny import Linear, linear_data, tiny_data, tiny_model


def rdp_subsampled_gaussian(q: float, sigma: float, order: int) -> float:
    """RDP of one step of the Poisson-subsampled Gaussian at an integer order (Mironov et al.
    2019, Sec. 3.3): log(sum_k C(a,k) (1-q)^(a-k) q^k exp((k^2-k)/(2 sigma^2))) / (a - 1)."""
    k = torch.arange(order + 1, dtype=torch.float64).numpy()
    terms = (math.log(1)
             + torch.from_numpy(comb(order, k)).log().numpy()
             + (order - k) * math.log1p(-q) + k * math.log(q) + (k * k - k) / (2 * sigma ** 2))
    return float(logsumexp(terms)) / (order - 1)


def independent_epsilon(q: float, sigma: float, steps: int, delta: float) -> float:
    best = math.inf
    for a in range(2, 128):
        rdp = steps * rdp_subsampled_gaussian(q, sigma, a)
        eps = rdp + math.log1p(-1 / a) - (math.log(delta) + math.log(a)) / (a - 1)  # Balle et al. 2020, Thm 21
        best = min(best, eps)
    return best


@pytest.mark.parametrize("q, sigma, steps", [(0.01, 1.1, 1000), (0.05, 1.0, 300), (0.25, 2.0, 40)])
def test_accountant_epsilon_matches_an_independent_rdp_computation(q, sigma, steps):
    ledger = torch.tensor([[sigma, q, steps]], dtype=torch.float64)
    ours = epsilon(ledger, 1e-5)
    theirs = independent_epsilon(q, sigma, steps, 1e-5)
    # Opacus also tries fractional orders, so it may only be lower (tighter), and by little
    assert ours <= theirs * 1.0001
    assert ours == pytest.approx(theirs, rel=0.01)


def test_epsilon_grows_with_steps_and_is_infinite_without_noise():
    few, many = (epsilon(torch.tensor([[1.0, 0.1, k]], dtype=torch.float64), 1e-5) for k in (10, 100))
    assert 0 < few < many
    assert epsilon(torch.tensor([[0.0, 0.1, 10]], dtype=torch.float64), 1e-5) == math.inf
    assert epsilon(torch.zeros(0, 3, dtype=torch.float64), 1e-5) == 0.0


def train(model, data, settings, config=None):
    """Train through a DP-SGD client half when `config` is given, else plainly."""
    algo = fedavg(settings)
    if config is not None:
        algo = private_algorithm(algo, Privacy(dp_sgd=config))
    fed = Federation(model, algo, seed=5)
    fed.run_round("train", 1, {0: data})
    return fed.global_message.tensors, fed


def test_no_noise_and_no_clipping_is_plain_sgd():
    settings = TrainSettings(lr=0.1, batch_size=8, local_epochs=2)
    data = linear_data()
    plain, _ = train(Linear(), data, settings)
    private, _ = train(Linear(), data, settings, DPSGD(noise_multiplier=0.0, max_grad_norm=math.inf, sampling="shuffle"))
    for k in plain:
        torch.testing.assert_close(private[k], plain[k], rtol=1e-5, atol=1e-6)


def test_each_examples_gradient_is_clipped_by_hand():
    """One step on a linear model with squared loss, whose per-example gradients are known in
    closed form: g_i = (w.x_i + b - y_i) * (x_i, 1). Each is scaled to norm <= C, averaged."""
    model = Linear()
    w, b = model.fc.weight.detach().clone(), model.fc.bias.detach().clone()
    g = torch.Generator().manual_seed(1)
    x, y = 3 * torch.randn(6, 5, generator=g), torch.randn(6, generator=g)
    clip = 0.5
    from opacus import GradSampleModule

    grad_sample = GradSampleModule(model)
    model.zero_grad()
    x.requires_grad_(True)  # (so the full backward hook has an input gradient to see)
    (model(x) - y).pow(2).mul(0.5).mean().backward()
    PerExampleClipNoise(DPSGD(noise_multiplier=0.0, max_grad_norm=clip))(model, len(x))
    grad_sample.cleanup()
    residual = (x @ w.T).squeeze(1) + b - y
    per_example = torch.cat([residual[:, None] * x, residual[:, None]], 1)
    norms = per_example.norm(dim=1)
    assert (norms > clip).sum() >= 4  # the check is about clipping: most examples are over C
    expected = (per_example * (clip / (norms + 1e-6)).clamp(max=1)[:, None]).mean(0)
    torch.testing.assert_close(model.fc.weight.grad.squeeze(0), expected[:5], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.fc.bias.grad, expected[5:], rtol=1e-5, atol=1e-6)
    plain = per_example.mean(0)
    assert not torch.allclose(plain[:5], expected[:5], atol=1e-3)


def test_noise_has_the_configured_scale():
    """With zero per-example gradients, the step's gradient is the noise / batch: std sigma C / B."""
    big = nn.Linear(4000, 1)  # a parameter with many entries to estimate the std from
    big.weight.grad, big.bias.grad = torch.zeros(1, 4000), torch.zeros(1)
    big.weight.grad_sample, big.bias.grad_sample = torch.zeros(10, 1, 4000), torch.zeros(10, 1)
    hook = PerExampleClipNoise(DPSGD(noise_multiplier=2.0, max_grad_norm=3.0))
    hook.generator = torch.Generator().manual_seed(0)
    hook(big, 10)
    assert big.weight.grad.std().item() == pytest.approx(2.0 * 3.0 / 10, rel=0.05)
    assert big.weight.grad_sample is None  # consumed


def test_dp_sgd_round_reports_epsilon_and_keeps_a_ledger():
    settings = TrainSettings(lr=0.05, batch_size=10, local_epochs=2)
    model = private_model(tiny_model(), Privacy(dp_sgd=DPSGD()))
    algo = private_algorithm(fedavg(settings), Privacy(dp_sgd=DPSGD(noise_multiplier=1.0, max_grad_norm=1.0)))
    fed = Federation(model, algo, seed=1)
    data = {0: tiny_data(0), 1: tiny_data(1)}
    info1 = fed.run_round("train", 1, data)
    info2 = fed.run_round("train", 2, data)
    assert 0 < info1[DP_EPSILON] < info2[DP_EPSILON] < math.inf
    ledger = fed.state_of(0)[LEDGER]
    assert ledger.tolist() == [[1.0, 10 / 40, 2 * 2 * 4]]  # sigma, q = B/n, 2 rounds x 2 epochs x 4 batches
    assert info2[DP_EPSILON] == pytest.approx(epsilon(ledger, 1e-5))
    # determinism: the same seed draws the same noise
    again = Federation(private_model(tiny_model(), Privacy(dp_sgd=DPSGD())), algo, seed=1)
    again.run_round("train", 1, data)
    again.run_round("train", 2, data)
    for k, v in fed.global_message.tensors.items():
        assert torch.equal(v, again.global_message.tensors[k])


def test_pfdl_finetuning_is_counted_and_restore_keeps_the_ledger():
    settings = TrainSettings(lr=0.05, batch_size=10, local_epochs=1)
    privacy = Privacy(dp_sgd=DPSGD())
    fed = Federation(private_model(tiny_model(), privacy),
                     private_algorithm(pfdl(settings, finetune_epochs=2), privacy), seed=1)
    data = {0: tiny_data(0)}
    fed.run_round("train", 1, data)
    assert fed.state_of(0)[LEDGER][0, 2].item() == 4 + 2 * 4  # fit: 1 epoch; fine-tuning: 2 epochs
    snap = fed.snapshot()
    fed.run_round("train", 2, data)
    fed.restore(snap)
    assert fed.state_of(0)[LEDGER][0, 2].item() == 2 * (4 + 2 * 4)  # released steps stay spent


def test_batchnorm_is_replaced_or_refused():
    model = private_model(tiny_model(), Privacy(dp_sgd=DPSGD()))
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert any(isinstance(m, nn.GroupNorm) for m in model.modules())
    with pytest.raises(PrivacyError, match="batchnorm"):
        private_model(tiny_model(), Privacy(dp_sgd=DPSGD(batchnorm="refuse")))


def test_an_algorithm_stepping_outside_the_loop_is_refused():
    from fedcare.algorithms import perfedavg

    algo = perfedavg(TrainSettings())
    with pytest.raises(PrivacyError, match="outside the training loop"):
        private_algorithm(algo, Privacy(dp_sgd=DPSGD()))


def test_dp_sgd_reaches_the_half_that_trains_through_a_wrapper():
    """A study's wrapper around the algorithm's half (the surgical study's seeded Dropout,
    facerec's own heads) must not keep the hook from the half that takes the steps."""
    from dataclasses import replace

    from fedcare.algorithms import perfedavg
    from fedcare.algorithms.base import DelegatingClient

    algo = fedavg(TrainSettings())
    wrapped = replace(algo, client=DelegatingClient(algo.client))
    private = private_algorithm(wrapped, Privacy(dp_sgd=DPSGD()))
    assert isinstance(algo.client.settings.gradient_hook, PerExampleClipNoise)
    assert private.client.settings is algo.client.settings
    meta = perfedavg(TrainSettings())
    with pytest.raises(PrivacyError, match="outside the training loop"):
        private_algorithm(replace(meta, client=DelegatingClient(meta.client)), Privacy(dp_sgd=DPSGD()))

def test_privacy_off_changes_nothing():
    algo = fedavg(TrainSettings())
    assert private_algorithm(algo, None) is algo
    model = tiny_model()
    assert private_model(model, None) is model
    assert private_model(model, Privacy()) is model


def test_train_epochs_without_a_hook_is_untouched():
    """The hook is the only path: plain training does not see Opacus at all."""
    model = Linear()
    train_epochs(model, model.parameters(), linear_data(), TrainSettings(batch_size=8, local_epochs=1),
                 generator=torch.Generator().manual_seed(0))
    assert not hasattr(model.fc.weight, "grad_sample")


def test_a_clipping_norm_of_1e300_stops_as_divergence_without_an_epsilon_beside_null_losses():
    """max_grad_norm = 1e300 made the noise overflow every weight in a round's last step: the
    round recorded epsilon 4.73 and a finite training loss, its evaluation null losses (issue 35,
    item 13). The weights are now checked after each epoch: the client's training diverged."""
    settings = TrainSettings(lr=0.05, batch_size=40, local_epochs=1)  # one step a round: its loss is finite
    model = private_model(tiny_model(), Privacy(dp_sgd=DPSGD()))
    algo = private_algorithm(fedavg(settings), Privacy(dp_sgd=DPSGD(noise_multiplier=1.0, max_grad_norm=1e300)))
    fed = Federation(model, algo, seed=1)
    with pytest.raises(TrainingDiverged, match=r"the weights after epoch 1 are not finite .* \(client 0\)"):
        fed.run_round("train", 1, {0: tiny_data(0), 1: tiny_data(1)})

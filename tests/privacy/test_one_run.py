"""The one-run audit's bound (Steinke, Nasr & Jagielski 2023; fedcare.privacy.one_run).

Expected values below were computed by running the reference implementations locally, outside
this repository, on the same (m, r, v, delta, confidence):
- delta = 0: the authors' code, `get_eps_audit(m, r, v, p, delta)` of O1_Steinke_Code/o1_audit.py in
  ubc-systopia/panoramia-privacy-measurement at commit ec3c0b071cf55524b6820f28083604f7d3d41a6f
  (the paper's appendix code; its delta term is commented out there, so it is used at delta = 0 only);
- delta > 0: google-deepmind/jax_privacy at commit 8967688c26d46f3b74bfdfe61ef1f984b887abab,
  `jax_privacy.auditing._epsilon_one_run(0.0, m, r, v, significance, delta)` (the paper's bound
  with its delta term).
"""

import numpy as np
import pytest

from fedcare.privacy.one_run import GUESS_GRID, audit, epsilon_lower_bound, guess, is_sound, p_value

# (m, r, v, delta, 1 - confidence) -> epsilon-hat of the reference implementation named above
AUTHORS = [  # get_eps_audit (o1_audit.py), delta = 0
    ((100, 100, 100, 0.0, 0.05), 3.492965430021286),
    ((1000, 200, 150, 0.0, 0.05), 0.821396242827177),
    ((50, 20, 18, 0.0, 0.05), 0.9315097220242023),
]
JAX_PRIVACY = [  # auditing._epsilon_one_run, delta > 0
    ((1000, 200, 150, 1e-5, 0.05), 0.8199728373996844),
    ((1000, 100, 90, 1e-5, 0.05), 1.6261436787042223),
    ((6000, 600, 500, 1e-5, 0.05), 1.4219864578836718),
    ((1000, 1000, 700, 1e-5, 0.05), 0.7317406384658977),
    ((1000, 20, 20, 1e-5, 0.01), 1.2699473097837428),
    ((300, 60, 40, 1e-6, 0.05), 0.21484129366496113),
    ((1000, 100, 50, 1e-5, 0.05), 0.0),
]
# jax_privacy's `_one_run_p_value(m, r, v, eps, delta)` at eps = 0.5, 1, 2
P_VALUES = [
    ((1000, 100, 90, 1e-5), (0.0005394013545916186, 0.0008412885614385309, 0.3449868367938024)),
    ((6000, 600, 500, 1e-5), (0.0007843313249752608, 0.0014497241352328845, 0.9997631771948853)),
    ((300, 60, 40, 1e-6), (0.2860127038233049, 0.8960777262858185, 0.9999970444302324)),
]


@pytest.mark.parametrize(("case", "expected"), AUTHORS + JAX_PRIVACY)
def test_the_bound_matches_the_reference_implementations(case, expected):
    m, r, v, delta, significance = case
    assert epsilon_lower_bound(m, r, v, delta, 1 - significance) == pytest.approx(expected, abs=2e-6)


@pytest.mark.parametrize(("case", "expected"), P_VALUES)
def test_the_p_value_with_its_delta_term_matches_jax_privacy(case, expected):
    for eps, want in zip((0.5, 1.0, 2.0), expected):
        assert p_value(*case[:3], eps, case[3]) == pytest.approx(want, rel=1e-9)


def test_the_delta_term_only_weakens_the_bound():
    assert p_value(1000, 100, 90, 1.0, 1e-5) > p_value(1000, 100, 90, 1.0, 0.0)
    assert epsilon_lower_bound(1000, 100, 90, 1e-5) < epsilon_lower_bound(1000, 100, 90, 0.0)


def test_guesses_are_the_top_and_bottom_scores():
    scores = np.array([0.9, 0.1, 0.8, 0.2, 0.5, 0.4])
    included = np.array([True, False, False, False, True, True])
    # in: 0.9 (right), 0.8 (wrong); out: 0.1 (right), 0.2 (right)
    assert guess(scores, included, 2) == (4, 3)


def test_randomised_response_at_epsilon_1_is_never_bounded_above_1_at_95_percent():
    """Canary scores from an eps-DP mechanism (each bit told truthfully with probability
    e^eps / (1 + e^eps)): epsilon-hat must exceed eps in at most 5% of the runs."""
    rng = np.random.default_rng(0)
    eps, runs, above = 1.0, 200, 0
    for _ in range(runs):
        bits = rng.random(1000) < 0.5
        truthful = rng.random(1000) < np.exp(eps) / (1 + np.exp(eps))
        said = np.where(truthful, bits, ~bits)
        scores = said + rng.random(1000)  # ties broken at random; said-in above said-out
        result = audit(scores, bits, delta=0.0)
        above += result.epsilon_hat > eps
        assert result.m == 1000 and 0 < result.r <= 1000
    assert above <= 0.05 * runs
    # and it sees most of it: all 1000 guesses at accuracy e/(1+e) = 0.73 bound eps near 0.8
    assert result.epsilon_hat > 0.5


def test_perfect_canaries_hit_the_ceiling_of_m_and_random_scores_bound_nothing():
    rng = np.random.default_rng(1)
    bits = rng.random(1000) < 0.5
    perfect = audit(bits.astype(float), bits, 1e-5)
    # every guess right (r = 500: at 1000 the in and out counts would have to be exactly 500 each);
    # the ceiling of 1000 canaries at 95%, Bonferroni over the grid, is about 4.5
    assert perfect.v == perfect.r == 500 and 4 < perfect.epsilon_hat < 5
    noise = audit(rng.normal(size=1000), bits, 1e-5)
    assert noise.epsilon_hat == 0.0 and noise.r == 1000  # nothing ruled out: the overall accuracy shown


def test_the_grid_splits_the_confidence():
    bits = np.arange(1000) % 2 == 0
    result = audit(bits.astype(float), bits, 0.0)
    grid = len({max(1, int(f * 1000) // 2) for f in GUESS_GRID})
    assert result.epsilon_hat == pytest.approx(epsilon_lower_bound(1000, result.r, result.v, 0.0, 1 - 0.05 / grid))


def test_sound_means_within_the_accountants_epsilon():
    assert is_sound(2.0, 3.0) and is_sound(5.0, None) and is_sound(5.0, float("inf"))
    assert not is_sound(3.5, 3.0)

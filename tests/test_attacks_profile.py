"""attacks.tradeoff.profile_test: an audit's ROC against a whole claimed privacy profile (docs/theory.md §3.7)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from accountants import dpsgd, gaussian
from accountants.validation import InvalidArgument
from attacks import epsilon as epsilon_lib
from attacks import tradeoff

DELTA = 1e-5


def _gaussian_profile(mu: float) -> np.ndarray:
    """μ-GDP's profile on the grid of dpaudit.mechanisms.bounds.analytic_profile: 200 points on [0, 2ε] and ε."""
    epsilon = gaussian.epsilon_for_mu(DELTA, mu)
    grid = np.append(np.linspace(0.0, 2.0 * epsilon, 200), epsilon)
    return np.stack([grid, gaussian.delta_for_mu(grid, mu)], axis=1)


def _scores(rng, mu: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """IN ~ N(μ, 1), OUT ~ N(0, 1): the scores of the optimal attack on μ-GDP's Gaussian mechanism."""
    return rng.normal(mu, 1.0, n), rng.normal(0.0, 1.0, n)


def test_the_correct_mechanism_is_found_violated_in_at_most_5_percent_of_seeds():
    """Coverage: scores exactly on μ = 1's trade-off curve (the worst case for the test) against μ = 1's profile.

    The test errs with probability ≤ 5% by construction; the simultaneous bounds are conservative, so it errs far
    less: 0 of 300 seeds at 200 + 200 and 1000 + 1000 trials (the binomial 95% upper limit for 0 of 300 is 1%).
    """
    rng = np.random.default_rng(0)
    profile = _gaussian_profile(1.0)
    for n in (200, 1000):
        violated = [tradeoff.profile_test(*_scores(rng, 1.0, n), profile).violated for _ in range(300)]
        assert np.mean(violated) <= 0.05, n
        assert sum(violated) == 0, n


def test_half_the_noise_is_found_where_the_single_pair_cannot_see_it():
    """μ = 2 scores against μ = 1's claim (half-noise at q = 1): the profile test sees it, the single pair does not.

    In every one of 100 seeds at 2000 + 2000 trials the profile is refuted; the Clopper-Pearson ε bound at the same
    intervals exceeds ε = 4.38 in none.
    """
    rng = np.random.default_rng(1)
    profile = _gaussian_profile(1.0)
    epsilon = gaussian.epsilon_for_mu(DELTA, 1.0)
    profile_refutes = cp_refutes = 0
    for _ in range(100):
        in_scores, out_scores = _scores(rng, 2.0, 2000)
        test = tradeoff.profile_test(in_scores, out_scores, profile)
        profile_refutes += test.violated
        cp_refutes += epsilon_lib.clopper_pearson_epsilon(in_scores, out_scores, DELTA).epsilon > epsilon
        assert test.margin == pytest.approx(test.tpr_lower - test.allowed_tpr, abs=1e-15)
    assert (profile_refutes, cp_refutes) == (100, 0)


def test_a_single_pair_is_refuted_exactly_when_the_clopper_pearson_bound_exceeds_its_epsilon():
    """Same intervals, same thresholds: violated ⟺ CP ε > ε, in both directions of the bound."""
    rng = np.random.default_rng(2)
    agree = []
    for seed in range(60):
        in_scores, out_scores = _scores(rng, rng.uniform(0.5, 4.0), 300)
        if seed % 2:  # mirror, so that the tnr/fnr direction decides some of them
            in_scores, out_scores = -out_scores, -in_scores
        bound = epsilon_lib.clopper_pearson_epsilon(in_scores, out_scores, DELTA)
        claimed = rng.uniform(0.0, 2.0) * max(bound.epsilon, 0.1)
        test = tradeoff.profile_test(in_scores, out_scores, (claimed, DELTA))
        agree.append(test.violated == (bound.epsilon > claimed))
    assert all(agree)


def test_the_gaussian_profile_test_is_the_gdp_mu_test():
    """Against μ-GDP's whole profile the test asks whether μ_lo = Φ⁻¹(1 - FPR_hi) - Φ⁻¹(FNR_hi) > μ (Nasr et al.).

    The 201-point envelope lies within 2e-4 TPR of the exact curve, so the two agree except within that of it.
    """
    rng = np.random.default_rng(3)
    profile = _gaussian_profile(1.0)
    for _ in range(40):
        in_scores, out_scores = _scores(rng, rng.uniform(0.8, 2.0), 1000)
        test = tradeoff.profile_test(in_scores, out_scores, profile)
        exact = scipy.stats.norm.sf(scipy.stats.norm.isf(test.fpr_upper) - 1.0)
        assert test.allowed_tpr == pytest.approx(exact, abs=2e-4)
        mu_lower = epsilon_lib.gdp_epsilon(in_scores, out_scores, DELTA).mu_lower
        if abs(mu_lower - 1.0) > 0.01:
            assert test.violated == (mu_lower > 1.0)


def test_a_perfect_attack_sets_the_power_and_no_profile_is_refuted_beyond_it():
    """max_margin is the margin of all IN above all OUT; a weaker claim than it allows is never refuted."""
    in_scores, out_scores = np.arange(100.0) + 100, np.arange(100.0)
    perfect = tradeoff.profile_test(in_scores, out_scores, _gaussian_profile(1.0))
    assert perfect.violated and perfect.margin == pytest.approx(perfect.max_margin, abs=1e-12)
    loose = tradeoff.profile_test(in_scores, out_scores, _gaussian_profile(6.0))
    assert not loose.violated and loose.max_margin <= 0


def test_the_dp_sgd_profile_at_q_1_is_the_gaussian_one_and_below_it_the_pld_holds_the_reported_pair():
    epsilons = np.linspace(0, 8, 9)
    exact = dpsgd.privacy_profile(2.0, 1.0, 4, epsilons)
    np.testing.assert_allclose(exact[:, 1], gaussian.delta_for_mu(epsilons, 1.0), rtol=1e-12)  # μ = √4 / 2
    replace = dpsgd.privacy_profile(2.0, 1.0, 4, epsilons, neighbouring="replace-one")
    np.testing.assert_allclose(replace[:, 1], gaussian.delta_for_mu(epsilons, 2.0), rtol=1e-12)
    # Poisson q = 1/2: the PLD's pessimistic δ at its own ε(δ) is δ to the refinement's 0.5%.
    epsilon = dpsgd.epsilon(2.0, 0.5, 2, DELTA).epsilon
    ((_, delta),) = dpsgd.privacy_profile(2.0, 0.5, 2, [epsilon])
    assert delta == pytest.approx(DELTA, rel=0.02)


def test_bad_arguments_name_the_parameter():
    with pytest.raises(InvalidArgument, match="privacy_profile"):
        tradeoff.profile_test([1.0], [0.0], [[1.0, 2.0]])
    with pytest.raises(InvalidArgument, match="confidence"):
        tradeoff.profile_test([1.0], [0.0], (1.0, DELTA), confidence=1.0)
    with pytest.raises(InvalidArgument, match="SplitThreshold"):
        tradeoff.profile_test([1.0], [0.0], (1.0, DELTA), strategy=epsilon_lib.SplitThreshold())

"""attacks.tradeoff: largest TPR / AUC allowed by an (ε, δ) guarantee, and the audit verdict."""

import numpy as np
import pytest
import scipy.stats

from attacks import epsilon, metrics, tradeoff


def _gaussian_profile(mu, epsilons):
    """Exact privacy profile of the Gaussian mechanism, computed here with scipy."""
    first = scipy.stats.norm.cdf(-epsilons / mu + mu / 2)
    second = np.exp(epsilons) * scipy.stats.norm.cdf(-epsilons / mu - mu / 2)
    return np.column_stack([epsilons, first - second])


def _single_pair_auc(eps, delta):
    """Closed form: e^ε x + δ on [0, x*], 1 - e^{-ε}(1 - δ - x) on [x*, 1 - δ], 1 on [1 - δ, 1]."""
    kink = (1 - delta) / (np.exp(eps) + 1)
    return (
        np.exp(eps) * kink**2 / 2
        + delta * kink
        + (1 - delta - kink)
        - np.exp(-eps) * (1 - delta - kink) ** 2 / 2
        + delta
    )


def test_max_auc_of_full_gaussian_profile_is_gaussian_auc():
    mu = 1.0
    profile = _gaussian_profile(mu, np.linspace(0.0, 12.0, 4001))
    # Measured error: 8e-8 (the envelope of 8002 tangent lines of the Gaussian tradeoff curve).
    gaussian_auc = scipy.stats.norm.cdf(mu / np.sqrt(2))
    assert tradeoff.max_auc(profile) == pytest.approx(gaussian_auc, abs=1e-3)
    assert tradeoff.max_auc(profile) >= gaussian_auc


@pytest.mark.parametrize("eps", [0.0, 0.25, 1.0, 2.0, 4.0, 8.0])
def test_single_pair_of_gaussian_profile_bounds_the_gaussian_auc_from_above(eps):
    mu = 1.0
    pair = _gaussian_profile(mu, np.array([eps]))[0]
    assert tradeoff.max_auc(pair) == pytest.approx(_single_pair_auc(*pair), abs=1e-12)
    assert tradeoff.max_auc(pair) >= scipy.stats.norm.cdf(mu / np.sqrt(2)) - 1e-12


@pytest.mark.parametrize("eps, delta", [(0.0, 0.0), (0.5, 0.1), (1.0, 1e-5), (3.0, 0.2), (50.0, 1e-9)])
def test_max_auc_of_single_pair_matches_closed_form(eps, delta):
    assert tradeoff.max_auc((eps, delta)) == pytest.approx(_single_pair_auc(eps, delta), abs=1e-12)


def test_max_tpr_of_full_gaussian_profile_is_the_gaussian_tradeoff_curve():
    mu = 1.0
    profile = _gaussian_profile(mu, np.linspace(0.0, 12.0, 4001))
    fpr = np.array([1e-4, 1e-3, 0.01, 0.1, 0.5, 0.9])
    exact = scipy.stats.norm.sf(scipy.stats.norm.isf(fpr) - mu)
    bound = tradeoff.max_tpr_at_fpr(fpr, profile)
    assert np.all(bound >= exact - 1e-12)
    np.testing.assert_allclose(bound, exact, atol=1e-4)


def test_max_tpr_formula_and_minimum_over_pairs():
    fpr = np.array([0.0, 0.01, 0.2, 0.6, 1.0])
    one = tradeoff.max_tpr_at_fpr(fpr, (1.0, 0.01))
    expected = np.clip(np.minimum(np.e * fpr + 0.01, 1 - np.exp(-1.0) * (1 - 0.01 - fpr)), 0, 1)
    np.testing.assert_allclose(one, expected, atol=1e-15)
    two = tradeoff.max_tpr_at_fpr(fpr, [(1.0, 0.01), (0.5, 0.1)])
    np.testing.assert_allclose(two, np.minimum(one, tradeoff.max_tpr_at_fpr(fpr, (0.5, 0.1))), atol=1e-15)
    assert tradeoff.max_tpr_at_fpr(0.0, (2.0, 1e-5)) == pytest.approx(1e-5)


def test_inapplicable_and_huge_epsilon_constrain_nothing_or_only_at_zero():
    assert tradeoff.max_auc((np.inf, 0.0)) == 1.0
    np.testing.assert_array_equal(tradeoff.max_tpr_at_fpr([0.0, 0.3], (np.inf, 0.0)), [1.0, 1.0])
    with_inapplicable = tradeoff.max_auc([(np.inf, 0.0), (1.0, 1e-5)])
    assert with_inapplicable == pytest.approx(_single_pair_auc(1.0, 1e-5))
    # e^1000 overflows; the bound is then TPR ≤ δ at FPR = 0 and 1 elsewhere.
    np.testing.assert_allclose(tradeoff.max_tpr_at_fpr([0.0, 1e-9], (1000.0, 1e-6)), [1e-6, 1.0])
    assert tradeoff.max_auc((1000.0, 1e-6)) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "profile, message",
    [
        ((-1.0, 0.1), "ε values"),
        ((1.0, 1.5), "δ values"),
        ((np.nan, 0.1), "ε values"),
        ([(1.0, 0.1, 3.0)], "shape"),
        (np.empty((0, 2)), "shape"),
        ("eps", "privacy_profile"),
    ],
)
def test_bad_profiles_raise_value_error(profile, message):
    with pytest.raises(ValueError, match=message):
        tradeoff.max_auc(profile)


def test_bad_fpr_raises_value_error():
    with pytest.raises(ValueError, match="fpr"):
        tradeoff.max_tpr_at_fpr([0.5, 1.2], (1.0, 0.0))


def _scores(mu, n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(mu, 1.0, n), rng.normal(0.0, 1.0, n)


def test_verdict_violated_when_empirical_epsilon_exceeds_analytic():
    bound = epsilon.clopper_pearson_epsilon(np.arange(1000) + 2000.0, np.arange(1000.0), 1e-5)
    verdict = tradeoff.audit_verdict(bound, analytic_epsilon=1.0)
    assert verdict.outcome == "violated"
    root = (0.05 / 40) ** (1 / 1000)  # perfect separation; default grid: 10 counts per class, α' = 0.05 / 40
    assert verdict.empirical_epsilon == pytest.approx(np.log((root - 1e-5) / (1 - root)), rel=1e-9)
    assert verdict.empirical_epsilon == pytest.approx(5.0046, abs=1e-4)
    assert "exceeds the analytic ε = 1" in verdict.reason


def test_verdict_consistent_when_audit_had_power_and_found_nothing():
    mu = 1.0
    in_scores, out_scores = _scores(mu, 2000)
    bound = epsilon.gdp_epsilon(in_scores, out_scores, 1e-5)
    analytic = epsilon.gaussian_dp_epsilon(mu, 1e-5)
    summary = metrics.summarize(in_scores, out_scores)
    verdict = tradeoff.audit_verdict(
        bound,
        analytic,
        auc_lower=summary.auc_ci[0],
        max_allowed_auc=tradeoff.max_auc(_gaussian_profile(mu, np.linspace(0, 12, 2001))),
    )
    assert verdict.outcome == "consistent"
    assert bound.epsilon <= analytic < bound.max_certifiable_epsilon


def test_verdict_inconclusive_when_even_a_perfect_attack_could_not_refute():
    bound = epsilon.clopper_pearson_epsilon(*_scores(3.0, 10), 1e-5)
    verdict = tradeoff.audit_verdict(bound, analytic_epsilon=5.0)
    assert verdict.outcome == "inconclusive"
    root = (0.05 / 16) ** (1 / 10)  # default grid: counts 0, 1, 2, 4 per class, α' = 0.05 / 16
    assert verdict.max_certifiable_epsilon == pytest.approx(np.log((root - 1e-5) / (1 - root)), rel=1e-9)
    assert "run more trials" in verdict.reason


@pytest.mark.parametrize("analytic", [None, np.inf, np.nan])
def test_verdict_inconclusive_without_a_finite_analytic_bound(analytic):
    bound = epsilon.clopper_pearson_epsilon(np.arange(1000) + 2000.0, np.arange(1000.0), 1e-5)
    verdict = tradeoff.audit_verdict(bound, analytic_epsilon=analytic)
    assert verdict.outcome == "inconclusive"
    assert "no finite analytic ε" in verdict.reason


def test_verdict_violated_by_auc_alone():
    bound = epsilon.clopper_pearson_epsilon(*_scores(1.0, 200), 1e-5)
    verdict = tradeoff.audit_verdict(bound, analytic_epsilon=3.0, auc_lower=0.8, max_allowed_auc=0.75)
    assert verdict.outcome == "violated"
    assert "AUC" in verdict.reason


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"auc_lower": 0.7}, "give both or neither"),
        ({"auc_lower": 1.5, "max_allowed_auc": 0.9}, "auc_lower"),
        ({"analytic_epsilon": -1.0}, "analytic_epsilon"),
        ({"empirical": 0.5}, "EpsilonLowerBound"),
    ],
)
def test_verdict_rejects_bad_arguments(kwargs, message):
    bound = epsilon.clopper_pearson_epsilon([1.0, 2.0], [0.0, 1.0], 1e-5)
    arguments = {"empirical": bound, "analytic_epsilon": 1.0} | kwargs
    with pytest.raises(ValueError, match=message):
        tradeoff.audit_verdict(**arguments)

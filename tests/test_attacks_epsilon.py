"""attacks.epsilon: validity, power and mechanics of the empirical ε lower bounds.

Synthetic audits use IN ∼ N(μ, 1), OUT ∼ N(0, 1): the pair is exactly μ-GDP, so its true ε(δ) is
known, and a valid 95% lower bound may exceed it in at most 5% of runs.
"""

import numpy as np
import pytest
import scipy.optimize
import scipy.stats

from attacks import epsilon

DELTA = 1e-5
BOUNDS = {"clopper_pearson": epsilon.clopper_pearson_epsilon, "gdp": epsilon.gdp_epsilon}
STRATEGIES = {
    "grid": epsilon.GridThresholds(),
    "bonferroni": epsilon.BonferroniThresholds(),
    "split": epsilon.SplitThreshold(seed=3),
}


def _true_epsilon(mu, delta):
    """ε(δ) of μ-GDP computed here, independently of attacks.epsilon."""

    def gap(eps):
        return scipy.stats.norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * scipy.stats.norm.cdf(-eps / mu - mu / 2) - delta

    # At ε = μ²/2 + μ Φ⁻¹(1 - δ) the first term alone equals δ, so the root lies below it.
    upper = mu * (mu / 2 + scipy.stats.norm.isf(delta))
    return scipy.optimize.brentq(gap, 0.0, upper, xtol=1e-13)


def _audit_scores(mu, n, seed):
    rng = np.random.default_rng([seed, n, int(mu * 1000)])
    return rng.normal(mu, 1.0, n), rng.normal(0.0, 1.0, n)


def _binomial_tail(count, runs, rate=0.05):
    """P(X ≥ count) for X ∼ Bin(runs, rate): how surprising `count` failures are at that rate."""
    return scipy.stats.binom.sf(count - 1, runs, rate)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("method", BOUNDS)
def test_lower_bound_exceeds_true_epsilon_in_at_most_5_percent_of_runs(method, strategy):
    runs = exceedances = 0
    for mu in (0.5, 2.0):
        true_epsilon = _true_epsilon(mu, DELTA)
        for n in (100, 1000, 10000):
            for seed in range(30):
                scores = _audit_scores(mu, n, seed)
                bound = BOUNDS[method](*scores, DELTA, 0.95, STRATEGIES[strategy])
                runs += 1
                exceedances += bound.epsilon > true_epsilon
    # Measured: 0 of 180 for every method and strategy; the largest bound was 0.49 of the true ε
    # (CP) and 0.98 (GDP) with Bonferroni over all thresholds, 0.67 (CP) and 0.98 (GDP) with the grid.
    assert runs == 180
    assert _binomial_tail(exceedances, runs) > 1e-3, exceedances


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("method", BOUNDS)
def test_null_distributions_give_zero_in_at_least_95_percent_of_runs(method, strategy):
    zeros = runs = 0
    for n in (100, 1000, 10000):
        for seed in range(30):
            bound = BOUNDS[method](*_audit_scores(0.0, n, seed), DELTA, 0.95, STRATEGIES[strategy])
            runs += 1
            zeros += bound.epsilon == 0.0
    assert zeros >= 0.95 * runs, (zeros, runs)


def test_null_campaign_of_64_plus_64_gives_zero_in_at_least_19_of_20():
    zeros = sum(
        epsilon.clopper_pearson_epsilon(*_audit_scores(0.0, 64, seed), DELTA).epsilon == 0.0 for seed in range(20)
    )
    assert zeros >= 19


def test_gdp_route_recovers_80_percent_of_true_epsilon_with_5000_trials_each():
    in_scores, out_scores = _audit_scores(2.0, 5000, seed=0)
    bound = epsilon.gdp_epsilon(in_scores, out_scores, DELTA)
    true_epsilon = _true_epsilon(2.0, DELTA)
    assert true_epsilon == pytest.approx(9.9973, abs=1e-4)
    # The Clopper-Pearson route recovers 0.43 of ε on the same scores; Bonferroni over all thresholds
    # recovered 0.8823 (μ_lo = 1.8056) with the GDP route and 0.37 with the CP route.
    assert bound.epsilon / true_epsilon >= 0.8
    assert bound.epsilon / true_epsilon == pytest.approx(0.9113, abs=1e-4)
    assert bound.mu_lower == pytest.approx(1.8542, abs=1e-4)
    assert bound.alpha_per_bound == pytest.approx(0.05 / 52)  # 13 grid counts per class, 2 bounds each


@pytest.mark.parametrize("mu", [0.05, 0.5, 1.0, 2.0, 5.0, 20.0])
@pytest.mark.parametrize("delta", [1e-2, 1e-5, 1e-10])
def test_gaussian_dp_epsilon_inverts_the_exact_profile(mu, delta):
    eps = epsilon.gaussian_dp_epsilon(mu, delta)
    if 2 * scipy.stats.norm.cdf(mu / 2) - 1 <= delta:
        assert eps == 0.0
    else:
        assert eps == pytest.approx(_true_epsilon(mu, delta), rel=1e-9, abs=1e-12)
        assert epsilon.gaussian_dp_delta(mu, eps) == pytest.approx(delta, rel=1e-8)


def test_gaussian_dp_edge_cases():
    assert epsilon.gaussian_dp_epsilon(0.0, 1e-5) == 0.0
    assert epsilon.gaussian_dp_delta(0.0, 1.0) == 0.0
    assert epsilon.gaussian_dp_delta(1.0, 0.0) == pytest.approx(2 * scipy.stats.norm.cdf(0.5) - 1)
    with pytest.raises(ValueError, match="delta must be > 0"):
        epsilon.gaussian_dp_epsilon(1.0, 0.0)
    with pytest.raises(ValueError, match="mu"):
        epsilon.gaussian_dp_epsilon(-1.0, 1e-5)
    with pytest.raises(ValueError, match="mu"):
        epsilon.gaussian_dp_epsilon(np.inf, 1e-5)


def _hand_clopper_pearson_epsilon(tp, fp, n_in, n_out, alpha, delta):
    tpr_lo = scipy.stats.beta.ppf(alpha, tp, n_in - tp + 1) if tp else 0.0
    fpr_hi = scipy.stats.beta.ppf(1 - alpha, fp + 1, n_out - fp) if fp < n_out else 1.0
    forward = np.log(tpr_lo - delta) - np.log(fpr_hi) if tpr_lo > delta else -np.inf
    tnr_lo, fnr_hi = 1 - fpr_hi, 1 - tpr_lo
    backward = np.log(tnr_lo - delta) - np.log(fnr_hi) if tnr_lo > delta else -np.inf
    return max(forward, backward, 0.0), tpr_lo, fpr_hi


def test_fixed_threshold_bound_matches_hand_computation():
    in_scores, out_scores = _audit_scores(1.5, 500, seed=1)
    bound = epsilon.clopper_pearson_epsilon(in_scores, out_scores, 1e-3, 0.9, epsilon.FixedThreshold(1.0))
    tp, fp = int(np.sum(in_scores >= 1.0)), int(np.sum(out_scores >= 1.0))
    expected, tpr_lo, fpr_hi = _hand_clopper_pearson_epsilon(tp, fp, 500, 500, 0.05, 1e-3)
    assert (bound.true_positives, bound.false_positives, bound.threshold) == (tp, fp, 1.0)
    assert bound.alpha_per_bound == pytest.approx(0.05)
    assert bound.epsilon == pytest.approx(expected, rel=1e-10)
    assert (bound.tpr_lower, bound.fpr_upper) == (pytest.approx(tpr_lo), pytest.approx(fpr_hi))
    assert bound.epsilon == pytest.approx(1.1027, abs=1e-4)


def test_bonferroni_bound_is_best_threshold_at_corrected_level():
    in_scores, out_scores = _audit_scores(2.0, 150, seed=2)
    bound = epsilon.clopper_pearson_epsilon(in_scores, out_scores, DELTA, strategy=epsilon.BonferroniThresholds())
    alpha = 0.05 / 300
    assert bound.alpha_per_bound == pytest.approx(alpha)
    best = max(
        _hand_clopper_pearson_epsilon(
            int(np.sum(in_scores >= t)), int(np.sum(out_scores >= t)), 150, 150, alpha, DELTA
        )[0]
        for t in np.unique(np.r_[in_scores, out_scores])
    )
    assert bound.epsilon == pytest.approx(best, rel=1e-10)
    assert bound.direction in ("tpr/fpr", "tnr/fnr")
    assert bound.true_positives == np.sum(in_scores >= bound.threshold)


def test_grid_bound_is_best_of_its_thresholds_at_corrected_level():
    in_scores, out_scores = _audit_scores(2.0, 150, seed=2)
    bound = epsilon.clopper_pearson_epsilon(in_scores, out_scores, DELTA)
    counts = [0, 1, 2, 4, 8, 16, 32, 64]  # ⌊2^j⌋ ≤ 75
    alpha = 0.05 / (2 * 2 * len(counts))
    assert bound.alpha_per_bound == pytest.approx(alpha)
    forward = [  # just above the (j+1)-th largest OUT score: FP = j
        _hand_clopper_pearson_epsilon(int(np.sum(in_scores > t)), j, 150, 150, alpha, DELTA)[0]
        for j, t in zip(counts, np.sort(out_scores)[::-1][counts])
    ]
    backward = [  # at the (j+1)-th smallest IN score: FN = j
        _hand_clopper_pearson_epsilon(150 - j, int(np.sum(out_scores >= t)), 150, 150, alpha, DELTA)[0]
        for j, t in zip(counts, np.sort(in_scores)[counts])
    ]
    assert bound.epsilon == pytest.approx(max(forward + backward), rel=1e-10)
    bonferroni = epsilon.BonferroniThresholds()
    assert bound.epsilon > epsilon.clopper_pearson_epsilon(in_scores, out_scores, DELTA, strategy=bonferroni).epsilon


def test_split_is_seeded_and_bounds_on_the_held_out_part():
    in_scores, out_scores = _audit_scores(2.0, 1001, seed=4)
    strategy = epsilon.SplitThreshold(selection_fraction=0.3, seed=11)
    first = epsilon.clopper_pearson_epsilon(in_scores, out_scores, DELTA, strategy=strategy)
    again = epsilon.clopper_pearson_epsilon(in_scores, out_scores, DELTA, strategy=strategy)
    assert first == again
    assert (first.n_in, first.n_out) == (1001 - 300, 1001 - 300)
    assert first.alpha_per_bound == pytest.approx(0.025)
    other_seed = epsilon.clopper_pearson_epsilon(
        in_scores, out_scores, DELTA, strategy=epsilon.SplitThreshold(0.3, seed=12)
    )
    assert other_seed.threshold != first.threshold


@pytest.mark.parametrize("method", BOUNDS)
def test_perfect_separation_reaches_max_certifiable_epsilon(method):
    bound = BOUNDS[method](np.arange(100) + 1000.0, np.arange(100.0), DELTA)
    assert bound.epsilon == pytest.approx(bound.max_certifiable_epsilon)
    assert bound.epsilon > 0
    # CP: ln((α'^{1/n} - δ) / (1 - α'^{1/n})) with α' = 0.05 / 28 (grid counts 0, 1, 2, 4, …, 32 per class).
    if method == "clopper_pearson":
        root = (0.05 / 28) ** (1 / 100)
        assert bound.epsilon == pytest.approx(np.log((root - DELTA) / (1 - root)), rel=1e-9)


@pytest.mark.parametrize("method", BOUNDS)
@pytest.mark.parametrize(
    "in_scores, out_scores",
    [
        ([2.0] * 50, [2.0] * 50),  # constant scores
        ([0.0, 1.0, 1.0, 2.0], [1.0, 1.0, 0.0, 2.0]),  # ties, same distribution
        ([0.0, 1.0, 2.0], [10.0, 11.0, 12.0]),  # reversed attack
        ([3.0], [1.0]),  # one trial per class
    ],
)
def test_edge_cases_give_defined_bounds(method, in_scores, out_scores):
    bound = BOUNDS[method](in_scores, out_scores, DELTA)
    assert bound.epsilon == 0.0
    assert np.isfinite(bound.threshold)
    assert 0.0 <= bound.tpr_lower <= 1.0 and 0.0 < bound.fpr_upper <= 1.0


@pytest.mark.parametrize("method", BOUNDS)
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"in_scores": []}, "in_scores is empty"),
        ({"out_scores": []}, "out_scores is empty"),
        ({"in_scores": [1.0, np.nan]}, "in_scores contains 1 non-finite"),
        ({"delta": 1.0}, "delta"),
        ({"delta": -1e-5}, "delta"),
        ({"confidence": 1.0}, "confidence"),
        ({"strategy": "split"}, "strategy must be"),
        ({"in_scores": [1.0], "strategy": epsilon.SplitThreshold()}, "BonferroniThresholds"),
    ],
)
def test_bad_arguments_raise_value_error_naming_the_problem(method, kwargs, message):
    arguments = {"in_scores": [1.0, 2.0], "out_scores": [0.0, 1.0], "delta": DELTA} | kwargs
    with pytest.raises(ValueError, match=message):
        BOUNDS[method](**arguments)


def test_gdp_needs_positive_delta_and_strategies_validate():
    with pytest.raises(ValueError, match="delta must be > 0"):
        epsilon.gdp_epsilon([1.0, 2.0], [0.0, 1.0], 0.0)
    assert epsilon.clopper_pearson_epsilon([1.0, 2.0], [0.0, 1.0], 0.0).epsilon == 0.0
    with pytest.raises(ValueError, match="selection_fraction"):
        epsilon.SplitThreshold(selection_fraction=1.0)
    with pytest.raises(ValueError, match="seed"):
        epsilon.SplitThreshold(seed=-1)
    with pytest.raises(ValueError, match="threshold"):
        epsilon.FixedThreshold(float("nan"))
    with pytest.raises(ValueError, match="ratio"):
        epsilon.GridThresholds(ratio=1.0)

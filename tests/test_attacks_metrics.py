"""attacks.metrics and attacks.clopper_pearson: ROC, AUC and its interval, accuracy, TPR@FPR."""

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics

from accountants.validation import InvalidArgument
from attacks import clopper_pearson, metrics


def _tied_scores(seed, n_in, n_out):
    rng = np.random.default_rng(seed)
    # Few distinct values, so most scores are tied, within and across the classes.
    return rng.integers(0, 12, n_in) + 1.0, rng.integers(0, 10, n_out) * 1.0


def _sklearn_inputs(in_scores, out_scores):
    labels = np.r_[np.ones(in_scores.size), np.zeros(out_scores.size)]
    return labels, np.r_[in_scores, out_scores]


@pytest.mark.parametrize("seed, n_in, n_out", [(0, 1, 1), (1, 7, 3), (2, 300, 200), (3, 1000, 1500)])
def test_auc_and_roc_match_sklearn_with_ties(seed, n_in, n_out):
    in_scores, out_scores = _tied_scores(seed, n_in, n_out)
    labels, scores = _sklearn_inputs(in_scores, out_scores)

    assert metrics.auc(in_scores, out_scores) == pytest.approx(sklearn.metrics.roc_auc_score(labels, scores), abs=1e-12)
    expected_fpr, expected_tpr, expected_thresholds = sklearn.metrics.roc_curve(labels, scores, drop_intermediate=False)
    roc = metrics.roc_curve(in_scores, out_scores)
    np.testing.assert_allclose(roc.fpr, expected_fpr, rtol=0, atol=1e-12)
    np.testing.assert_allclose(roc.tpr, expected_tpr, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(roc.thresholds, expected_thresholds)


def test_auc_equals_trapezoidal_area_of_roc():
    in_scores, out_scores = _tied_scores(4, 50, 70)
    roc = metrics.roc_curve(in_scores, out_scores)
    area = np.trapezoid(roc.tpr, roc.fpr)
    assert metrics.auc(in_scores, out_scores) == pytest.approx(area, abs=1e-12)


def test_balanced_accuracy_is_best_threshold_by_brute_force():
    in_scores, out_scores = _tied_scores(5, 40, 60)
    candidates = np.r_[np.inf, np.unique(np.r_[in_scores, out_scores])]
    brute_force = max(0.5 * (np.mean(in_scores >= t) + np.mean(out_scores < t)) for t in candidates)
    assert metrics.balanced_accuracy(in_scores, out_scores) == pytest.approx(brute_force, abs=1e-15)


def test_tpr_at_fpr_by_brute_force_with_clopper_pearson_interval():
    rng = np.random.default_rng(6)
    in_scores, out_scores = rng.normal(1.0, 1.0, 400), rng.normal(0.0, 1.0, 1000)
    result = metrics.tpr_at_fpr(in_scores, out_scores, fprs=(0.1, 0.01, 0.001), confidence=0.9)
    for target, (tpr, (lower, upper)) in result.items():
        thresholds = np.r_[np.inf, np.unique(np.r_[in_scores, out_scores])]
        allowed = [t for t in thresholds if np.mean(out_scores >= t) <= target]
        best_hits = max(int(np.sum(in_scores >= t)) for t in allowed)
        assert tpr == best_hits / 400
        assert lower == pytest.approx(scipy.stats.beta.ppf(0.05, best_hits, 400 - best_hits + 1))
        assert upper == pytest.approx(scipy.stats.beta.ppf(0.95, best_hits + 1, 400 - best_hits))


def test_clopper_pearson_matches_textbook_values_and_edges():
    lower, upper = clopper_pearson.clopper_pearson_interval(np.array([3]), np.array([10]), 0.95)
    assert lower[0] == pytest.approx(0.066739, abs=1e-6)
    assert upper[0] == pytest.approx(0.652453, abs=1e-6)
    assert clopper_pearson.clopper_pearson_lower(0, 10, 0.05) == 0.0
    assert clopper_pearson.clopper_pearson_upper(10, 10, 0.05) == 1.0
    # k = 0: upper bound 1 - α^{1/n}, kept to full relative precision for large n.
    assert clopper_pearson.clopper_pearson_upper(0, 10**6, 0.05) == pytest.approx(
        -np.expm1(np.log(0.05) / 1e6), rel=1e-12
    )
    assert clopper_pearson.clopper_pearson_lower(10, 10, 0.05) == pytest.approx(0.05**0.1)


@pytest.mark.parametrize(
    "successes, trials, alpha, message",
    [
        (5, 3, 0.05, "successes"),
        (-1, 3, 0.05, "successes"),
        (1, 0, 0.05, "trials"),
        (1.5, 3, 0.05, "integer"),
        (1, 3, 0.0, "alpha"),
        (1, 3, 1.0, "alpha"),
    ],
)
def test_clopper_pearson_rejects_bad_counts(successes, trials, alpha, message):
    with pytest.raises(ValueError, match=message):
        clopper_pearson.clopper_pearson_upper(successes, trials, alpha)


def test_auc_interval_solves_newcombe_score_equation_on_a_grid():
    rng = np.random.default_rng(7)
    in_scores, out_scores = rng.normal(1.2, 1.0, 30), rng.normal(0.0, 1.0, 45)
    estimate = metrics.auc(in_scores, out_scores)
    z = scipy.stats.norm.isf(0.05)
    grid = np.linspace(0.0, 1.0, 2_000_001)
    n_star = (30 + 45) / 2 - 1
    variance = grid * (1 - grid) / (30 * 45) * (1 + n_star * (1 - grid) / (2 - grid) + n_star * grid / (1 + grid))
    inside = grid[(estimate - grid) ** 2 <= z**2 * variance]
    lower, upper = metrics.auc_confidence_interval(in_scores, out_scores, confidence=0.9)
    assert lower == pytest.approx(inside.min(), abs=1e-6)
    assert upper == pytest.approx(inside.max(), abs=1e-6)


def test_auc_interval_lower_limit_is_valid_near_one():
    """Binormal AUC Φ(2.5/√2) = 0.96 with 20 + 20 scores: the 95% lower limit is valid.

    The 95% lower limit may exceed the true
    AUC in at most 2.5% of runs; the count over 400 runs must not be improbably high for that.
    """
    true_auc = scipy.stats.norm.cdf(2.5 / np.sqrt(2))
    runs, too_high, covered = 400, 0, 0
    for seed in range(runs):
        rng = np.random.default_rng([8, seed])
        lower, upper = metrics.auc_confidence_interval(
            rng.normal(2.5, 1.0, 20), rng.normal(0.0, 1.0, 20), confidence=0.95
        )
        too_high += lower > true_auc
        covered += lower <= true_auc <= upper
    assert scipy.stats.binom.sf(too_high - 1, runs, 0.025) > 1e-3, too_high
    assert covered / runs >= 0.93


def test_auc_interval_stays_below_one_under_perfect_separation():
    lower, upper = metrics.auc_confidence_interval(np.arange(50) + 100.0, np.arange(50.0), 0.95)
    assert upper == 1.0
    assert lower == pytest.approx(0.96034, abs=1e-5)


def test_summarize_reports_every_field():
    rng = np.random.default_rng(9)
    in_scores, out_scores = rng.normal(1.0, 1.0, 2000), rng.normal(0.0, 1.0, 3000)
    summary = metrics.summarize(in_scores, out_scores)
    assert summary.auc == pytest.approx(scipy.stats.norm.cdf(1 / np.sqrt(2)), abs=0.015)
    assert summary.auc_ci[0] < summary.auc < summary.auc_ci[1]
    assert summary.balanced_accuracy == metrics.balanced_accuracy(in_scores, out_scores)
    assert set(summary.tpr_at_fpr) == {0.1, 0.01, 0.001}
    for f, tpr in summary.tpr_at_fpr.items():
        lower, upper = summary.tpr_at_fpr_ci[f]
        assert lower <= tpr <= upper
    assert (summary.n_in, summary.n_out, summary.confidence) == (2000, 3000, 0.95)
    fpr, tpr = summary.roc
    assert fpr.shape == tpr.shape == (5001,)
    with pytest.raises(ValueError):
        fpr[0] = 1.0  # read-only: the result is immutable


@pytest.mark.parametrize(
    "in_scores, out_scores, expected_auc, expected_balanced_accuracy",
    [
        ([3.0, 3.0, 3.0], [3.0, 3.0], 0.5, 0.5),  # constant scores: no signal
        ([1.0, 2.0, 2.0], [2.0, 0.0], (1 * 1 + 2 * 1.5) / 6, 0.75),  # ties count ½
        ([5.0], [4.0], 1.0, 1.0),  # one score per class
        ([0.0, 1.0], [2.0, 3.0], 0.0, 0.5),  # reversed attack: AUC 0, best threshold is "all"
    ],
)
def test_edge_cases_give_defined_results(in_scores, out_scores, expected_auc, expected_balanced_accuracy):
    summary = metrics.summarize(in_scores, out_scores)
    assert summary.auc == pytest.approx(expected_auc)
    assert summary.balanced_accuracy == pytest.approx(expected_balanced_accuracy)
    assert 0.0 <= summary.auc_ci[0] <= summary.auc <= summary.auc_ci[1] <= 1.0
    assert all(0.0 <= tpr <= 1.0 for tpr in summary.tpr_at_fpr.values())


@pytest.mark.parametrize(
    "in_scores, out_scores, message",
    [
        ([], [1.0], "in_scores is empty"),
        ([1.0], [], "out_scores is empty"),
        ([1.0, np.nan], [0.0], r"in_scores contains 1 non-finite value.*index 1"),
        ([1.0], [np.inf, 0.0], "out_scores contains 1 non-finite"),
        ([[1.0, 2.0]], [0.0], "in_scores must be a 1-D array"),
        (["a"], [0.0], r"in_scores must hold real numbers; got dtype <U1 \(text\)"),
    ],
)
def test_bad_scores_raise_value_error_naming_the_problem(in_scores, out_scores, message):
    with pytest.raises(ValueError, match=message):
        metrics.summarize(in_scores, out_scores)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"fprs": (0.0,)}, "fprs"),
        ({"fprs": ()}, "fprs"),
        ({"fprs": (1.5,)}, "fprs"),
        ({"confidence": 1.0}, "confidence"),
        ({"confidence": 0}, "confidence"),
    ],
)
def test_bad_options_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        metrics.summarize([1.0, 2.0], [0.0, 1.0], **kwargs)


# --- model-level bootstrap of the AUC (all-examples design) ---


def _models_with_a_model_effect(rng, models=32, targets=60, mean_effect=0.5, effect_std=0.5):
    """Scores N(0, 1) OUT and N(μ_k, 1) IN, μ_k ~ N(0.5, 0.5²) per model: the pooled AUC's truth is Φ(0.5 / √2.25)."""
    membership = np.stack([rng.permutation(np.arange(targets) < targets // 2) for _ in range(models)])
    effect = rng.normal(mean_effect, effect_std, models)[:, np.newaxis]
    return rng.normal(0.0, 1.0, (models, targets)) + effect * membership, membership


def test_model_bootstrap_covers_the_truth_where_the_trial_level_interval_does_not():
    rng = np.random.default_rng(1)
    truth = scipy.stats.norm.cdf(0.5 / np.sqrt(0.5**2 + 2.0))
    simulations, covered, trial_covered, wider = 100, 0, 0, 0
    for repeat in range(simulations):
        scores, membership = _models_with_a_model_effect(rng)
        low, high = metrics.model_bootstrap_auc_interval(scores, membership, resamples=200, seed=repeat)
        trial_low, trial_high = metrics.auc_confidence_interval(scores[membership], scores[~membership])
        covered += low <= truth <= high
        trial_covered += trial_low <= truth <= trial_high
        wider += (high - low) > (trial_high - trial_low)
    assert 0.88 <= covered / simulations <= 1.0  # 0.95 nominal (0.935 over 200 such runs with 400 resamples)
    assert trial_covered / simulations < 0.8  # trials share models: the trial-level interval is too narrow
    assert wider == simulations


def test_model_bootstrap_of_identical_models_is_the_point_auc_with_ties():
    row_scores = np.array([3.0, 1.0, 2.0, 2.0, 0.0, 2.0])  # ties across IN and OUT count ½
    row_membership = np.array([True, False, True, False, False, True])
    scores, membership = np.tile(row_scores, (5, 1)), np.tile(row_membership, (5, 1))
    expected = metrics.auc(row_scores[row_membership], row_scores[~row_membership])
    low, high = metrics.model_bootstrap_auc_interval(scores, membership, resamples=100, seed=3)
    assert low == pytest.approx(expected, abs=1e-12) and high == pytest.approx(expected, abs=1e-12)


def test_model_bootstrap_equals_the_auc_of_the_copied_rows():
    # The weighted computation against its definition: each draw's rows copied out, the pooled AUC, the quantiles.
    rng = np.random.default_rng(4)
    scores = np.round(rng.normal(size=(6, 9)), 1)  # rounded: ties across IN and OUT
    membership = np.stack([rng.permutation(np.arange(9) < 4) for _ in range(6)])
    draws = np.random.default_rng(7)
    aucs = []
    for _ in range(150):
        rows = draws.integers(0, 6, 6)
        aucs.append(metrics.auc(scores[rows][membership[rows]], scores[rows][~membership[rows]]))
    expected = np.quantile(aucs, [0.05, 0.95])
    actual = metrics.model_bootstrap_auc_interval(scores, membership, confidence=0.9, resamples=150, seed=7)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-12)


def test_model_bootstrap_is_seeded():
    scores, membership = _models_with_a_model_effect(np.random.default_rng(2), models=8, targets=10)
    first = metrics.model_bootstrap_auc_interval(scores, membership, resamples=100, seed=5)
    assert first == metrics.model_bootstrap_auc_interval(scores, membership, resamples=100, seed=5)
    assert first != metrics.model_bootstrap_auc_interval(scores, membership, resamples=100, seed=6)


@pytest.mark.parametrize(
    "scores, membership, options, message",
    [
        (np.zeros((1, 4)), np.array([[True, False, True, False]]), {}, "at least 2 models"),
        (np.zeros((2, 4)), np.zeros((2, 3), dtype=bool), {}, "one shape"),
        (np.zeros(4), np.zeros(4, dtype=bool), {}, "one shape"),
        (np.zeros((2, 2)), np.array([[1, 0], [0, 1]]), {}, "bool"),
        (np.array([[np.nan, 0.0], [0.0, 1.0]]), np.array([[True, False], [False, True]]), {}, "finite"),
        (np.zeros((2, 2)), np.array([[True, True], [False, True]]), {}, "one IN and one OUT"),
        (np.zeros((2, 2)), np.array([[True, False], [False, True]]), {"resamples": 99}, ">= 100"),
        (np.zeros((2, 2)), np.array([[True, False], [False, True]]), {"confidence": 1.0}, r"\(0, 1\)"),
    ],
)
def test_model_bootstrap_refuses_degenerate_inputs(scores, membership, options, message):
    with pytest.raises(InvalidArgument, match=message):
        metrics.model_bootstrap_auc_interval(scores, membership, **options)

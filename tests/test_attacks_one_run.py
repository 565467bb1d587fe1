"""attacks.one_run: exact values, validity (coverage), power and edge cases of the one-run audits.

Simulated one-run audits: M canaries, each IN with probability ½. The ε-DP randomized-response
mechanism scores a canary by its membership bit flipped with probability 1/(1 + e^ε); the μ-GDP
mechanism scores it N(μ·bit, 1). Both are exactly what they claim for every canary, so a valid 95%
lower bound may exceed the true ε(δ) (or μ) in at most 5% of runs.
"""

import numpy as np
import pytest
import scipy.optimize
import scipy.special
import scipy.stats

from accountants.validation import InvalidArgument
from attacks import one_run
from attacks.epsilon import gaussian_dp_epsilon

DELTA = 1e-5
CANARIES = 1000


def _randomized_response(epsilon, canaries, seed):
    rng = np.random.default_rng([seed, canaries, int(epsilon * 1000), 1])
    membership = rng.random(canaries) < 0.5
    flipped = rng.random(canaries) < 1.0 / (1.0 + np.exp(epsilon))
    return (membership ^ flipped).astype(float), membership


def _gaussian(mu, canaries, seed):
    rng = np.random.default_rng([seed, canaries, int(mu * 1000), 2])
    membership = rng.random(canaries) < 0.5
    return rng.normal(mu * membership, 1.0), membership


def _randomized_response_epsilon(epsilon, delta):
    """ε(δ) of ε-DP randomized response: ln((q - δ)/(1 - q)), q = e^ε/(1 + e^ε)."""
    accuracy = scipy.special.expit(epsilon)
    return np.log((accuracy - delta) / (1.0 - accuracy))


def _binomial_tail(count, runs, rate=0.05):
    """P(X ≥ count) for X ∼ Bin(runs, rate): how surprising `count` failures are at that rate."""
    return scipy.stats.binom.sf(count - 1, runs, rate)


def _separable(canaries):
    """Scores that put every IN canary above every OUT one."""
    membership = np.arange(canaries) % 2 == 0
    return membership.astype(float), membership


# (a) Known values.


@pytest.mark.parametrize("guesses", [10, 100, 1000])
def test_all_correct_with_delta_zero_gives_logit_of_beta_root(guesses):
    # p(ε) = q^r when v = r and δ = 0, so the bound is logit(β^{1/r}).
    scores, membership = _separable(1000)
    bound = one_run.one_run_epsilon(scores, membership, 0.0, 0.95, guesses=(guesses // 2, guesses // 2))
    assert (bound.guess_count, bound.correct_guesses) == (guesses, guesses)
    assert bound.epsilon == pytest.approx(scipy.special.logit(0.05 ** (1 / guesses)), rel=1e-9)


def test_all_correct_bound_grows_with_the_number_of_guesses():
    scores, membership = _separable(2000)
    for method in (one_run.one_run_epsilon, one_run.one_run_fdp_epsilon):
        bounds = [method(scores, membership, DELTA, guesses=(r // 2, r // 2)).epsilon for r in (20, 200, 2000)]
        assert 0.0 < bounds[0] < bounds[1] < bounds[2], (method.__name__, bounds)


@pytest.mark.parametrize("method", [one_run.one_run_epsilon, one_run.one_run_fdp_epsilon])
def test_half_correct_gives_zero(method):
    membership = np.arange(400) % 2 == 0
    scores = np.arange(400.0)  # the top 100 hold 50 IN, the bottom 100 hold 50 OUT
    bound = method(scores, membership, DELTA, guesses=(100, 100))
    assert (bound.guess_count, bound.correct_guesses) == (200, 100)
    assert bound.epsilon == 0.0


def test_steinke_bound_is_largest_epsilon_with_p_value_at_most_beta():
    canaries, guesses, correct, delta, beta = 1000, 300, 260, DELTA, 0.05
    scores = np.arange(float(canaries))
    membership = np.zeros(canaries, dtype=bool)
    membership[-150:] = True  # the 150 highest scores: 130 IN, 20 OUT
    membership[-20:] = False
    membership[:20] = True  # the 150 lowest: 130 OUT, 20 IN
    bound = one_run.one_run_epsilon(scores, membership, delta, 1 - beta, guesses=(150, 150))
    assert bound.correct_guesses == correct

    def p_value(eps):  # Steinke et al. Thm. 3.1 written out term by term
        q = np.exp(eps) / (1 + np.exp(eps))
        tail = scipy.stats.binom.sf(correct - 1, guesses, q)
        slack = max((scipy.stats.binom.sf(correct - i - 1, guesses, q) - tail) / i for i in range(1, correct + 1))
        return tail + 2 * canaries * delta * slack

    assert p_value(bound.epsilon) == pytest.approx(beta, rel=1e-6)
    assert p_value(bound.epsilon * 0.999) < beta < p_value(bound.epsilon * 1.001)
    assert bound.epsilon == pytest.approx(1.5841, abs=1e-4)


@pytest.mark.parametrize(
    "canaries, guesses, correct, delta",
    [(1000, 1000, 700, 1e-5), (1000, 100, 95, 5e-4), (50, 50, 40, 1e-2), (10_000, 200, 200, 5e-5), (20, 8, 6, 0.0)],
)
def test_steinke_p_value_is_non_decreasing_in_epsilon(canaries, guesses, correct, delta):
    # The monotonicity the bisection relies on (module docstring: dp/dq ≥ r·b·(1 - 2Mδ) ≥ 0);
    # the cases include 2Mδ = 1 exactly.
    p_values = [one_run._steinke_p_value(canaries, guesses, correct, eps, delta) for eps in np.linspace(0, 12, 2401)]
    assert np.all(np.diff(p_values) >= -1e-15)
    assert p_values[-1] > p_values[0]


def _tail_maximum_by_linear_program(mu, canaries, guesses, correct, tangents=400):
    """Max P[W ≥ v] under the constraints of Mahloujifar et al. Thm. 3.1 (tail sets), f̄ relaxed to tangents.

    Replacing the concave f̄_μ by the minimum of its tangents enlarges the feasible set, so this is
    an upper bound on the true maximum, and close to it with many tangents.
    """
    points = scipy.special.ndtr(np.linspace(-8, 8, tangents))
    values = scipy.special.ndtr(scipy.special.ndtri(points) + mu)
    slopes = np.exp(-0.5 * (scipy.special.ndtri(points) + mu) ** 2 + 0.5 * scipy.special.ndtri(points) ** 2)
    levels = np.arange(guesses + 1)
    rows, bounds = [], []
    for i in range(1, guesses + 1):
        correct_part = np.where(levels >= i, levels, 0.0) / canaries
        wrong_part = np.where(levels >= i - 1, guesses - levels, 0.0) / canaries
        for point, value, slope in zip(points, values, slopes):
            # correct_part·p ≤ value + slope·(wrong_part·p - point)
            rows.append(correct_part - slope * wrong_part)
            bounds.append(value - slope * point)
    objective = -(levels >= correct).astype(float)
    solution = scipy.optimize.linprog(
        objective, A_ub=np.array(rows), b_ub=np.array(bounds), A_eq=np.ones((1, guesses + 1)), b_eq=[1.0]
    )
    assert solution.status == 0
    return -solution.fun


@pytest.mark.parametrize(
    "mu, canaries, guesses, correct", [(1.0, 20, 20, 16), (2.0, 30, 30, 28), (0.5, 20, 20, 15), (1.0, 40, 12, 12)]
)
def test_gdp_recursion_finds_the_largest_tail_the_constraints_allow(mu, canaries, guesses, correct):
    # The recursion decides "P[W ≥ v] ≤ τ"; the τ where its answer flips must equal the maximum of
    # the convex program it solves (cross-checked with a linear program over a tangent relaxation).
    def rejects(tau):
        return one_run._gdp_rejects(mu, canaries, guesses, correct, tau)

    largest_tail = scipy.optimize.brentq(lambda tau: 0.5 - rejects(tau), 1e-9, 1.0, xtol=1e-12)
    relaxed = _tail_maximum_by_linear_program(mu, canaries, guesses, correct)
    assert largest_tail <= relaxed + 1e-9
    assert largest_tail == pytest.approx(relaxed, rel=2e-3)


def test_default_guess_grid():
    assert one_run.default_guess_grid(1000) == (
        (500, 500),
        (250, 250),
        (125, 125),
        (63, 62),
        (31, 31),
        (16, 15),
        (8, 7),
    )
    assert one_run.default_guess_grid(20) == ((10, 10), (5, 5))
    assert one_run.default_guess_grid(5) == ((3, 2),)


# (b) Coverage.


def test_steinke_bound_with_delta_zero_is_exact_for_randomized_response():
    # Guessing every canary from ε-DP randomized response gives W ∼ Binomial(M, q) exactly, so the
    # bound exceeds the true ε with probability exactly P[W ≥ v*], v* the smallest count it rejects ε at.
    epsilon, canaries, runs = 1.0, 400, 300
    threshold = next(
        v for v in range(canaries + 1) if one_run._steinke_p_value(canaries, canaries, v, epsilon, 0.0) <= 0.05
    )
    exceedance_rate = scipy.stats.binom.sf(threshold - 1, canaries, scipy.special.expit(epsilon))
    exceedances = 0
    for seed in range(runs):
        scores, membership = _randomized_response(epsilon, canaries, seed)
        # IN for every score 1, OUT for every score 0: the split depends on the scores only (not on the
        # membership), which the theorem allows; only the total r = M is fixed in advance.
        ones = int(scores.sum())
        bound = one_run.one_run_epsilon(scores, membership, 0.0, guesses=(ones, canaries - ones))
        assert bound.guess_count == canaries
        exceedances += bound.epsilon > epsilon
    assert 0.03 < exceedance_rate <= 0.05
    # Measured: 17 of 300 at the exact rate 0.0429 (12.9 expected).
    # Both tails of Bin(runs, exceedance_rate): neither too many (invalid) nor too few (not exact).
    assert scipy.stats.binom.sf(exceedances - 1, runs, exceedance_rate) > 1e-3, exceedances
    assert scipy.stats.binom.cdf(exceedances, runs, exceedance_rate) > 1e-3, exceedances


def test_one_run_bounds_exceed_the_true_epsilon_in_at_most_5_percent_of_runs():
    runs = exceedances = 0
    largest_fraction = 0.0
    for seed in range(40):
        for epsilon in (1.0, 4.0):
            bound = one_run.one_run_epsilon(*_randomized_response(epsilon, CANARIES, seed), DELTA)
            true_epsilon = _randomized_response_epsilon(epsilon, DELTA)
            runs += 1
            exceedances += bound.epsilon > true_epsilon
            largest_fraction = max(largest_fraction, bound.epsilon / true_epsilon)
        for mu in (1.0, 2.0):
            scores = _gaussian(mu, CANARIES, seed)
            steinke = one_run.one_run_epsilon(*scores, DELTA)
            fdp = one_run.one_run_fdp_epsilon(*scores, DELTA)
            runs += 2
            exceedances += (steinke.epsilon > gaussian_dp_epsilon(mu, DELTA)) + (fdp.mu_lower > mu)
            largest_fraction = max(largest_fraction, fdp.mu_lower / mu)
    # Measured: 0 of 240; the largest bound was 0.96 of the true ε (randomized response), 0.48 (Steinke,
    # Gaussian), 0.72 of the true μ (f-DP).
    assert runs == 240
    assert _binomial_tail(exceedances, runs) > 1e-3, exceedances
    assert largest_fraction < 1.0


# (c) Power.


def test_fdp_bound_is_well_above_steinke_for_gaussian_scores():
    scores = _gaussian(2.0, CANARIES, seed=0)
    steinke = one_run.one_run_epsilon(*scores, DELTA)
    fdp = one_run.one_run_fdp_epsilon(*scores, DELTA)
    true_epsilon = gaussian_dp_epsilon(2.0, DELTA)
    assert true_epsilon == pytest.approx(9.9973, abs=1e-4)
    # Measured over seeds 0-9: mean 3.01 (Steinke) vs 4.52 (f-DP), the f-DP bound 1.47-1.9 times higher
    # in every seed; at μ = 1: 1.62 vs 2.24; at μ = 4: 4.53 vs 7.66 (all correct at r = 500 in every seed).
    assert steinke.epsilon == pytest.approx(2.8476, abs=1e-4)
    assert fdp.epsilon == pytest.approx(4.2451, abs=1e-4)
    assert fdp.mu_lower == pytest.approx(0.9739, abs=1e-4)
    assert fdp.epsilon >= 1.4 * steinke.epsilon
    assert fdp.epsilon == pytest.approx(gaussian_dp_epsilon(fdp.mu_lower, DELTA), rel=1e-12)


# (d) Null.


@pytest.mark.parametrize("method", [one_run.one_run_epsilon, one_run.one_run_fdp_epsilon])
def test_scores_independent_of_membership_give_zero_in_at_least_95_percent_of_runs(method):
    runs, positives = 60, 0
    for seed in range(runs):
        rng = np.random.default_rng([seed, 3])
        positives += method(rng.normal(size=CANARIES), rng.random(CANARIES) < 0.5, DELTA).epsilon > 0.0
    # Measured: 2 of 60 for both methods (8 of 300 for one_run_epsilon, 2.7%): the seven grid points
    # are each tested at 0.05/7 and are correlated, so the rate stays below 5%.
    assert _binomial_tail(positives, runs) > 1e-3, positives


# (e) Edge cases and bad input.


@pytest.mark.parametrize("method", [one_run.one_run_epsilon, one_run.one_run_fdp_epsilon])
def test_equal_scores_give_zero_even_when_canaries_are_sorted_by_membership(method):
    # Ties are broken at random, not by position: sorting IN first cannot turn equal scores into correct guesses.
    membership = np.arange(1000) < 500
    bound = method(np.zeros(1000), membership, DELTA)
    assert bound.epsilon == 0.0
    assert bound.correct_guesses < 0.6 * bound.guess_count


def test_ties_are_broken_by_the_seed_only():
    scores, membership = _randomized_response(2.0, 500, seed=1)
    first = one_run.one_run_epsilon(scores, membership, DELTA, seed=7)
    assert one_run.one_run_epsilon(scores, membership, DELTA, seed=7) == first
    shuffle = np.random.default_rng(0).permutation(500)
    assert one_run.one_run_epsilon(scores[shuffle], membership[shuffle], DELTA, seed=7).grid == first.grid


@pytest.mark.parametrize("method", [one_run.one_run_epsilon, one_run.one_run_fdp_epsilon])
@pytest.mark.parametrize("canaries", [1, 2, 3])
def test_tiny_audits_give_zero(method, canaries):
    scores, membership = _separable(canaries)
    bound = method(scores, membership, 1e-3)
    assert bound.epsilon == 0.0
    assert bound.guess_count == canaries


@pytest.mark.parametrize("method", [one_run.one_run_epsilon, one_run.one_run_fdp_epsilon])
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"scores": []}, "scores is empty"),
        ({"scores": [0.0, np.nan, 1.0, 2.0]}, "scores contains 1 non-finite"),
        ({"membership": [True, False]}, "membership must have shape"),
        ({"membership": [0, 1, 2, 1]}, "membership must be boolean"),
        ({"delta": 1.0}, "delta"),
        ({"confidence": 1.0}, "confidence"),
        ({"guesses": (0, 0)}, "k_plus \\+ k_minus must be in"),
        ({"guesses": (3, 2)}, "k_plus \\+ k_minus must be in"),
        ({"guesses": (-1, 2)}, "k_plus"),
        ({"guesses": []}, "guesses must be None"),
        ({"guesses": [(1, 1), (1.5, 1)]}, "pairs"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_arguments_raise_invalid_argument_naming_the_problem(method, kwargs, message):
    arguments = {"scores": [0.0, 1.0, 2.0, 3.0], "membership": [False, False, True, True], "delta": 1e-3} | kwargs
    with pytest.raises(InvalidArgument, match=message):
        method(**arguments)


def test_steinke_refuses_delta_above_one_over_twice_the_canaries():
    scores, membership = _separable(1000)
    assert one_run.one_run_epsilon(scores, membership, 5e-4).epsilon > 0.0
    with pytest.raises(InvalidArgument, match="delta must be ≤ 1/\\(2M\\)"):
        one_run.one_run_epsilon(scores, membership, 6e-4)
    with pytest.raises(InvalidArgument, match="delta"):
        one_run.one_run_fdp_epsilon(scores, membership, 0.0)

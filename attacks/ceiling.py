"""The estimators' ceiling: the share of a claimed ε dpaudit's bounds certify at so many trials (docs/theory.md §3.5).

An audit can do no better than the most powerful test of a μ-GDP mechanism as leaky as its claim: scores N(μ, 1) IN
and N(0, 1) OUT, μ the one whose ε(δ) is the claimed ε, and one statistic (a campaign with K of them tests each at
1 - α/K, lower still). :func:`estimator_ceiling` simulates seeded audits of such scores and applies
:func:`attacks.epsilon.clopper_pearson_epsilon` and :func:`attacks.epsilon.gdp_epsilon` (95%, the default
`GridThresholds`) to each; the median share of ε each route certifies is its ceiling. A measured tightness near it is
limited by the trials, far below it by the attack. :func:`trials_for_ratio` inverts it: the trials the GDP route
needs for a target share.

The audits are vectorised: one sort of each audit's pooled scores gives every grid threshold's counts, and the bounds
are the estimators' own (:func:`attacks.epsilon.bounds_from_counts`), so each simulated audit's ε equals what
:func:`attacks.epsilon.gdp_epsilon` returns on its scores (tests/test_ceiling.py checks it). Audit ``k`` of
``seed`` draws its IN scores from ``numpy.random.default_rng([seed, k, 0])`` and its OUT scores from ``[seed, k, 1]``,
whatever the batch it is computed in.

Simulation error: the median of :data:`CEILING_SEEDS` audits has a standard error of about 0.011 at 500 + 500 trials
and 0.004 at 5000 + 5000 (μ = 1, :attr:`Ceiling.gdp_error`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import scipy.optimize

from attacks import epsilon as epsilon_lib

CEILING_SEEDS = 101  # simulated audits per ceiling: odd, so that the median is one audit's
_ORDER = (0.1587, 0.5, 0.8413)  # the quantiles at -1, 0 and +1 standard deviation of a normal
CONFIDENCE = 0.95  # of the simulated bounds, as dpaudit's campaigns report them
_BATCH_SCORES = 4_000_000  # scores sorted at once: bounds the memory (about 100 MB) at any trial count
MAX_TRIALS = 2**17  # per side: the largest audit trials_for_ratio simulates (about 10 s at CEILING_SEEDS)


@dataclasses.dataclass(frozen=True)
class Ceiling:
    """The median shares of the claimed ε the two routes certify, over :data:`CEILING_SEEDS` simulated audits.

    ``gdp_error``: the standard error of the GDP median (1.2533 · standard deviation / √audits).
    """

    clopper_pearson: float
    gdp: float
    gdp_error: float
    mu: float


@functools.cache  # nested root finding: each ceiling of a trials_for_ratio search needs the same μ
def gdp_mu(epsilon: float, delta: float) -> float:
    """The μ whose μ-GDP ε at ``delta`` is ``epsilon`` (the inverse of :func:`attacks.epsilon.gaussian_dp_epsilon`)."""
    return float(
        scipy.optimize.brentq(lambda mu: epsilon_lib.gaussian_dp_epsilon(mu, delta) - epsilon, 1e-9, 100.0, xtol=1e-12)
    )


@functools.cache
def estimator_ceiling(n_in: int, n_out: int, epsilon: float, delta: float, seed: int = 0) -> Ceiling:
    """The shares of ``epsilon`` dpaudit's estimators certify from ideal scores at these trial counts (module doc).

    Args:
        n_in: IN trials of each simulated audit.
        n_out: OUT trials.
        epsilon: the claimed ε at ``delta``; the scores are those of the μ-GDP mechanism with this ε.
        delta: the δ of the claim and of the bounds.
        seed: audit k draws from ``default_rng([seed, k, 0])`` (IN) and ``[seed, k, 1]`` (OUT).

    Raises:
        ValueError: counts below 1, ``epsilon`` not finite and > 0, or ``delta`` not in (0, 1).
    """
    if n_in < 1 or n_out < 1 or not (math.isfinite(epsilon) and epsilon > 0) or not 0 < delta < 1:
        raise ValueError(f"a ceiling needs trials >= 1, a finite ε > 0 and δ in (0, 1), got {n_in}, {n_out}, {epsilon}")
    mu = gdp_mu(epsilon, delta)
    batch = max(1, _BATCH_SCORES // (n_in + n_out))
    bounds = [
        simulated_bounds(mu, n_in, n_out, delta, seed, range(start, min(start + batch, CEILING_SEEDS)))
        for start in range(0, CEILING_SEEDS, batch)
    ]
    clopper_pearson = np.concatenate([cp for cp, _ in bounds]) / epsilon
    # ε(μ) increases with μ: the audits' order statistics of μ_lo give those of their GDP ε, so only three are solved.
    low, median, high = (
        epsilon_lib.epsilon_of("gaussian_dp", value, delta) / epsilon
        for value in np.quantile(np.concatenate([mus for _, mus in bounds]), _ORDER, method="closest_observation")
    )
    error = 1.2533 * (high - low) / 2 / math.sqrt(CEILING_SEEDS)
    return Ceiling(float(np.median(clopper_pearson)), median, error, mu)


def simulated_scores(mu: float, n_in: int, n_out: int, seed: int, audit: int) -> tuple[np.ndarray, np.ndarray]:
    """The IN scores N(μ, 1) and OUT scores N(0, 1) of simulated audit ``audit`` of ``seed``.

    Each class from its own stream, so that an audit with more trials extends one with fewer (the first n of its
    scores are the smaller audit's): the ceiling then changes smoothly with the trials, which :func:`trials_for_ratio`
    searches over.
    """
    return (
        np.random.default_rng([seed, audit, 0]).normal(mu, 1.0, n_in),
        np.random.default_rng([seed, audit, 1]).normal(0.0, 1.0, n_out),
    )


def simulated_bounds(mu, n_in, n_out, delta, seed, audits: range) -> tuple[np.ndarray, np.ndarray]:
    """The CP ε and the GDP μ_lo (unclipped) of each of ``audits`` (:func:`simulated_scores`), as the estimators'.

    With the default grid, the threshold just above the (j+1)-th largest OUT score has FP = j and TP = the IN scores
    above that OUT score; the one at the (j+1)-th smallest IN score has TP = n_in - j and FP = the OUT scores above
    it (continuous scores: no ties). One sort of the pooled scores gives both.
    """
    drawn = [simulated_scores(mu, n_in, n_out, seed, audit) for audit in audits]
    is_in = np.argsort(np.stack([np.concatenate(pair) for pair in drawn]), axis=1) < n_in  # ascending scores
    in_above = n_in - np.cumsum(is_in, axis=1)  # IN scores above each position
    out_above = n_out - np.cumsum(~is_in, axis=1)
    rows = np.arange(len(drawn))[:, None]
    out_positions = np.nonzero(~is_in)[1].reshape(len(drawn), n_out)  # the OUT scores' positions, ascending
    in_positions = np.nonzero(is_in)[1].reshape(len(drawn), n_in)
    false_positive_grid, false_negative_grid, alpha_per_bound = epsilon_lib.grid_counts(
        epsilon_lib.GridThresholds(), n_in, n_out, 1.0 - CONFIDENCE
    )
    true_positives = np.concatenate(
        [
            in_above[rows, out_positions[:, n_out - 1 - false_positive_grid]],
            np.broadcast_to(n_in - false_negative_grid, (len(drawn), false_negative_grid.size)),
        ],
        axis=1,
    )
    false_positives = np.concatenate(
        [
            np.broadcast_to(false_positive_grid, (len(drawn), false_positive_grid.size)),
            out_above[rows, in_positions[:, false_negative_grid]],
        ],
        axis=1,
    )
    counts = (true_positives, false_positives, n_in, n_out, alpha_per_bound, delta)
    clopper_pearson = epsilon_lib.bounds_from_counts("clopper_pearson", *counts).objective.max(axis=1)
    mus = epsilon_lib.bounds_from_counts("gaussian_dp", *counts).objective.max(axis=1)
    return np.maximum(clopper_pearson, 0.0), mus


def trials_for_ratio(ratio: float, epsilon: float, delta: float) -> int | None:
    """The fewest trials n (n IN + n OUT) at which the median simulated GDP bound certifies ``ratio`` · ``epsilon``.

    Doubling n up to :data:`MAX_TRIALS`, then bisection to 1%: the median grows with n, and smoothly, since an audit
    with more trials extends one with fewer (:func:`simulated_scores`); its simulation error (:attr:`Ceiling.gdp_error`)
    makes the count good to a few percent where the ratio climbs slowly. None where :data:`MAX_TRIALS` falls short.

    Raises:
        ValueError: ``ratio`` not in (0, 1), or ``epsilon`` / ``delta`` as :func:`estimator_ceiling`.
    """
    if not 0 < ratio < 1:
        raise ValueError(f"a ratio of the claimed ε must lie in (0, 1), got {ratio}")

    def reaches(trials: int) -> bool:
        return estimator_ceiling(trials, trials, epsilon, delta).gdp >= ratio

    low, high = 0, 1  # not reaches(low) (no trials certify nothing), reaches(high) once the doubling stops
    while not reaches(high):
        if high == MAX_TRIALS:
            return None
        low, high = high, min(2 * high, MAX_TRIALS)
    while high > 1.01 * low + 1:
        middle = max(low + 1, int(math.sqrt(low * high)))
        if reaches(middle):
            high = middle
        else:
            low = middle
    return high

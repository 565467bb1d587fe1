"""Monte-Carlo privacy profiles with finite-sample confidence bands.

A profile is estimated as a sample mean ``delta(eps) ~ (1/N) sum_i g_i(eps)`` of [0, 1]-valued,
non-increasing functions g_i (one per draw of the mechanism's randomness). Confidence bands use the
empirical Bernstein inequality (Maurer & Pontil 2009, Thm 4): with probability >= 1 - eta,
``E g <= mean + sqrt(2 V ln(2/eta) / N) + 7 ln(2/eta) / (3 (N - 1))``, V the unbiased sample variance;
the same holds for the lower side. A two-sided band at ``confidence`` uses eta = (1 - confidence)/2
per side. It is valid for every N, not only asymptotically.

An epsilon for a given delta is read off the bands by test inversion: on the event that the band
covers the true profile at the true epsilon*, ``eps_lo <= eps* <= eps_hi`` with
``eps_lo = inf{eps : lower(eps) <= delta}`` and ``eps_hi = sup{eps : upper(eps) >= delta}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.optimize import brentq

Bands = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]


def bernstein_bands(
    first_moment: np.ndarray, second_moment: np.ndarray, n: int, confidence: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimate, lower, upper) of a mean of n [0, 1]-valued draws from their first two sample moments."""
    log_term = math.log(4 / (1 - confidence))
    variance = np.maximum(second_moment - first_moment**2, 0.0) * n / (n - 1)
    margin = np.sqrt(2 * variance * log_term / n) + 7 * log_term / (3 * (n - 1))
    return first_moment, np.clip(first_moment - margin, 0, 1), np.clip(first_moment + margin, 0, 1)


def _first_at_or_below(curve: Callable[[float], float], values: np.ndarray, grid: np.ndarray, level: float) -> float:
    """inf{eps : curve(eps) <= level}, located on the grid then refined inside its segment."""
    below = np.flatnonzero(values <= level)
    if below.size == 0:
        return math.inf
    i = below[0]
    if i == 0:
        return float(grid[0])
    return brentq(lambda e: curve(e) - level, grid[i - 1], grid[i], xtol=1e-12, rtol=1e-10)


def _last_at_or_above(curve: Callable[[float], float], values: np.ndarray, grid: np.ndarray, level: float) -> float:
    """sup{eps : curve(eps) >= level}, located on the grid then refined inside its segment."""
    above = np.flatnonzero(values >= level)
    if above.size == 0:
        return float(grid[0])
    i = above[-1]
    if i == grid.size - 1:
        return math.inf
    return brentq(lambda e: curve(e) - level, grid[i], grid[i + 1], xtol=1e-12, rtol=1e-10)


def invert(bands: Bands, delta: float, grid: np.ndarray) -> tuple[float, float, float]:
    """(eps_estimate, eps_lo, eps_hi) for ``delta`` from bands evaluated on an increasing grid.

    The grid must start at the smallest epsilon of interest and extend past every crossing that
    exists (the estimate and both bands are constant beyond its last point).
    """
    estimate, lower, upper = bands(grid)

    def component(k: int) -> Callable[[float], float]:
        return lambda e: float(bands(np.array([e]))[k][0])

    return (
        _first_at_or_below(component(0), estimate, grid, delta),
        _first_at_or_below(component(1), lower, grid, delta),
        _last_at_or_above(component(2), upper, grid, delta),
    )


class SortedLosses:
    """Profile of a mechanism from N sampled privacy losses (Monte Carlo, docs/theory.md §2.4).

    Each draw i contributes ``g_i(eps) = 1`` if the output falls outside the other law's support
    (an "atom": infinite loss) and ``(1 - e^{eps - L_i})_+`` otherwise, so that
    ``delta(eps) = P(atom) + E[(1 - e^{eps - L})_+ ; no atom]``. Sorting the losses and keeping
    log-cumulative sums of ``e^{-L}`` and ``e^{-2L}`` makes delta, its variance and its bands exact
    piecewise closed forms, evaluated in O(log N) per epsilon.
    """

    def __init__(self, losses: np.ndarray, atoms: int, confidence: float):
        self.n = losses.size + atoms
        self.atoms = atoms
        self.confidence = confidence
        self.losses = np.sort(losses)[::-1]  # descending: a suffix {L > eps} is a prefix here
        self._log_sum1 = np.logaddexp.accumulate(-self.losses)
        self._log_sum2 = np.logaddexp.accumulate(-2 * self.losses)

    def _prefix(self, epsilon: np.ndarray):
        """How many losses exceed eps, with log sum e^{-L} and log sum e^{-2L} over them."""
        count = np.searchsorted(-self.losses, -epsilon, side="left")
        index = np.maximum(count - 1, 0)
        empty = count == 0
        log1 = np.where(empty, -np.inf, self._log_sum1[index])
        log2 = np.where(empty, -np.inf, self._log_sum2[index])
        return count, log1, log2

    def bands(self, epsilon: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        epsilon = np.asarray(epsilon, float)
        count, log1, log2 = self._prefix(epsilon)
        # sum over L_i > eps of (1 - e^{eps - L_i}) and of its square; e^{eps - L_i} <= 1 there.
        total1 = count - np.exp(epsilon + log1)
        # eps + (eps + log2), not 2 eps + log2: where no loss exceeds eps (log2 = -inf), 2 eps overflows to inf for
        # eps > 9e307 and inf - inf is NaN; added one at a time, the sum stays -inf
        total2 = count - 2 * np.exp(epsilon + log1) + np.exp(epsilon + (epsilon + log2))
        first = (self.atoms + np.maximum(total1, 0)) / self.n
        second = (self.atoms + np.maximum(total2, 0)) / self.n
        return bernstein_bands(first, second, self.n, self.confidence)

    def grid(self) -> np.ndarray:
        """Knots where the piecewise formulas change: 0 and every positive loss, increasing."""
        positive = self.losses[self.losses > 0][::-1]
        return np.concatenate([[0.0], positive, [positive[-1] + 1.0 if positive.size else 1.0]])


class SampledMixture:
    """Profile ``delta(eps) = E_i[delta_Gauss(eps; mu_i)]`` from N sampled Gaussian parameters mu_i."""

    def __init__(self, mus: np.ndarray, delta_for_mu, confidence: float):
        self.mus = np.asarray(mus, float)
        self.n = self.mus.size
        self.confidence = confidence
        self._delta_for_mu = delta_for_mu

    def bands(self, epsilon: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        values = self._delta_for_mu(np.asarray(epsilon, float)[:, None], self.mus[None, :])
        return bernstein_bands(values.mean(axis=1), (values**2).mean(axis=1), self.n, self.confidence)

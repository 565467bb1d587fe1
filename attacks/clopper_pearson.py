"""Exact (Clopper-Pearson) confidence bounds for a binomial proportion.

The one place where ``attacks`` turns counts into confidence bounds: `metrics` uses the
two-sided interval for TPR at a fixed FPR, `epsilon` the one-sided bounds on TPR and FPR.

Clopper & Pearson (1934): for k successes in n trials, the one-sided lower and upper
bounds at level 1 - α are the Beta quantiles

    p_lo = B⁻¹(α; k, n - k + 1)        (0 when k = 0),
    p_hi = B⁻¹(1 - α; k + 1, n - k)    (1 when k = n).

They are exact (coverage ≥ 1 - α for every p), which is what an audit needs: an ε lower bound
built from them fails with probability at most the α it was given.
"""

from __future__ import annotations

import numpy as np
import scipy.stats

from accountants import validation as check
from accountants.validation import InvalidArgument


def _check_counts(successes, trials) -> tuple[np.ndarray, np.ndarray]:
    successes = np.asarray(successes)
    trials = np.asarray(trials)
    for name, counts in (("successes", successes), ("trials", trials)):
        if not np.issubdtype(counts.dtype, np.integer):
            raise InvalidArgument(f"{name} must be integer counts; got dtype {counts.dtype}.")
    if np.any(trials < 1):
        raise InvalidArgument(f"trials must be at least 1; got {trials.min()}.")
    if np.any(successes < 0) or np.any(successes > trials):
        raise InvalidArgument("successes must lie in [0, trials] for every entry.")
    return successes, trials


def clopper_pearson_lower(successes, trials, alpha: float) -> np.ndarray:
    """One-sided lower bound p_lo with P(p < p_lo) ≤ `alpha`, elementwise over the counts.

    Args:
      successes: Number of successes k (integer, array-like), 0 ≤ k ≤ n.
      trials: Number of trials n ≥ 1 (integer, broadcastable against `successes`).
      alpha: Allowed failure probability of this one bound, in (0, 1).

    Returns:
      float64 array of lower bounds (0 where k = 0).
    """
    successes, trials = _check_counts(successes, trials)
    alpha = check.open_unit("alpha", alpha)
    # beta.ppf needs a > 0; the k = 0 entries get their bound, 0, from np.where.
    safe_successes = np.maximum(successes, 1)
    bound = scipy.stats.beta.ppf(alpha, safe_successes, trials - successes + 1)
    return np.where(successes == 0, 0.0, bound)


def clopper_pearson_upper(successes, trials, alpha: float) -> np.ndarray:
    """One-sided upper bound p_hi with P(p > p_hi) ≤ `alpha`, elementwise over the counts.

    Args:
      successes: Number of successes k (integer, array-like), 0 ≤ k ≤ n.
      trials: Number of trials n ≥ 1 (integer, broadcastable against `successes`).
      alpha: Allowed failure probability of this one bound, in (0, 1).

    Returns:
      float64 array of upper bounds (1 where k = n).
    """
    successes, trials = _check_counts(successes, trials)
    alpha = check.open_unit("alpha", alpha)
    # beta.isf(α) is the 1 - α quantile computed without the cancellation of 1 - ppf for tiny
    # bounds (k = 0, large n), where ε = ln(TPR_lo / FPR_hi) needs FPR_hi to full precision.
    safe_failures = np.maximum(trials - successes, 1)
    bound = scipy.stats.beta.isf(alpha, successes + 1, safe_failures)
    return np.where(successes == trials, 1.0, bound)


def clopper_pearson_interval(successes, trials, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided interval with coverage ≥ `confidence` (α/2 in each tail).

    Returns:
      (lower, upper) float64 arrays.
    """
    confidence = check.open_unit("confidence", confidence)
    tail = (1.0 - confidence) / 2.0
    return (
        clopper_pearson_lower(successes, trials, tail),
        clopper_pearson_upper(successes, trials, tail),
    )

"""Membership scores of white-box gradient-canary audits (Nasr et al. 2023, arXiv 2302.07956; docs/theory.md §3.9).

A gradient canary is a crafted gradient of norm ‖g_c‖ along a unit direction u of the trained parameters, added
(clipped like any example) whenever it is sampled into a batch. The auditor sees either

- the final weights: ``w = ⟨θ_T - θ_0, u⟩``. Gradient descent moves θ against the canary, so the score is ``-w``
  (higher = member): `weight_change_scores`;
- every update: ``x_t = ⟨g̃_t, u⟩``, the projection of step t's released noisy mean gradient. For DP-SGD with
  Poisson rate q, clip norm C, noise multiplier σ and expected batch size b, given the real examples'
  contribution a_t along u,

      OUT:  x_t ~ N(a_t, τ²),      IN:  x_t ~ (1 - q) N(a_t, τ²) + q N(a_t + s, τ²),

  with s = min(‖g_c‖, C) / b the canary's clipped contribution along u and τ = σC/b. The per-step log
  likelihood ratio of IN to OUT is ``log(1 - q + q exp((s (x_t - a_t) - s²/2) / τ²))``; given the a_t the
  steps' noises are independent, so the log-LR of the whole transcript is the sum over steps
  (`step_likelihood_ratio_scores`). By the Neyman-Pearson lemma it is the most powerful test of these two
  hypotheses, which is what makes the audit nearly tight (for q = 1 it is, up to an increasing affine map, the
  sum of the projections, and the IN/OUT sums are exactly N(±, Tτ²): the Gaussian mechanism's tradeoff).

The approximation a_t ≈ 0 (`offsets` default): for a Dirac canary on a coordinate real gradients do not reach
(an input pixel that is 0 in every example) a_t is exactly 0. It breaks when real gradients reach the
coordinate: a_t then adds data-dependent variance (and, if IN and OUT trajectories differ, a shift) that the
statistic treats as noise, so the test loses power. The bound stays valid either way, since any score gives a
valid ε lower bound; only its tightness is at stake. Mechanisms other than DP-SGD (projections, PRISM's lift)
change both the shift and the noise along u; `step_sum_scores`, the q = 1 statistic, needs no model of them.
An update rule that moves along a bias-corrected moving average of its releases (PRISM's adaptive rule) repeats
each release in every later step: `momentum_step_scores` undoes the average before summing.
"""

from __future__ import annotations

import numpy as np

from accountants import validation as check
from accountants.validation import InvalidArgument


def _observations(name: str, values) -> np.ndarray:
    """(models, steps, canaries) finite float64."""
    array = check.finite_array(name, values, ndim=3)
    if 0 in array.shape:
        raise InvalidArgument(f"{name} must be a non-empty (models, steps, canaries) array; got shape {array.shape}.")
    return array


def weight_change_scores(projections) -> np.ndarray:
    """(models, canaries) scores ``-⟨θ_T - θ_0, u⟩`` from (models, 1, canaries) total-change projections."""
    projections = _observations("projections", projections)
    if projections.shape[1] != 1:
        raise InvalidArgument(f"projections must hold one total change per model; got {projections.shape[1]}.")
    return -projections[:, 0, :]


def step_sum_scores(projections) -> np.ndarray:
    """(models, canaries) scores ``Σ_t x_t`` from (models, steps, canaries) per-step projections."""
    return _observations("projections", projections).sum(axis=1)


def momentum_step_scores(projections, beta: float) -> np.ndarray:
    """(models, canaries) ``Σ_t y_t``: each step's fresh release, from steps that are a bias-corrected moving average.

    An update rule that moves along Adam's first moment (PRISM's adaptive rule, docs/theory.md §3.9) releases
    ``x_t = m_t / c_t`` with ``m_t = β m_(t-1) + (1 - β) g_t``, ``m_0 = 0``, ``c_t = 1 - β^t``: every step repeats
    the earlier releases g_t, so the plain sum weighs the first steps most and correlates the noise. Undoing the
    average, ``y_t = c_t x_t - β c_(t-1) x_(t-1) = (1 - β) g_t``, gives back independent steps; their sum is
    ``c_T x_T + (1 - β) Σ_(t<T) c_t x_t``. The preconditioner's own per-step scale is taken as constant.
    """
    projections = _observations("projections", projections)
    beta = check.real_in("beta", beta, 0.0, 1.0, high_open=True)
    corrections = 1.0 - beta ** np.arange(1, projections.shape[1] + 1)
    weights = (1.0 - beta) * corrections
    weights[-1] = corrections[-1]
    return np.einsum("kti,t->ki", projections, weights)


def step_likelihood_ratio_scores(projections, sample_rate: float, shift: float, noise_std: float, offsets=0.0):
    """(models, canaries) log-likelihood ratios ``Σ_t log(1 - q + q exp((s (x_t - a_t) - s²/2) / τ²))``.

    Args:
      projections: (models, steps, canaries) per-step projections x_t of the released updates on u.
      sample_rate: q in (0, 1], the canary's chance to be in a step's batch.
      shift: s > 0, the canary's clipped contribution along u to a released update.
      noise_std: τ > 0, the noise std of a released update along u.
      offsets: a_t, the real examples' contribution along u; a scalar or broadcastable to `projections`.

    Returns:
      Higher = more likely IN. Computed as ``logaddexp(log(1 - q), log q + z)``, finite for every finite x_t.
    """
    projections, offsets = _observations_and_offsets(projections, offsets)
    q = check.real_in("sample_rate", sample_rate, 0.0, 1.0, low_open=True)
    s = check.positive("shift", shift)
    tau = check.positive("noise_std", noise_std)
    z = (s * (projections - offsets) - s * s / 2.0) / (tau * tau)
    with np.errstate(divide="ignore"):  # log(1 - q) = -inf at q = 1: logaddexp then returns z
        per_step = np.logaddexp(np.log1p(-q), np.log(q) + z)
    return per_step.sum(axis=1)


def nearest_step_scores(projections, shift: float, offsets=0.0) -> np.ndarray:
    """(models, canaries) scores ``-min_t |x_t - a_t - s|``: how close the closest step comes to the canary's shift.

    Under the claimed mechanism every step carries noise of std τ, so no step lands exactly on s; a step released
    without noise does (IN, canary sampled) or sits at 0 (OUT), which this score separates however many noisy steps
    surround it: the summed likelihood ratio dilutes one noiseless step among T (docs/theory.md §3.9).
    """
    projections, offsets = _observations_and_offsets(projections, offsets)
    s = check.positive("shift", shift)
    return -np.abs(projections - offsets - s).min(axis=1)


def step_spread_scores(projections, offsets=0.0) -> np.ndarray:
    """(models, canaries) scores: the standard deviation over steps of ``x_t - a_t``, higher = more likely IN.

    Under the claimed mechanism the steps' noises are independent, so the spread is about τ whether or not the
    canary is in. Noise drawn once and reused at every step cancels in it: an OUT run's steps are then identical
    (spread 0), and an IN run's differ only by the canary's shift on the steps that sampled it.
    """
    projections, offsets = _observations_and_offsets(projections, offsets)
    return (projections - offsets).std(axis=1)


def _observations_and_offsets(projections, offsets) -> tuple[np.ndarray, np.ndarray]:
    """(models, steps, canaries) projections and the offsets a_t broadcast to their shape, both finite."""
    projections = _observations("projections", projections)
    try:
        offsets = np.broadcast_to(offsets, projections.shape)
    except ValueError:
        raise InvalidArgument(f"offsets must broadcast to the projections' shape {projections.shape}.") from None
    return projections, check.finite_array("offsets", offsets, ndim=3)

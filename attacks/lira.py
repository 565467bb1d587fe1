"""Likelihood-ratio attack, LiRA (Carlini et al. 2022, Alg. 1, and its offline and fixed-variance variants).

Carlini et al. 2022: "Membership inference attacks from first principles".

Input: the logit-scaled confidences φ[m, j] of every model m on every example j
(`scores.logit_scaled_confidence`) and the membership matrix (True = j in m's training set),
e.g. from `designs.all_examples_design`. Every model is a target in turn, with leave-one-out:
the statistics that score model m are fitted on all *other* models, so model m's own output never
calibrates its own score.

For target model m and example j, with the other models split into IN (j trained on) and OUT:

- online (Alg. 1): fit N(μ_in, σ_in²) and N(μ_out, σ_out²) to the IN and OUT φ and score the
  log-likelihood ratio  log N(φ[m, j]; μ_in, σ_in²) - log N(φ[m, j]; μ_out, σ_out²);
- offline (one-sided): fit only N(μ_out, σ_out²) and score z = (φ[m, j] - μ_out)/σ_out.
  The paper's statistic is Λ = Pr[Z < φ], Z ∼ N(μ_out, σ_out²), i.e. Φ(z); z is a strictly
  increasing function of it (same ROC), but does not round to 1 at large z, which would tie
  the most confident members;
- fixed variance (for few shadow models): one global variance instead of
  per-example ones: the per-example residuals of the other models are pooled over all examples
  (IN and OUT together online, OUT only offline). Per-example means are kept.

Means and variances are the sample mean and unbiased sample variance (the reference code uses
medians; means make the leave-one-out update exact and O(1) per entry). Everything is
vectorised over models × examples: sums over all models minus the target's own term.

Balanced leave-one-out (online). Leaving the target out of its own group alone fits that group on
one model fewer than the other, and a Gaussian fitted on fewer samples gives a fresh sample a lower
expected log-density (its mean and variance are noisier). The online ratio then leans towards
whichever group the target is *not* in: on data with no membership signal at all, 8 shadow models
gave AUC 0.34 instead of 0.5. So the group the target is not in is fitted on one model fewer too: it
leaves out its first member after the target in cyclic model order, a choice made from the membership
alone. Both groups are then (n - 1)-model fits independent of the target, so without signal an IN and
an OUT target's scores have the same distribution (mirrored). Averaging the other group's log-density
over every left-out model instead is not enough: it matches the mean but not the skewed shape, and
gave AUC 0.523. Offline LiRA is unaffected (its z-score is symmetric about 0 whatever the fit size).
"""

from __future__ import annotations

import numbers

import numpy as np

from accountants import validation as check
from accountants.validation import InvalidArgument


def _inputs(confidences, membership) -> tuple[np.ndarray, np.ndarray]:
    confidences = check.finite_array("confidences", confidences, ndim=2)
    membership = check.membership("membership", membership, shape=confidences.shape)
    # Centre each example on its mean over models so the sums of squares below do not cancel.
    centred = confidences - confidences.mean(axis=0, keepdims=True)
    return centred, membership


def _check_min_std(min_std) -> float:
    if isinstance(min_std, bool) or not isinstance(min_std, numbers.Real) or not float(min_std) > 0.0:
        raise InvalidArgument(f"min_std must be > 0; got {min_std!r}.")
    return float(min_std)


def _leave_one_out_moments(values: np.ndarray, in_group: np.ndarray, group: str, minimum: int):
    """Leave-one-out moments of one group of models (IN or OUT).

    For each target model m and example j: the count, mean and sum of squared deviations of
    values[k, j] over the models k ≠ m with in_group[k, j].

    Returns:
      (count, mean, squared_deviations), each (models, examples).
    """
    own = in_group.astype(np.float64)
    count = in_group.sum(axis=0, keepdims=True) - own
    if count.min() < minimum:
        example = int(np.argmin(count.min(axis=0)))
        hint = " or use fixed_variance=True (needs 1)" if minimum > 1 else ""
        raise InvalidArgument(
            f"LiRA needs at least {minimum} {group} model(s) besides the target for every "
            f"example (leave-one-out); example {example} has {int(count[:, example].min())} "
            f"for some target. Train more shadow models{hint}."
        )
    total = (values * in_group).sum(axis=0, keepdims=True) - own * values
    total_squares = (values**2 * in_group).sum(axis=0, keepdims=True) - own * values**2
    mean = total / count
    squared_deviations = np.maximum(total_squares - count * mean**2, 0.0)
    return count, mean, squared_deviations


def _balanced_moments(values: np.ndarray, in_group: np.ndarray, own_moments):
    """Leave-one-out moments of one group as each target sees it (module docstring, "Balanced leave-one-out").

    A target in the group: the group without the target (``own_moments``, from `_leave_one_out_moments`). A target
    outside it: the group without one of its models, the first member after the target in cyclic model order, a
    choice that depends on the membership only, never on the values; so both groups are fitted on one model fewer.

    Returns:
      (count, mean, squared_deviations), each (models, examples).
    """
    count, mean, deviations = (array.copy() for array in own_moments)
    for j in range(values.shape[1]):
        members = np.flatnonzero(in_group[:, j])
        outside = np.flatnonzero(~in_group[:, j])
        if outside.size == 0:
            continue
        left_out = members[np.searchsorted(members, outside, side="right") % members.size]
        size = members.size - 1
        rest_total = values[members, j].sum() - values[left_out, j]
        rest_squares = (values[members, j] ** 2).sum() - values[left_out, j] ** 2
        count[outside, j] = size
        mean[outside, j] = rest_total / size
        deviations[outside, j] = np.maximum(rest_squares - size * mean[outside, j] ** 2, 0.0)
    return count, mean, deviations


def _variance(squared_deviations, degrees_of_freedom, fixed_variance: bool, min_std: float):
    """Unbiased variance per (model, example), or pooled over examples per target model."""
    if fixed_variance:
        # One variance per target model, because each target has its own leave-one-out set.
        squared_deviations = squared_deviations.sum(axis=1, keepdims=True)
        degrees_of_freedom = degrees_of_freedom.sum(axis=1, keepdims=True)
    if degrees_of_freedom.min() < 1:
        raise InvalidArgument(
            "too few shadow models to estimate a variance with leave-one-out (some target has no "
            "degree of freedom left); train more shadow models."
        )
    return np.maximum(squared_deviations / degrees_of_freedom, min_std**2)


def _log_normal_pdf(x, mean, variance):
    return -0.5 * (np.log(2.0 * np.pi * variance) + (x - mean) ** 2 / variance)


def lira_online_scores(confidences, membership, *, fixed_variance: bool = False, min_std: float = 1e-8) -> np.ndarray:
    """Online LiRA: log N(φ; μ_in, σ_in²) - log N(φ; μ_out, σ_out²), leave-one-out per target model.

    Args:
      confidences: (models, examples) logit-scaled confidences φ.
      membership: (models, examples) bool, True = example in that model's training set.
      fixed_variance: use one pooled variance (IN and OUT residuals over all examples) instead of
        per-example σ_in², σ_out².
      min_std: floor on every standard deviation, so that an example whose shadow outputs all
        coincide gets a finite score.

    Returns:
      (models, examples) scores, higher = more likely a member.

    Raises:
      ValueError: some example has fewer than 2 other IN or OUT models (1 with fixed_variance).
    """
    centred, membership = _inputs(confidences, membership)
    min_std = _check_min_std(min_std)
    minimum = 1 if fixed_variance else 2
    # A group whose members each have `minimum` others has `minimum` + 1 models: enough to leave one out for the
    # targets outside it too.
    moments_in = _leave_one_out_moments(centred, membership, "IN", minimum)
    moments_out = _leave_one_out_moments(centred, ~membership, "OUT", minimum)
    count_in, mean_in, deviations_in = _balanced_moments(centred, membership, moments_in)
    count_out, mean_out, deviations_out = _balanced_moments(centred, ~membership, moments_out)
    if fixed_variance:
        # Pooled over every other model, as before: shared by both terms, and symmetric in the two groups' roles.
        (count_in, _, deviations_in), (count_out, _, deviations_out) = moments_in, moments_out
        variance_in = variance_out = _variance(
            deviations_in + deviations_out, (count_in - 1.0) + (count_out - 1.0), True, min_std
        )
    else:
        variance_in = _variance(deviations_in, count_in - 1.0, False, min_std)
        variance_out = _variance(deviations_out, count_out - 1.0, False, min_std)
    return _log_normal_pdf(centred, mean_in, variance_in) - _log_normal_pdf(centred, mean_out, variance_out)


def lira_offline_scores(confidences, membership, *, fixed_variance: bool = False, min_std: float = 1e-8) -> np.ndarray:
    """Offline (one-sided) LiRA: z = (φ - μ_out)/σ_out from the other models' OUT outputs only.

    Args: as `lira_online_scores`; only OUT models are used, so the design needs ≥ 2 other OUT
      models per example (1 with fixed_variance, whose variance pools OUT residuals).

    Returns:
      (models, examples) scores, higher = more likely a member.
    """
    centred, membership = _inputs(confidences, membership)
    min_std = _check_min_std(min_std)
    count_out, mean_out, deviations_out = _leave_one_out_moments(
        centred, ~membership, "OUT", 1 if fixed_variance else 2
    )
    variance_out = _variance(deviations_out, count_out - 1.0, fixed_variance, min_std)
    return (centred - mean_out) / np.sqrt(variance_out)

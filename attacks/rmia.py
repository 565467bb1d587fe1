"""Robust membership inference attack, RMIA: the pairwise likelihood-ratio test and its offline approximation.

Zarifzadeh et al. 2024, "Low-cost high-power membership inference attacks".

Inputs (all per model, as log-probabilities of the true label, log p(y | x; θ) =
-cross-entropy, from `scores.true_label_log_probability`):

- `target_log_probabilities`: (models, examples), every model on every target example;
- `membership`: (models, examples) bool, True = example in that model's training set;
- `population_log_probabilities`: (models, population), every model on population points z
  drawn from the data distribution and in no model's training set.

Every model is a target in turn and all *other* models are its reference models. For target θ,

    LR_θ(x, z) = [p(x | θ) / p(x)] / [p(z | θ) / p(z)],
    Score(x; θ) = Pr_z[ LR_θ(x, z) ≥ γ ]          (the fraction of population points z),

with p(·) the mean of p(· | θ') over the reference models θ'. Online (`offline_a=None`), p(x)
averages all references, IN and OUT for x (balanced by the design). Offline, only references that
are OUT for x are used, with the paper's linear correction for the missing IN half,
p(x) ≈ ½[(1 + a) p_OUT(x) + (1 - a)]; as in the authors' reference code the same correction is
applied to p(z) (population points are OUT for every reference), so that x and z are calibrated
alike. a ∈ [0, 1] is tuned on reference models; a = 1 means no correction.

The score takes values in {0, 1/Z, …, 1} for Z population points. It is computed in log space
and vectorised over models: one stable sort per model of the population ratios merged with the
example thresholds, so no (examples × population) matrix is formed.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from accountants import validation as check
from accountants.validation import InvalidArgument


def _log_probabilities(values, name: str) -> np.ndarray:
    array = check.finite_array(name, values, ndim=2)
    if np.any(array > 0.0):
        raise InvalidArgument(f"{name} must be log-probabilities (≤ 0); got a maximum of {array.max()}.")
    return array


def _leave_one_out_log_mean(log_values: np.ndarray, included: np.ndarray, what: str) -> np.ndarray:
    """Log mean of exp(log_values[k, j]) over models k ≠ m with included[k, j], for each (m, j).

    Prefix and suffix log-sum-exps over the model axis give each leave-one-out sum exactly,
    without the cancellation of subtracting the target's own term from the total.
    """
    count = included.sum(axis=0, keepdims=True) - included
    if count.min() < 1:
        point = int(np.argmin(count.min(axis=0)))
        raise InvalidArgument(
            f"RMIA needs at least one {what} reference model besides the target for every point; "
            f"point {point} has none for some target model. Train more models."
        )
    masked = np.where(included, log_values, -np.inf)
    empty = np.full((1, masked.shape[1]), -np.inf)
    before = np.concatenate([empty, np.logaddexp.accumulate(masked, axis=0)[:-1]])
    after = np.concatenate([np.logaddexp.accumulate(masked[::-1], axis=0)[::-1][1:], empty])
    return np.logaddexp(before, after) - np.log(count)


def _offline_correction(log_mean_out: np.ndarray, offline_a: float) -> np.ndarray:
    """log(½[(1 + a) p_OUT + (1 - a)]) from log p_OUT."""
    with np.errstate(divide="ignore"):  # a = 1 makes the constant term log 0 = -inf, harmless
        return np.logaddexp(math.log((1.0 + offline_a) / 2.0) + log_mean_out, np.log((1.0 - offline_a) / 2.0))


def _fraction_at_or_below(population: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Per row m: the fraction of population[m] that is ≤ each thresholds[m, j]."""
    n_population = population.shape[1]
    merged = np.concatenate([population, thresholds], axis=1)
    # Stable sort: population entries precede threshold entries and so win ties (≤, not <).
    order = np.argsort(merged, axis=1, kind="stable")
    is_population = order < n_population
    population_so_far = np.cumsum(is_population, axis=1)
    rows, positions = np.nonzero(~is_population)
    fractions = np.empty(thresholds.shape)
    fractions[rows, order[rows, positions] - n_population] = population_so_far[rows, positions]
    return fractions / n_population


def rmia_scores(
    target_log_probabilities,
    membership,
    population_log_probabilities,
    *,
    gamma: float = 1.0,
    offline_a: float | None = None,
) -> np.ndarray:
    """RMIA scores Pr_z[LR_θ(x, z) ≥ γ] for every (model, example), leave-one-out references.

    Args:
      target_log_probabilities: (models, examples) log p(y_x | x; θ_m) of the targets.
      membership: (models, examples) bool, True = the example was in model m's training set.
      population_log_probabilities: (models, population) log p(y_z | z; θ_m), z in no training set.
      gamma: the threshold γ > 0 on the pairwise likelihood ratio (the paper uses γ ≥ 1).
      offline_a: None for the online attack; a ∈ [0, 1] for the offline attack with
        p(·) ≈ ½[(1 + a) p_OUT(·) + (1 - a)].

    Returns:
      (models, examples) scores in [0, 1], higher = more likely a member.

    Raises:
      ValueError: bad shapes, positive log-probabilities, γ ≤ 0, a ∉ [0, 1], or a point with no
        usable reference model.
    """
    target = _log_probabilities(target_log_probabilities, "target_log_probabilities")
    membership = check.membership("membership", membership, shape=target.shape)
    population = _log_probabilities(population_log_probabilities, "population_log_probabilities")
    if population.shape[0] != target.shape[0] or population.shape[1] < 1:
        raise InvalidArgument(
            f"population_log_probabilities must have shape ({target.shape[0]}, population ≥ 1), "
            f"one row per model as in target_log_probabilities; got {population.shape}."
        )
    if isinstance(gamma, bool) or not isinstance(gamma, numbers.Real) or not gamma > 0.0:
        raise InvalidArgument(f"gamma must be > 0, e.g. 1.0; got {gamma!r}.")
    every_model = np.ones(population.shape, dtype=bool)
    if offline_a is None:
        log_p_x = _leave_one_out_log_mean(target, np.ones_like(membership), "IN or OUT")
        log_p_z = _leave_one_out_log_mean(population, every_model, "population")
    else:
        if isinstance(offline_a, bool) or not isinstance(offline_a, numbers.Real) or not 0.0 <= offline_a <= 1.0:
            raise InvalidArgument(f"offline_a must be None (online) or in [0, 1]; got {offline_a!r}.")
        log_p_x = _offline_correction(_leave_one_out_log_mean(target, ~membership, "OUT"), float(offline_a))
        log_p_z = _offline_correction(_leave_one_out_log_mean(population, every_model, "population"), float(offline_a))
    log_ratio_x = target - log_p_x
    log_ratio_z = population - log_p_z
    # LR(x, z) ≥ γ  ⟺  log ratio_z ≤ log ratio_x - log γ.
    return _fraction_at_or_below(log_ratio_z, log_ratio_x - math.log(gamma))

"""Empirical ε lower bounds from a single training run: the one-run audit (docs/theory.md §3.4-3.5).

Setting (Steinke, Nasr & Jagielski 2023, "Privacy Auditing with One (1) Training Run", arXiv 2305.08846,
Alg. 1; Mahloujifar, Melis & Chaudhuri 2025, "Auditing f-Differential Privacy in One Run", arXiv
2410.22235, Alg. 1). M canaries, each put in the training set independently with probability ½, one
training run, one score per canary (higher = member). The auditor guesses IN for the k₊ highest scores
and OUT for the k₋ lowest and abstains on the rest: r = k₊ + k₋ guesses, v of them correct. Ties in
the scores are broken uniformly at random by a seeded generator, so the guesses cannot depend on the
order in which the caller lists the canaries (which may be sorted by membership). The guesses depend
on the training run only through its output, which is what both theorems below need.

Two analyses of (M, r, v):

- `one_run_epsilon`, for (ε, δ)-DP (Steinke et al., Thm. 3.1): the number of correct guesses W of
  any auditor with at most r guesses satisfies, with f(x) = P[Binomial(r, q) ≥ x], q = e^ε/(1 + e^ε),

      P[W ≥ v] ≤ p(ε) = f(v) + 2Mδ · max_{1 ≤ i ≤ v} (f(v - i) - f(v)) / i.

  The bound at confidence 1 - β is the largest ε with p(ε) ≤ β, found by bisection. p is
  non-decreasing in ε when 2Mδ ≤ 1, so that this ε is also the smallest one not rejected and the
  search is exact: with b = P[Binomial(r - 1, q) = v - 1], df(v)/dq = r·b, and for every i
  d(f(v - i) - f(v))/dq ≥ -r·b, so each term of the max, hence the max, falls no faster than r·b
  and dp/dq ≥ r·b·(1 - 2Mδ) ≥ 0. A larger δ is refused (`InvalidArgument`). For δ = 0 and r = M the
  bound is exact for ε-DP randomized response, whose W is Binomial(M, q).
- `one_run_fdp_epsilon`, for μ-GDP (Mahloujifar et al., Thm. 3.1 and Alg. 3): with p_c = P[W = c] and
  the Gaussian tradeoff curve's complement f̄_μ(x) = 1 - G_μ(x) = Φ(Φ⁻¹(x) + μ), every μ-GDP
  mechanism and auditor with at most r guesses satisfy, for i = 1, …, r,

      Σ_{c ≥ i} c p_c / M  ≤  f̄_μ( Σ_{c ≥ i-1} (r - c) p_c / M ).

  (Derivation: for each canary j and each guess direction, the event "guess j, and at least i - 1
  of the other guesses correct" is a test between the runs with and without canary j, so its
  probability when the guess is right is at most f̄_μ of its probability when it is wrong; summing
  over the canaries with Jensen's inequality for the concave f̄_μ gives the line above.) The largest
  P[W ≥ v] these constraints allow is attained with all of that mass at c = v and the least mass
  below it, which is what the downward recursion of Alg. 3 builds; μ is rejected at level β when
  the recursion needs more than total probability 1 for P[W ≥ v] = β. The rejected μ form an
  interval [0, μ_lo) because f̄_μ grows with μ, so μ_lo is found by bisection, and the reported ε
  is the ε(δ) of μ_lo-GDP (`attacks.epsilon.gaussian_dp_epsilon`). Like `attacks.epsilon.gdp_epsilon`
  it assumes the mechanism's tradeoff curve is Gaussian-shaped; the (ε, δ) route assumes nothing.

Both theorems fix only the number of guesses r in advance: which canaries are guessed, and how many
IN, may depend on the scores (the run's output) but never on the membership. Keeping the best of
several r after counting the correct guesses voids both statements, so the bound is taken at every
point of a grid of guess counts fixed before the scores are seen, each at β/|grid| (Bonferroni), and
the largest is reported. The default grid (`default_guess_grid`) has r = M, M/2, M/4, …, down to 8
guesses (at most 8 points), each split evenly between IN and OUT guesses. A caller who fixed
(k₊, k₋) in advance (e.g. from a pilot run) passes that single pair and pays no correction.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from typing import Literal

import numpy as np
import scipy.special

from accountants import validation as check
from accountants.validation import InvalidArgument
from attacks.epsilon import gaussian_dp_epsilon

OneRunMethod = Literal["steinke", "gaussian_dp"]

# Grid points of the default guess grid: r = M / 2^j for j < this, and r ≥ _SMALLEST_DEFAULT_GUESSES.
_DEFAULT_GRID_POINTS = 8
_SMALLEST_DEFAULT_GUESSES = 8
# μ above which any number of correct guesses is consistent with μ-GDP, for every M ≤ 10^9 (checked
# by the bracket search, which doubles from here when it is not).
_INITIAL_MU_BRACKET = 8.0
# Bisection steps on μ and ε: the bracket shrinks by 2^-60, far below any meaningful digit.
_BISECTION_STEPS = 60


@dataclasses.dataclass(frozen=True)
class OneRunBound:
    """An empirical ε lower bound from one training run, and what is needed to check or reproduce it.

    Attributes:
      epsilon: the bound, ≥ 0; holds with probability ≥ `confidence`.
      method: "steinke" ((ε, δ)-DP, Steinke et al. Thm. 3.1) or "gaussian_dp" (μ-GDP, Mahloujifar et al.).
      delta: the δ at which ε is bounded.
      confidence: 1 - β of the whole statement, the grid correction included.
      guesses: (k₊, k₋) of the grid point that gave the bound: IN guesses for the k₊ highest scores,
        OUT guesses for the k₋ lowest.
      guess_count: r = k₊ + k₋.
      correct_guesses: v, the correct guesses among them.
      canaries: M, the number of canaries.
      grid: every (k₊, k₋) tried, fixed before the scores were seen.
      beta_per_grid_point: the level each grid point was tested at, (1 - confidence) / len(grid).
      mu_lower: the μ-GDP lower bound μ_lo ("gaussian_dp"; None for "steinke").
    """

    epsilon: float
    method: OneRunMethod
    delta: float
    confidence: float
    guesses: tuple[int, int]
    guess_count: int
    correct_guesses: int
    canaries: int
    grid: tuple[tuple[int, int], ...]
    beta_per_grid_point: float
    mu_lower: float | None


def default_guess_grid(canaries: int) -> tuple[tuple[int, int], ...]:
    """The default (k₊, k₋) grid for M canaries: r = M, M/2, M/4, … (≥ 8, at most 8 points), split evenly.

    It depends on M only, so it is fixed before the scores are seen. For M < 8 it is the single
    point r = M.
    """
    canaries = check.count("canaries", canaries)
    totals = []
    for halvings in range(_DEFAULT_GRID_POINTS):
        total = canaries // 2**halvings
        if total < min(_SMALLEST_DEFAULT_GUESSES, canaries):
            break
        totals.append(total)
    return tuple(((total + 1) // 2, total // 2) for total in totals)


def one_run_epsilon(
    scores,
    membership,
    delta: float,
    confidence: float = 0.95,
    guesses=None,
    seed: int = 0,
) -> OneRunBound:
    """ε lower bound for (ε, δ)-DP from one run with M canaries (Steinke et al. 2023, Thm. 3.1).

    Args:
      scores: 1-D, one score per canary (higher = more likely IN), finite.
      membership: 1-D bool (or 0/1) of the same length: True where the canary was trained on. Each
        canary must have been included independently with probability ½.
      delta: δ in [0, 1/(2M)] (the p-value is monotone in ε only there; see the module docstring).
      confidence: 1 - β, the probability that the reported ε is ≤ the true ε(δ).
      guesses: None for `default_guess_grid(M)`; a pair (k₊, k₋); or a sequence of pairs (Bonferroni over
        them). Their totals must be fixed before the scores are seen; the split may depend on the scores,
        never on the membership.
      seed: seed of the generator that breaks ties between equal scores. Fix it before looking at the
        scores: trying several seeds and keeping the best bound voids the guarantee.

    Returns:
      The best bound over the grid, with the guesses and counts that gave it.

    Raises:
      InvalidArgument: bad scores, membership, δ, confidence, guesses or seed.
    """
    scores, membership, grid, seed = _check_audit(scores, membership, guesses, seed)
    delta = check.real_in("delta", delta, 0.0, 1.0, high_open=True)
    if 2.0 * scores.size * delta > 1.0:
        raise InvalidArgument(
            f"delta must be ≤ 1/(2M) = {1.0 / (2 * scores.size):.3g} for the one-run bound of Steinke et al. with "
            f"M = {scores.size} canaries (its δ term is 2Mδ); got {delta}. Use fewer canaries or a smaller delta."
        )
    confidence = check.open_unit("confidence", confidence)
    beta = (1.0 - confidence) / len(grid)
    ranked, outcomes = _ranked_membership(scores, membership, seed), []
    for positive, negative in grid:
        correct = _correct_guesses(ranked, positive, negative)
        total = positive + negative
        outcomes.append((_steinke_epsilon(scores.size, total, correct, delta, beta), (positive, negative), correct))
    epsilon, chosen, correct = max(outcomes, key=lambda outcome: outcome[0])
    return OneRunBound(
        epsilon=epsilon,
        method="steinke",
        delta=delta,
        confidence=confidence,
        guesses=chosen,
        guess_count=sum(chosen),
        correct_guesses=correct,
        canaries=scores.size,
        grid=grid,
        beta_per_grid_point=beta,
        mu_lower=None,
    )


def one_run_fdp_epsilon(
    scores,
    membership,
    delta: float,
    confidence: float = 0.95,
    guesses=None,
    seed: int = 0,
) -> OneRunBound:
    """μ-GDP lower bound μ_lo from one run, and its ε(δ) (Mahloujifar et al. 2025, Thm. 3.1, Alg. 3).

    Args: as `one_run_epsilon`, except that `delta` must be in (0, 1) (μ-GDP with μ > 0 is not
    (ε, 0)-DP) and has no upper limit tied to M.

    Returns:
      The best bound over the grid; `mu_lower` is μ_lo and `epsilon` its ε(δ).
    """
    scores, membership, grid, seed = _check_audit(scores, membership, guesses, seed)
    delta = check.open_unit("delta", delta)
    confidence = check.open_unit("confidence", confidence)
    beta = (1.0 - confidence) / len(grid)
    ranked, outcomes = _ranked_membership(scores, membership, seed), []
    for positive, negative in grid:
        correct = _correct_guesses(ranked, positive, negative)
        total = positive + negative
        outcomes.append((_gdp_mu_lower(scores.size, total, correct, beta), (positive, negative), correct))
    mu_lower, chosen, correct = max(outcomes, key=lambda outcome: outcome[0])
    return OneRunBound(
        epsilon=gaussian_dp_epsilon(mu_lower, delta),
        method="gaussian_dp",
        delta=delta,
        confidence=confidence,
        guesses=chosen,
        guess_count=sum(chosen),
        correct_guesses=correct,
        canaries=scores.size,
        grid=grid,
        beta_per_grid_point=beta,
        mu_lower=mu_lower,
    )


def _check_audit(scores, membership, guesses, seed):
    scores = check.score_vector("scores", scores)
    membership = check.membership("membership", membership, shape=scores.shape)
    seed = check.seed("seed", seed)
    if guesses is None:
        return scores, membership, default_guess_grid(scores.size), seed
    if _is_pair(guesses):
        guesses = (guesses,)
    if isinstance(guesses, (str, bytes)) or not isinstance(guesses, Sequence) or not guesses:
        raise InvalidArgument(
            f"guesses must be None, a pair (k_plus, k_minus) or a non-empty sequence of pairs; got {guesses!r}"
        )
    grid = []
    for pair in guesses:
        if not _is_pair(pair):
            raise InvalidArgument(f"guesses must hold pairs (k_plus, k_minus) of integers; got {pair!r}")
        positive = check.integer("guesses k_plus", pair[0], 0, scores.size)
        negative = check.integer("guesses k_minus", pair[1], 0, scores.size)
        if not 1 <= positive + negative <= scores.size:
            raise InvalidArgument(
                f"guesses k_plus + k_minus must be in [1, M] = [1, {scores.size}] (at least one guess, at most one "
                f"per canary); got ({positive}, {negative})"
            )
        grid.append((positive, negative))
    return scores, membership, tuple(grid), seed


def _is_pair(value) -> bool:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, (str, bytes))
        and len(value) == 2
        and all(isinstance(item, numbers.Integral) and not isinstance(item, bool) for item in value)
    )


def _ranked_membership(scores: np.ndarray, membership: np.ndarray, seed: int) -> np.ndarray:
    """``membership`` in ascending order of score, once for every guess of the grid.

    Ties are broken by a uniformly random permutation drawn from `seed`, independent of the membership.
    """
    tie_break = np.random.default_rng(seed).permutation(scores.size)
    return membership[np.lexsort((tie_break, scores))]


def _correct_guesses(ranked: np.ndarray, positive: int, negative: int) -> int:
    """Correct guesses of "IN for the `positive` highest scores, OUT for the `negative` lowest" (`ranked` as above)."""
    return int(np.count_nonzero(ranked[ranked.size - positive :]) + np.count_nonzero(~ranked[:negative]))


def _steinke_p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """p(ε) = f(v) + 2Mδ max_{1≤i≤v} (f(v-i) - f(v))/i, capped at 1 (module docstring; Steinke et al. Thm. 3.1)."""
    if correct == 0:
        return 1.0
    accuracy = float(scipy.special.expit(epsilon))
    tail = scipy.special.bdtrc(correct - 1, guesses, accuracy)  # f(v) = P[Binomial(r, q) ≥ v]
    # f(v - i) - f(v) = Σ_{j = v-i}^{v-1} P[Binomial(r, q) = j], for i = 1, …, v.
    below = np.cumsum(_binomial_pmf(np.arange(correct - 1, -1, -1), guesses, accuracy))
    slack = float(np.max(below / np.arange(1, correct + 1)))
    return min(float(tail) + 2.0 * canaries * delta * slack, 1.0)


def _binomial_pmf(k: np.ndarray, n: int, p: float) -> np.ndarray:
    """P[Binomial(n, p) = k] from log-gamma functions.

    scipy.stats.binom.pmf to ~1e-12 relative (measured over 2,000 random (n ≤ 700, k, p) triples), and ~9x faster
    with its argument checks and broadcasting left out: the bisection evaluates the p-value ~40 times per bound.
    """
    log_choose = scipy.special.gammaln(n + 1) - scipy.special.gammaln(k + 1) - scipy.special.gammaln(n - k + 1)
    return np.exp(log_choose + scipy.special.xlogy(k, p) + scipy.special.xlog1py(n - k, -p))


def _steinke_epsilon(canaries: int, guesses: int, correct: int, delta: float, beta: float) -> float:
    """The largest ε with p(ε) ≤ β (0 when p(0) > β); p is non-decreasing in ε for 2Mδ ≤ 1."""

    def excess(epsilon: float) -> float:
        return _steinke_p_value(canaries, guesses, correct, epsilon, delta) - beta

    if excess(0.0) > 0.0:
        return 0.0
    upper = 1.0
    while excess(upper) <= 0.0:  # p → P[all r guesses correct] ≥ q^r → 1 as ε → inf, for v ≤ r
        upper *= 2.0
    lower = 0.0
    for _ in range(_BISECTION_STEPS):
        middle = 0.5 * (lower + upper)
        if excess(middle) <= 0.0:
            lower = middle
        else:
            upper = middle
    return lower


def _gdp_rejects(mu: float, canaries: int, guesses: int, correct: int, beta: float) -> bool:
    """Whether P[W ≥ v] ≤ β for every μ-GDP mechanism (Mahloujifar et al. Alg. 3, with k = 2 options).

    Puts probability β at exactly v correct guesses and, level by level downwards, the least mass the
    constraints of the module docstring force below it; μ is rejected when that needs total mass > 1.
    `correct_mass` = Σ c p_c / M and `wrong_mass` = Σ (r - c) p_c / M over the levels placed so far;
    their sum is r/M times the total probability placed.
    """
    budget = guesses / canaries  # (correct_mass + wrong_mass) when total probability is 1
    correct_mass = beta * correct / canaries
    wrong_mass = beta * (guesses - correct) / canaries
    for level in range(correct - 1, -1, -1):
        if correct_mass + wrong_mass > budget:
            return True
        # Constraint at i = level + 1: correct_mass ≤ f̄_μ(wrong_mass + (r - level) p_level / M).
        needed_wrong = scipy.special.ndtr(scipy.special.ndtri(min(correct_mass, 1.0)) - mu)
        if needed_wrong <= wrong_mass:
            break  # satisfied here, hence at every lower level: no more mass is needed
        correct_mass += level / (guesses - level) * (needed_wrong - wrong_mass)
        wrong_mass = needed_wrong
    return correct_mass + wrong_mass > budget


def _gdp_mu_lower(canaries: int, guesses: int, correct: int, beta: float) -> float:
    """μ_lo = sup of the rejected μ, an interval [0, μ_lo) since f̄_μ grows with μ; 0 if μ = 0 is kept."""
    if not _gdp_rejects(0.0, canaries, guesses, correct, beta):
        return 0.0
    upper = _INITIAL_MU_BRACKET
    while _gdp_rejects(upper, canaries, guesses, correct, beta):
        upper *= 2.0
    lower = 0.0
    for _ in range(_BISECTION_STEPS):
        middle = 0.5 * (lower + upper)
        if _gdp_rejects(middle, canaries, guesses, correct, beta):
            lower = middle
        else:
            upper = middle
    return lower

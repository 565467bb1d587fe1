"""Empirical ε lower bounds from IN/OUT attack scores (docs/theory.md §3.4-3.5, "Empirical ε lower bound").

Setting. Each IN score comes from an independent run of the mechanism on D ∪ {canary} (IN) and
each OUT score from a run on D (OUT), e.g. the single-canary design of [W] App. F.1. The trials
must be independent draws from these two output distributions: pooling the scores of many
examples of the same models (the all-examples design) breaks independence, and the bounds below
then carry no formal guarantee.

The rule "IN iff score ≥ t" is a test between the two distributions. If the mechanism is
(ε, δ)-DP for this neighbouring pair, every t satisfies (Kairouz et al. 2015; Jagielski et al.
2020, "Auditing differentially private machine learning")

    TPR(t) ≤ e^ε FPR(t) + δ     and     TNR(t) ≤ e^ε FNR(t) + δ,

so ε ≥ ln((TPR - δ)/FPR) and ε ≥ ln((TNR - δ)/FNR). With one-sided Clopper-Pearson bounds
TPR_lo ≤ TPR and FPR_hi ≥ FPR (each failing with probability ≤ α/2), and TNR_lo = 1 - FPR_hi,
FNR_hi = 1 - TPR_lo (the same two events),

    ε ≥ max(ln((TPR_lo - δ)/FPR_hi), ln((TNR_lo - δ)/FNR_hi))   with probability ≥ 1 - α.

Gaussian-DP route (Nasr et al. 2023, "Tight auditing of differentially private machine
learning"): a μ-GDP mechanism (Dong, Roth & Su 2022) has FNR ≥ G_μ(FPR) = Φ(Φ⁻¹(1 - FPR) - μ)
for every test, so μ ≥ μ_lo = Φ⁻¹(1 - FPR_hi) - Φ⁻¹(FNR_hi); the reported ε is the ε(δ) of
μ_lo-GDP (`gaussian_dp_epsilon`). It is a lower bound on ε under the assumption that the
mechanism's tradeoff curve is Gaussian-shaped (as for the Gaussian mechanism and, by the CLT,
for many compositions); the Clopper-Pearson route makes no such assumption.

Threshold choice. Picking the t that maximises the bound on the same data, at level α per
bound, is invalid. Valid strategies rest on two facts. (i) For a fixed count k, the event "some t
with FP(t) ≤ k has FPR(t) > CP_hi(k)" has probability ≤ α' when CP_hi is taken at α': the worst
such t lies just above the (k+1)-th largest OUT score, where the FPR is Beta(k + 1, n_out - k)
distributed (continuous scores), whose upper α' quantile is CP_hi(k); likewise for TP and CP_lo.
(ii) At a threshold computed from the OUT scores alone, TP is Binomial(n_in, TPR(t)) given t, so
CP_lo(TP) fails with probability ≤ α'; likewise for FP at a threshold computed from IN scores.
Thresholding a discrete score is thresholding a continuous one after a monotone map, so ties do
not break either.

- `GridThresholds` (default): a geometric grid of counts J = {0} ∪ {⌊ratio^j⌋ ≤ n/2} (ratio 2 by
  default), fixed by n_in and n_out alone. For j in J_out, t just above the (j+1)-th largest OUT
  score (FP ≤ j: FPR by (i), TPR by (ii)); for j in J_in, t at the (j+1)-th smallest IN score
  (FN ≤ j: FNR by (i), FPR by (ii)). Both directions and the GDP μ are evaluated at every such
  t, with FP counted as j (resp. TP as n_in - j; the same unless scores tie). The union bound
  covers 2(|J_out| + |J_in|) one-sided bounds, e.g. 40 for 1000 + 1000 trials instead of 2000.
- `BonferroniThresholds`: bound at every threshold with α/(n_in + n_out) per one-sided bound:
  (i) for every TP count and every FP count, n_in + n_out events.
- `SplitThreshold`: choose t on a seeded random part of the IN and of the OUT scores
  (`selection_fraction`, default ½) by maximising the bound there, then bound on the other part
  at α/2 per one-sided bound; t is independent of the held-out trials.
- `FixedThreshold`: t fixed before seeing these scores (e.g. from a pilot campaign); α/2 each.

Why a deterministic grid is the default: the bound cannot be improved by trying split seeds
(which would silently void the split's guarantee), and it uses every trial. Against Bonferroni
over all thresholds it trades thresholds between grid points for a much smaller correction, and
comes out tighter in every regime measured: mean fraction of the true ε(δ = 1e-5) recovered over
10 seeds for N(μ, 1) vs N(0, 1) scores, n + n trials, Bonferroni over all thresholds → grid
(ratio 2) (CP route | GDP route):

    μ = 0.5,  100:  0.000 → 0.004  |  0.000 → 0.009
    μ = 0.5, 1000:  0.156 → 0.224  |  0.462 → 0.585
    μ = 0.5, 5000:  0.299 → 0.361  |  0.714 → 0.791
    μ = 1,    100:  0.069 → 0.101  |  0.216 → 0.321
    μ = 1,   1000:  0.250 → 0.304  |  0.700 → 0.769
    μ = 1,   5000:  0.370 → 0.444  |  0.854 → 0.901
    μ = 2,    100:  0.131 → 0.159  |  0.519 → 0.592
    μ = 2,   1000:  0.269 → 0.314  |  0.816 → 0.860
    μ = 2,   5000:  0.356 → 0.401  |  0.898 → 0.928
    μ = 4,    100:  0.096 → 0.108  |  0.531 → 0.596
    μ = 4,   1000:  0.176 → 0.195  |  0.799 → 0.849
    μ = 4,   5000:  0.232 → 0.256  |  0.909 → 0.940

Ratios 1.25, 1.5, 3 and 4 gave within ±0.03 of ratio 2 (4 slightly higher at n = 100, 1.25 lower
everywhere). Against the split (½), Bonferroni over all thresholds measured 0.35 vs 0.37 (CP) and
0.90 vs 0.87 (GDP) at μ = 2, 5000 + 5000, and 0.12 vs 0.10, 0.48 vs 0.43 at μ = 2, 100 + 100.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Literal

import numpy as np
import scipy.optimize
import scipy.stats

from accountants import validation as check
from accountants.validation import InvalidArgument
from attacks.clopper_pearson import clopper_pearson_lower, clopper_pearson_upper
from attacks.metrics import count_at_or_above, roc_curve


@dataclasses.dataclass(frozen=True)
class SplitThreshold:
    """Choose the threshold on a seeded random part of the trials, bound on the rest.

    Attributes:
      selection_fraction: fraction of the IN and of the OUT scores used to choose the
        threshold; the rest certifies the bound.
      seed: seed of the `numpy.random.Generator` that draws the split.
    """

    selection_fraction: float = 0.5
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.selection_fraction, numbers.Real) or not 0.0 < self.selection_fraction < 1.0:
            raise InvalidArgument(f"selection_fraction must be in (0, 1), e.g. 0.5; got {self.selection_fraction!r}.")
        check.seed("seed", self.seed)


@dataclasses.dataclass(frozen=True)
class BonferroniThresholds:
    """Bound at every threshold with the confidence split over all n_in + n_out order statistics."""


@dataclasses.dataclass(frozen=True)
class GridThresholds:
    """Bound at thresholds set by a fixed geometric grid of order statistics (the module docstring).

    Attributes:
      ratio: the grid's counts are 0 and ⌊ratio^j⌋ up to half the class size, for the false positives
        (thresholds just above OUT order statistics) and the false negatives (at IN order statistics).
    """

    ratio: float = 2.0

    def __post_init__(self):
        check.real_in("ratio", self.ratio, 1.0, math.inf, low_open=True, high_open=True)


@dataclasses.dataclass(frozen=True)
class FixedThreshold:
    """A threshold chosen without looking at the scores being bounded.

    Attributes:
      threshold: predict IN iff score ≥ threshold.
    """

    threshold: float

    def __post_init__(self):
        if not isinstance(self.threshold, numbers.Real) or math.isnan(self.threshold):
            raise InvalidArgument(f"threshold must be a real number; got {self.threshold!r}.")


ThresholdStrategy = SplitThreshold | BonferroniThresholds | GridThresholds | FixedThreshold

Method = Literal["clopper_pearson", "gaussian_dp"]


@dataclasses.dataclass(frozen=True)
class EpsilonLowerBound:
    """An empirical ε lower bound, and everything needed to check or reproduce it.

    Attributes:
      epsilon: the bound, max(0, ·); holds with probability ≥ `confidence`.
      method: "clopper_pearson" or "gaussian_dp".
      delta: the δ at which ε is bounded.
      confidence: 1 - α of the whole statement.
      strategy: how the threshold was chosen.
      threshold: the rule used is "IN iff score ≥ threshold".
      direction: which inequality gave the bound, "tpr/fpr" or "tnr/fnr"; None for "gaussian_dp",
        whose bound is symmetric.
      true_positives: #IN scores ≥ threshold among the trials that certify the bound.
      false_positives: #OUT scores ≥ threshold among them.
      n_in: IN trials that certify the bound (the held-out part for `SplitThreshold`).
      n_out: OUT trials that certify the bound.
      alpha_per_bound: failure probability given to each one-sided Clopper-Pearson bound.
      tpr_lower: one-sided Clopper-Pearson lower bound on the TPR.
      fpr_upper: one-sided Clopper-Pearson upper bound on the FPR.
      mu_lower: the GDP μ lower bound (None for "clopper_pearson").
      max_certifiable_epsilon: the bound a perfect attack (all IN above all OUT) would get with
        the same trial counts, strategy and confidence: the most this audit could ever show.
    """

    epsilon: float
    method: Method
    delta: float
    confidence: float
    strategy: ThresholdStrategy
    threshold: float
    direction: Literal["tpr/fpr", "tnr/fnr"] | None
    true_positives: int
    false_positives: int
    n_in: int
    n_out: int
    alpha_per_bound: float
    tpr_lower: float
    fpr_upper: float
    mu_lower: float | None
    max_certifiable_epsilon: float


def gaussian_dp_delta(mu: float, epsilon: float) -> float:
    """δ(ε) of μ-GDP: Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ - μ/2) (Dong, Roth & Su 2022, Cor. 2.13).

    The same curve is the exact privacy profile of the Gaussian mechanism with μ = Δ/σ
    (Balle & Wang 2018, Thm. 8). Evaluated in log space so that it stays accurate at large ε.
    """
    mu, epsilon = _check_mu(mu), _check_epsilon(epsilon)
    if mu == 0.0:
        return 0.0
    return float(np.exp(_log_gaussian_dp_delta(mu, epsilon)))


def gaussian_dp_epsilon(mu: float, delta: float) -> float:
    """The smallest ε with δ(ε) ≤ `delta` for μ-GDP, by root finding (scipy brentq).

    0 for μ = 0 or when δ(0) = 2Φ(μ/2) - 1 ≤ `delta`. The root lies below
    ε_hi = μ²/2 + μ Φ⁻¹(1 - δ), where the first term of δ(ε) alone equals δ.

    Raises:
      ValueError: `delta` = 0 with μ > 0 (no finite ε exists), or bad arguments.
    """
    mu = _check_mu(mu)
    delta = check.real_in("delta", delta, 0.0, 1.0, high_open=True)
    if mu == 0.0:
        return 0.0
    if delta == 0.0:
        raise InvalidArgument("delta must be > 0 for μ-GDP with μ > 0: it is not (ε, 0)-DP for any ε.")
    if 2.0 * scipy.stats.norm.cdf(mu / 2.0) - 1.0 <= delta:
        return 0.0
    log_delta = math.log(delta)
    epsilon_high = mu * (mu / 2.0 + scipy.stats.norm.isf(delta))
    return float(
        scipy.optimize.brentq(
            lambda epsilon: _log_gaussian_dp_delta(mu, epsilon) - log_delta,
            0.0,
            epsilon_high,
            xtol=1e-12,
            rtol=1e-12,
        )
    )


def _log_gaussian_dp_delta(mu: float, epsilon: float) -> float:
    log_first = scipy.stats.norm.logcdf(-epsilon / mu + mu / 2.0)
    log_second = epsilon + scipy.stats.norm.logcdf(-epsilon / mu - mu / 2.0)
    # log(e^a - e^b) = a + log(1 - e^{b-a}); b ≤ a holds mathematically, rounding may break it.
    with np.errstate(divide="ignore"):
        return float(log_first + np.log1p(-np.exp(min(log_second - log_first, 0.0))))


def _check_mu(mu) -> float:
    if isinstance(mu, bool) or not isinstance(mu, numbers.Real) or not 0.0 <= float(mu) < math.inf:
        raise InvalidArgument(f"mu must be a finite number ≥ 0; got {mu!r}.")
    return float(mu)


def _check_epsilon(epsilon) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real) or not float(epsilon) >= 0.0:
        raise InvalidArgument(f"epsilon must be ≥ 0; got {epsilon!r}.")
    return float(epsilon)


@dataclasses.dataclass(frozen=True)
class ThresholdBounds:
    """Per-threshold bound ingredients, arrays over candidate thresholds (the last axis)."""

    objective: np.ndarray  # what the threshold choice maximises: ε (CP) or μ_lo (GDP), unclipped
    direction: np.ndarray  # CP: 0 = tpr/fpr, 1 = tnr/fnr
    tpr_lower: np.ndarray
    fpr_upper: np.ndarray


def bounds_from_counts(method: Method, true_positives, false_positives, n_in, n_out, alpha, delta) -> ThresholdBounds:
    """Bounds at each candidate threshold from its counts (arrays of any shape), `alpha` per one-sided CP bound."""
    tpr_lower = clopper_pearson_lower(true_positives, n_in, alpha)
    fpr_upper = clopper_pearson_upper(false_positives, n_out, alpha)
    # The same two events bound the complements. 1 - x loses at most ~1e-11 relative precision
    # here, since FNR_hi ≥ 1 - α^{1/n_in} ≫ 1e-16 for any realistic trial count.
    fnr_upper = 1.0 - tpr_lower
    tnr_lower = 1.0 - fpr_upper
    if method == "gaussian_dp":
        mu_lower = scipy.stats.norm.isf(fpr_upper) - scipy.stats.norm.ppf(fnr_upper)
        return ThresholdBounds(mu_lower, np.zeros_like(mu_lower, dtype=int), tpr_lower, fpr_upper)
    with np.errstate(divide="ignore", invalid="ignore"):
        # log of a non-positive numerator is no bound at all: -inf, never chosen over a real one.
        forward = np.log(np.clip(tpr_lower - delta, 0.0, None)) - np.log(fpr_upper)
        backward = np.log(np.clip(tnr_lower - delta, 0.0, None)) - np.log(fnr_upper)
    direction = (backward > forward).astype(int)
    return ThresholdBounds(np.maximum(forward, backward), direction, tpr_lower, fpr_upper)


def epsilon_of(method: Method, objective: float, delta: float) -> float:
    if method == "gaussian_dp":
        return gaussian_dp_epsilon(max(objective, 0.0), delta)
    return max(objective, 0.0)


def _lower_bound(method: Method, in_scores, out_scores, delta, confidence, strategy):
    in_scores = check.score_vector("in_scores", in_scores)
    out_scores = check.score_vector("out_scores", out_scores)
    delta = check.real_in("delta", delta, 0.0, 1.0, high_open=True)
    confidence = check.open_unit("confidence", confidence)
    if method == "gaussian_dp" and delta == 0.0:
        raise InvalidArgument("delta must be > 0 for gdp_epsilon (μ-GDP is not (ε, 0)-DP); use e.g. 1e-5.")
    alpha = 1.0 - confidence

    if isinstance(strategy, SplitThreshold):
        in_select, in_certify = _split(in_scores, strategy, "in_scores", rng_stream=0)
        out_select, out_certify = _split(out_scores, strategy, "out_scores", rng_stream=1)
        alpha_per_bound = alpha / 2.0
        selection_candidates = _candidate_thresholds(in_select, out_select)
        chosen = bounds_from_counts(
            method,
            count_at_or_above(in_select, selection_candidates),
            count_at_or_above(out_select, selection_candidates),
            in_select.size,
            out_select.size,
            alpha_per_bound,
            delta,
        )
        candidates = selection_candidates[[np.argmax(chosen.objective)]]
        n_in, n_out = in_certify.size, out_certify.size
        true_positives = count_at_or_above(in_certify, candidates)
        false_positives = count_at_or_above(out_certify, candidates)
    else:
        intervals = _simultaneous_counts(in_scores, out_scores, alpha, strategy)
        candidates, alpha_per_bound = intervals.thresholds, intervals.alpha_per_bound
        true_positives, false_positives = intervals.true_positives, intervals.false_positives
        n_in, n_out = intervals.n_in, intervals.n_out
    evaluation = bounds_from_counts(method, true_positives, false_positives, n_in, n_out, alpha_per_bound, delta)
    best = int(np.argmax(evaluation.objective))
    objective = float(evaluation.objective[best])
    # What a perfect attack would certify: TP = n_in, FP = 0 on the same trials and level.
    perfect = bounds_from_counts(method, np.array([n_in]), np.array([0]), n_in, n_out, alpha_per_bound, delta)
    return EpsilonLowerBound(
        epsilon=epsilon_of(method, objective, delta),
        method=method,
        delta=delta,
        confidence=confidence,
        strategy=strategy,
        threshold=float(candidates[best]),
        direction=(None if method == "gaussian_dp" else ("tpr/fpr", "tnr/fnr")[evaluation.direction[best]]),
        true_positives=int(true_positives[best]),
        false_positives=int(false_positives[best]),
        n_in=n_in,
        n_out=n_out,
        alpha_per_bound=alpha_per_bound,
        tpr_lower=float(evaluation.tpr_lower[best]),
        fpr_upper=float(evaluation.fpr_upper[best]),
        mu_lower=max(objective, 0.0) if method == "gaussian_dp" else None,
        max_certifiable_epsilon=epsilon_of(method, float(perfect.objective[0]), delta),
    )


PresetThresholds = BonferroniThresholds | GridThresholds | FixedThreshold  # thresholds no bound chooses


@dataclasses.dataclass(frozen=True)
class SimultaneousBounds:
    """One-sided Clopper-Pearson bounds on TPR and FPR at a strategy's thresholds, all holding at once.

    With probability ≥ ``confidence`` every ``tpr_lower[k]`` ≤ TPR(t_k) and every ``fpr_upper[k]`` ≥ FPR(t_k) (the
    union bound of the module docstring, ``alpha_per_bound`` each). The counts are the observed ones, except that
    `GridThresholds` caps TP and floors FP at its grid counts (equal unless scores tie), the counts it covers.

    Attributes:
      thresholds: (K,) the rules "IN iff score ≥ t_k".
      true_positives: (K,) #IN scores ≥ t_k, as bounded.
      false_positives: (K,) #OUT scores ≥ t_k, as bounded.
      n_in: IN trials.
      n_out: OUT trials.
      confidence: 1 - α of all the bounds together.
      alpha_per_bound: failure probability of each one-sided bound.
      tpr_lower: (K,) Clopper-Pearson lower bounds on TPR(t_k).
      fpr_upper: (K,) Clopper-Pearson upper bounds on FPR(t_k).
    """

    thresholds: np.ndarray
    true_positives: np.ndarray
    false_positives: np.ndarray
    n_in: int
    n_out: int
    confidence: float
    alpha_per_bound: float
    tpr_lower: np.ndarray
    fpr_upper: np.ndarray


def simultaneous_bounds(
    in_scores, out_scores, confidence: float = 0.95, strategy: PresetThresholds = GridThresholds()
) -> SimultaneousBounds:
    """:class:`SimultaneousBounds` of IN/OUT scores at the thresholds of ``strategy`` (module docstring).

    The same intervals as `clopper_pearson_epsilon` with the same strategy: any test of a claimed trade-off curve
    against them (e.g. :func:`attacks.tradeoff.profile_test`) errs with probability ≤ 1 - ``confidence``.
    `SplitThreshold` is not accepted: its threshold is chosen by the bound it certifies.
    """
    in_scores = check.score_vector("in_scores", in_scores)
    out_scores = check.score_vector("out_scores", out_scores)
    confidence = check.open_unit("confidence", confidence)
    if isinstance(strategy, SplitThreshold):
        raise InvalidArgument(
            "strategy must be GridThresholds(...), BonferroniThresholds() or FixedThreshold(...) for simultaneous"
            " bounds: a SplitThreshold's threshold is chosen by the bound it certifies."
        )
    return _simultaneous_counts(in_scores, out_scores, 1.0 - confidence, strategy)


def _simultaneous_counts(in_scores, out_scores, alpha: float, strategy) -> SimultaneousBounds:
    """:func:`simultaneous_bounds` of checked scores at total error ``alpha``."""
    n_in, n_out = in_scores.size, out_scores.size
    # Counts the bounds use: the observed ones, except that GridThresholds caps TP and floors FP at its
    # grid counts (equal to the observed ones unless scores tie), the counts its union bound covers.
    true_positive_cap: np.ndarray | int = n_in
    false_positive_floor: np.ndarray | int = 0
    if isinstance(strategy, BonferroniThresholds):
        alpha_per_bound = alpha / (n_in + n_out)
        candidates = _candidate_thresholds(in_scores, out_scores)
    elif isinstance(strategy, GridThresholds):
        false_positive_grid, false_negative_grid, alpha_per_bound = grid_counts(strategy, n_in, n_out, alpha)
        # Just above the (j+1)-th largest OUT score: FP ≤ j; at the (j+1)-th smallest IN score: FN ≤ j.
        candidates = np.concatenate(
            [
                np.nextafter(np.sort(out_scores)[::-1][false_positive_grid], np.inf),
                np.sort(in_scores)[false_negative_grid],
            ]
        )
        false_positive_floor = np.concatenate([false_positive_grid, np.zeros_like(false_negative_grid)])
        true_positive_cap = np.concatenate([np.full_like(false_positive_grid, n_in), n_in - false_negative_grid])
    elif isinstance(strategy, FixedThreshold):
        alpha_per_bound = alpha / 2.0
        candidates = np.array([float(strategy.threshold)])
    else:
        raise InvalidArgument(
            "strategy must be GridThresholds(...), BonferroniThresholds(), SplitThreshold(...) or "
            f"FixedThreshold(...); got {strategy!r}."
        )
    true_positives = np.minimum(count_at_or_above(in_scores, candidates), true_positive_cap)
    false_positives = np.maximum(count_at_or_above(out_scores, candidates), false_positive_floor)
    return SimultaneousBounds(
        thresholds=candidates,
        true_positives=true_positives,
        false_positives=false_positives,
        n_in=n_in,
        n_out=n_out,
        confidence=1.0 - alpha,
        alpha_per_bound=alpha_per_bound,
        tpr_lower=clopper_pearson_lower(true_positives, n_in, alpha_per_bound),
        fpr_upper=clopper_pearson_upper(false_positives, n_out, alpha_per_bound),
    )


def _candidate_thresholds(in_scores: np.ndarray, out_scores: np.ndarray) -> np.ndarray:
    """The thresholds worth trying: for each false-positive count, the lowest threshold with it.

    Every bound here grows with TP and shrinks with FP, so a threshold is dominated by the lowest
    one with the same FP (same FP, at least as many TP). t = +inf (TP = FP = 0) never gives ε > 0.
    Dropping thresholds never hurts validity: the Bonferroni argument covers all t at once.
    """
    roc = roc_curve(in_scores, out_scores)
    fp = roc.false_positives
    lowest_of_its_fp_count = np.append(fp[1:] > fp[:-1], True)
    lowest_of_its_fp_count[0] = False  # t = +inf
    return roc.thresholds[lowest_of_its_fp_count]


def grid_counts(strategy: GridThresholds, n_in: int, n_out: int, alpha: float) -> tuple[np.ndarray, np.ndarray, float]:
    """`GridThresholds`' FP counts J_out, FN counts J_in and α per one-sided bound at these trials (module doc)."""
    false_positive_grid, false_negative_grid = _count_grid(n_out, strategy.ratio), _count_grid(n_in, strategy.ratio)
    return false_positive_grid, false_negative_grid, alpha / (2 * (false_positive_grid.size + false_negative_grid.size))


def _count_grid(size: int, ratio: float) -> np.ndarray:
    """0 and ⌊ratio^j⌋ for ratio^j ≤ size // 2: the order-statistic counts of `GridThresholds`, all < size."""
    counts = {0}
    power = 1.0
    while power <= size // 2:
        counts.add(int(power))
        power *= ratio
    return np.array(sorted(counts))


def _split(scores: np.ndarray, strategy: SplitThreshold, name: str, rng_stream: int):
    """Seeded (selection, certification) partition of one class's scores."""
    n_select = int(strategy.selection_fraction * scores.size)
    if n_select < 1 or n_select >= scores.size:
        raise InvalidArgument(
            f"{name} has {scores.size} score(s): SplitThreshold(selection_fraction="
            f"{strategy.selection_fraction}) leaves one part empty. Provide more trials or use "
            "BonferroniThresholds()."
        )
    # One child stream per class, so the IN split does not depend on how many OUT scores exist.
    rng = np.random.default_rng([strategy.seed, rng_stream])
    order = rng.permutation(scores.size)
    return scores[order[:n_select]], scores[order[n_select:]]


def clopper_pearson_epsilon(
    in_scores,
    out_scores,
    delta: float,
    confidence: float = 0.95,
    strategy: ThresholdStrategy = GridThresholds(),
) -> EpsilonLowerBound:
    """ε lower bound from one-sided Clopper-Pearson bounds on TPR and FPR (module docstring).

    Args:
      in_scores: 1-D scores of independent IN trials (higher = member).
      out_scores: 1-D scores of independent OUT trials.
      delta: δ in [0, 1) at which ε is bounded.
      confidence: probability that the reported ε is ≤ the true ε(δ); 1 - α.
      strategy: how the threshold is chosen; see the module docstring. Default: Bonferroni over a
        geometric grid of order statistics (`GridThresholds`).

    Returns:
      The bound with its threshold, counts and one-sided bounds.

    Raises:
      ValueError: empty/NaN/non-1-D scores, bad δ or confidence, or a split with an empty part.
    """
    return _lower_bound("clopper_pearson", in_scores, out_scores, delta, confidence, strategy)


def gdp_epsilon(
    in_scores,
    out_scores,
    delta: float,
    confidence: float = 0.95,
    strategy: ThresholdStrategy = GridThresholds(),
) -> EpsilonLowerBound:
    """ε(δ) of the μ-GDP lower bound μ_lo = Φ⁻¹(1 - FPR_hi) - Φ⁻¹(FNR_hi) (Nasr et al. 2023).

    The threshold maximises μ_lo (the strategies of the module docstring); ε is then
    `gaussian_dp_epsilon(μ_lo, delta)`, 0 when μ_lo ≤ 0.

    Args: as `clopper_pearson_epsilon`, except that `delta` must be > 0.
    """
    return _lower_bound("gaussian_dp", in_scores, out_scores, delta, confidence, strategy)

"""Membership-inference metrics from IN and OUT scores (docs/theory.md §3.3).

Convention: a higher score means "more likely a member"; the attack predicts IN when
score ≥ threshold. `in_scores` are the scores of trials where the target was a member (IN
models / IN examples), `out_scores` those where it was not.

- ROC: for every distinct threshold t (plus t = +inf), TPR(t) = #{in ≥ t}/n_in and
  FPR(t) = #{out ≥ t}/n_out; the same points as `sklearn.metrics.roc_curve(...,
  drop_intermediate=False)`. The log-log ROC of Carlini et al. (2022) is a plot of these arrays.
- AUC: the Mann-Whitney statistic P(S_in > S_out) + ½ P(S_in = S_out), exactly the trapezoidal
  area under the ROC.
- AUC confidence interval: Newcombe (2006, "Confidence intervals for an effect size measure
  based on the Mann-Whitney statistic. Part 2", Method 5): the Hanley & McNeil (1982) variance
  written as a function of the true AUC θ, with N* = (n_in + n_out)/2 - 1,

      V(θ) = θ(1-θ)/(n_in n_out) · [1 + N*(1-θ)/(2-θ) + N*θ/(1+θ)],

  and the interval {θ : (Â - θ)² ≤ z² V(θ)} (a score interval, like Wilson's for a
  proportion). Why this and not DeLong's Wald interval: the verdict uses the *lower* limit near
  AUC ≈ 1, where the Wald interval collapses onto Â. In a check with binormal scores
  (2000 replicates each, 95% two-sided) DeLong's lower limit exceeded the true AUC in 61% of
  runs at AUC = 0.99, n = 10 + 10 (14% at n = 100 + 100); Newcombe's in 0% (coverage 0.97 and
  0.99), and in ≤ 3.1% at AUC 0.64-0.96. It does not model ties, which lower the estimate's
  variance, so with many ties it errs on the wide side.
- Model-level bootstrap interval of the AUC (`model_bootstrap_auc_interval`): in the all-examples
  design every model scores every example, so trials share models and a model that memorises more
  lifts all of its IN scores at once; the trial-level interval above treats them as independent and
  is too narrow. The bootstrap resamples whole models with replacement, keeps each resampled
  model's IN and OUT scores, recomputes the pooled AUC and reports the percentile interval.
- Balanced accuracy: max over thresholds of ½(TPR + TNR), as in [W] App. F.1.
- TPR at FPR = f: the largest TPR among ROC points with FPR ≤ f, with a two-sided
  Clopper-Pearson interval for that TPR. The threshold is picked on the same data, so the
  interval describes the TPR of the picked threshold; for a *valid* privacy statement use
  `attacks.epsilon`.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence

import numpy as np
import scipy.optimize
import scipy.stats

from accountants import validation as check
from accountants.validation import InvalidArgument
from attacks.clopper_pearson import clopper_pearson_interval


def _read_only(array: np.ndarray) -> np.ndarray:
    """``array`` marked read-only, so that the frozen result dataclasses holding it stay immutable."""
    array.setflags(write=False)
    return array


@dataclasses.dataclass(frozen=True, eq=False)
class RocCurve:
    """Counts at every distinct threshold, in decreasing threshold order.

    Attributes:
      thresholds: +inf, then the distinct scores in decreasing order (predict IN iff score ≥ t).
      true_positives: #{in_scores ≥ t} at each threshold (non-decreasing, 0 … n_in).
      false_positives: #{out_scores ≥ t} at each threshold (non-decreasing, 0 … n_out).
      n_in: number of IN scores.
      n_out: number of OUT scores.
    """

    thresholds: np.ndarray
    true_positives: np.ndarray
    false_positives: np.ndarray
    n_in: int
    n_out: int

    @property
    def tpr(self) -> np.ndarray:
        return self.true_positives / self.n_in

    @property
    def fpr(self) -> np.ndarray:
        return self.false_positives / self.n_out


@dataclasses.dataclass(frozen=True, eq=False)
class MembershipMetrics:
    """What `summarize` reports for one set of IN/OUT scores.

    Attributes:
      auc: Mann-Whitney AUC (ties count ½).
      auc_ci: two-sided `confidence` interval for the AUC (Newcombe 2006, Method 5).
      balanced_accuracy: max over thresholds of ½(TPR + TNR).
      tpr_at_fpr: FPR target → largest TPR among thresholds with FPR ≤ target.
      tpr_at_fpr_ci: FPR target → two-sided Clopper-Pearson interval of that TPR.
      roc: (fpr, tpr) arrays of the full ROC, in decreasing threshold order.
      n_in: number of IN scores.
      n_out: number of OUT scores.
      confidence: confidence level of both interval kinds.
    """

    auc: float
    auc_ci: tuple[float, float]
    balanced_accuracy: float
    tpr_at_fpr: dict[float, float]
    tpr_at_fpr_ci: dict[float, tuple[float, float]]
    roc: tuple[np.ndarray, np.ndarray]
    n_in: int
    n_out: int
    confidence: float


def _scores(in_scores, out_scores) -> tuple[np.ndarray, np.ndarray]:
    return (
        check.score_vector("in_scores", in_scores),
        check.score_vector("out_scores", out_scores),
    )


def count_at_or_above(scores: np.ndarray, thresholds) -> np.ndarray:
    """#{scores ≥ t} for each t in `thresholds` (scores: 1-D float array, any order)."""
    sorted_scores = np.sort(scores)
    return sorted_scores.size - np.searchsorted(sorted_scores, thresholds, side="left")


def roc_curve(in_scores, out_scores) -> RocCurve:
    """ROC of the rule "IN iff score ≥ t" at every distinct score t, plus t = +inf.

    Matches `sklearn.metrics.roc_curve(labels, scores, drop_intermediate=False)` point for point.
    """
    in_scores, out_scores = _scores(in_scores, out_scores)
    distinct = np.unique(np.concatenate([in_scores, out_scores]))[::-1]
    thresholds = np.concatenate([[np.inf], distinct])
    return RocCurve(
        thresholds=_read_only(thresholds),
        true_positives=_read_only(count_at_or_above(in_scores, thresholds)),
        false_positives=_read_only(count_at_or_above(out_scores, thresholds)),
        n_in=in_scores.size,
        n_out=out_scores.size,
    )


def auc(in_scores, out_scores) -> float:
    """Mann-Whitney AUC: P(S_in > S_out) + ½ P(S_in = S_out), from average ranks."""
    in_scores, out_scores = _scores(in_scores, out_scores)
    n_in, n_out = in_scores.size, out_scores.size
    ranks = scipy.stats.rankdata(np.concatenate([in_scores, out_scores]))
    mann_whitney_u = ranks[:n_in].sum() - n_in * (n_in + 1) / 2.0
    return float(mann_whitney_u / (n_in * n_out))


def _newcombe_variance(theta, n_in: int, n_out: int):
    """Hanley-McNeil variance of the AUC estimate at true AUC θ, with Newcombe's N*."""
    n_star = (n_in + n_out) / 2.0 - 1.0
    bracket = 1.0 + n_star * (1.0 - theta) / (2.0 - theta) + n_star * theta / (1.0 + theta)
    return theta * (1.0 - theta) / (n_in * n_out) * bracket


def auc_confidence_interval(in_scores, out_scores, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided AUC interval of Newcombe (2006), Method 5 (see the module docstring).

    The limits are the roots of (Â - θ)² = z² V(θ) on either side of Â, z = Φ⁻¹(1 - α/2);
    at Â = 1 (perfect separation) the lower limit is still below 1, e.g. 0.960 for 50 + 50.

    Returns:
      (lower, upper) with 0 ≤ lower ≤ Â ≤ upper ≤ 1.
    """
    confidence = check.open_unit("confidence", confidence)
    in_scores, out_scores = _scores(in_scores, out_scores)
    n_in, n_out = in_scores.size, out_scores.size
    estimate = auc(in_scores, out_scores)
    z = scipy.stats.norm.isf((1.0 - confidence) / 2.0)

    def excess(theta):  # > 0 outside the interval, < 0 strictly inside it
        return (estimate - theta) ** 2 - z**2 * _newcombe_variance(theta, n_in, n_out)

    # Step off Â by a relative hair: excess(Â) = 0 when Â ∈ {0, 1} (V vanishes there), and the
    # root wanted is the other one. Between the hair and the end point (0 or 1) excess changes sign.
    hair = 1e-12
    inner_below = estimate - hair * max(estimate, hair)
    inner_above = estimate + hair * max(1.0 - estimate, hair)
    lower = 0.0
    if estimate > 0.0 and excess(inner_below) < 0.0:
        lower = scipy.optimize.brentq(excess, 0.0, inner_below, xtol=1e-14)
    upper = 1.0
    if estimate < 1.0 and excess(inner_above) < 0.0:
        upper = scipy.optimize.brentq(excess, inner_above, 1.0, xtol=1e-14)
    return float(lower), float(upper)


def model_bootstrap_auc_interval(
    scores, membership, confidence: float = 0.95, resamples: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """Percentile interval of the pooled AUC from resampling models (rows) with replacement.

    A resample draws n_models row indices with replacement; its AUC is the Mann-Whitney AUC of the IN
    against the OUT scores of the drawn rows, each row counted as often as it is drawn (computed with
    row weights, so no copy of the scores is made). Every row must hold at least one IN and one OUT
    score (the all-examples design), so every resample has both. With few models the percentile
    interval is too narrow (4 models have 35 distinct resamples; in the simulation of
    tests/test_attacks_metrics.py 32 models cover at about the nominal 95%).

    Args:
      scores: (n_models, n_targets) finite scores, higher = more likely IN.
      membership: (n_models, n_targets) bool, True where the target was IN for that model.
      confidence: two-sided level of the percentile interval, in (0, 1).
      resamples: number of bootstrap resamples, ≥ 100.
      seed: seed of the `numpy.random.Generator` that draws the resamples.

    Returns:
      (lower, upper): the (1-confidence)/2 and (1+confidence)/2 quantiles of the resampled AUCs.

    Raises:
      InvalidArgument: shapes differ or are not 2-D, fewer than 2 models, a score is NaN or infinite,
        a model without an IN or without an OUT score, fewer than 100 resamples, or a bad level/seed.
    """
    confidence = check.open_unit("confidence", confidence)
    resamples = check.count("resamples", resamples, minimum=100)  # fewer leave the 2.5% quantile to 2 draws
    rng = np.random.default_rng(check.seed("seed", seed))
    scores, membership = np.asarray(scores, dtype=float), np.asarray(membership)
    if scores.ndim != 2 or scores.shape != membership.shape or membership.dtype != bool:
        raise InvalidArgument(
            f"scores and membership must be (models, targets) arrays of one shape, membership bool; got shapes"
            f" {scores.shape} and {membership.shape} ({membership.dtype})."
        )
    n_models = scores.shape[0]
    if n_models < 2:
        raise InvalidArgument(f"a model-level bootstrap needs at least 2 models; got {n_models}.")
    if not np.isfinite(scores).all():
        raise InvalidArgument("scores must be finite; found a NaN or infinite score.")
    if not (membership.any(axis=1) & (~membership).any(axis=1)).all():
        raise InvalidArgument(
            "every model needs at least one IN and one OUT score (the all-examples design); a row has only one kind."
        )
    # Ranks of the distinct values once; a resample only changes how much each row's scores weigh.
    _, value_index = np.unique(scores.ravel(), return_inverse=True)
    n_values = int(value_index.max()) + 1
    value_index = value_index.reshape(scores.shape)
    rows = np.broadcast_to(np.arange(n_models)[:, np.newaxis], scores.shape)
    in_rows, in_values = rows[membership], value_index[membership]
    out_rows, out_values = rows[~membership], value_index[~membership]
    aucs = np.empty(resamples)
    for draw in range(resamples):
        weight = np.bincount(rng.integers(0, n_models, n_models), minlength=n_models).astype(float)
        in_mass = np.bincount(in_values, weights=weight[in_rows], minlength=n_values)
        out_mass = np.bincount(out_values, weights=weight[out_rows], minlength=n_values)
        out_below = np.cumsum(out_mass) - out_mass  # OUT weight strictly below each distinct value
        wins = float(in_mass @ (out_below + 0.5 * out_mass))
        aucs[draw] = wins / (in_mass.sum() * out_mass.sum())
    alpha = 1.0 - confidence
    lower, upper = np.quantile(aucs, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(lower), float(upper)


def _balanced_accuracy(roc: RocCurve) -> float:
    return float(np.max(0.5 * (roc.tpr + 1.0 - roc.fpr)))


def balanced_accuracy(in_scores, out_scores) -> float:
    """Max over thresholds t of ½(TPR(t) + 1 - FPR(t)); 0.5 when the scores carry no signal."""
    return _balanced_accuracy(roc_curve(in_scores, out_scores))


def _check_fprs(fprs) -> tuple[float, ...]:
    if isinstance(fprs, numbers.Real):
        fprs = (fprs,)
    checked = tuple(float(f) for f in fprs)
    if not checked or any(not 0.0 < f <= 1.0 for f in checked):
        raise InvalidArgument(f"fprs must be a non-empty sequence of rates in (0, 1]; got {fprs!r}.")
    return checked


def tpr_at_fpr(
    in_scores, out_scores, fprs: Sequence[float] = (0.1, 0.01, 0.001), confidence: float = 0.95
) -> dict[float, tuple[float, tuple[float, float]]]:
    """Largest TPR among thresholds with FPR ≤ f, for each f in `fprs`, with its CP interval.

    The point (FPR, TPR) = (0, 0) of t = +inf always qualifies, so every f has an answer; with
    n_out OUT scores, targets below 1/n_out can only use thresholds with no false positive.

    Returns:
      {f: (tpr, (ci_lower, ci_upper))}, the interval two-sided Clopper-Pearson at `confidence`.
    """
    confidence = check.open_unit("confidence", confidence)
    return _tpr_at_fpr(roc_curve(in_scores, out_scores), _check_fprs(fprs), confidence)


def _tpr_at_fpr(
    roc: RocCurve, fprs: tuple[float, ...], confidence: float
) -> dict[float, tuple[float, tuple[float, float]]]:
    result = {}
    for target in fprs:
        # FPR ≤ f ⟺ FP ≤ f·n_out; compare counts to avoid rounding in FP/n_out.
        allowed = roc.false_positives <= target * roc.n_out
        true_positives = int(roc.true_positives[allowed].max())
        lower, upper = clopper_pearson_interval(true_positives, roc.n_in, confidence)
        result[target] = (true_positives / roc.n_in, (float(lower), float(upper)))
    return result


def summarize(
    in_scores, out_scores, fprs: Sequence[float] = (0.1, 0.01, 0.001), confidence: float = 0.95
) -> MembershipMetrics:
    """All metrics of one audit: AUC with CI, balanced accuracy, TPR at `fprs`, ROC.

    Args:
      in_scores: 1-D scores of IN trials (higher = member), finite, non-empty.
      out_scores: 1-D scores of OUT trials, finite, non-empty.
      fprs: FPR targets in (0, 1] for the TPR-at-FPR entries.
      confidence: level of the AUC interval and of the Clopper-Pearson TPR intervals.

    Raises:
      ValueError: a score array is empty, not 1-D or has a NaN/inf; or a bad `fprs`/`confidence`.
    """
    confidence = check.open_unit("confidence", confidence)
    fprs = _check_fprs(fprs)
    in_scores, out_scores = _scores(in_scores, out_scores)
    roc = roc_curve(in_scores, out_scores)
    tprs = _tpr_at_fpr(roc, fprs, confidence)
    return MembershipMetrics(
        auc=auc(in_scores, out_scores),
        auc_ci=auc_confidence_interval(in_scores, out_scores, confidence),
        balanced_accuracy=_balanced_accuracy(roc),
        tpr_at_fpr={f: tpr for f, (tpr, _) in tprs.items()},
        tpr_at_fpr_ci={f: interval for f, (_, interval) in tprs.items()},
        roc=(_read_only(roc.fpr), _read_only(roc.tpr)),
        n_in=roc.n_in,
        n_out=roc.n_out,
        confidence=confidence,
    )

"""From an analytic privacy guarantee to the best any attack can do, and the audit verdict.

docs/theory.md §3.6-3.7, "Theory vs audit". If a mechanism is (ε, δ)-DP for the neighbouring pair, every
membership test has (Kairouz, Oh & Viswanath 2015, Thm. 2.1; Dong, Roth & Su 2022)

    TPR ≤ min(e^ε FPR + δ,  1 - e^{-ε}(1 - δ - FPR))          (clipped to [0, 1]),

the first from the DP inequality on the rejection region, the second from the same inequality on
its complement. A privacy profile {(ε_k, δ_k)} holds for every pair at once, so the largest TPR is
the minimum of these curves over k: a concave, piecewise-linear curve, the lower envelope of the
lines  TPR = e^{ε_k} FPR + δ_k,  TPR = e^{-ε_k} FPR + 1 - e^{-ε_k}(1 - δ_k)  and  TPR = 1.
The largest AUC is its integral over FPR ∈ [0, 1], computed exactly from the envelope's pieces.
A pair with ε = inf (a bound that does not apply, docs/theory.md §0) constrains nothing.

For the Gaussian mechanism with μ = Δ/σ, the full profile δ(ε) = Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ - μ/2)
gives back its tradeoff curve 1 - Φ(Φ⁻¹(1 - FPR) - μ), whose AUC is Φ(μ/√2); a single (ε, δ)
gives a looser curve and a larger AUC.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Literal

import numpy as np

from accountants import validation as check
from accountants.validation import InvalidArgument
from attacks.clopper_pearson import clopper_pearson_lower, clopper_pearson_upper
from attacks.epsilon import EpsilonLowerBound, GridThresholds, PresetThresholds, simultaneous_bounds

Outcome = Literal["consistent", "violated", "inconclusive"]
_GRID = GridThresholds()  # the Clopper-Pearson ε bound's default thresholds


def _as_profile(privacy_profile) -> tuple[np.ndarray, np.ndarray]:
    """(epsilons, deltas) of a single (ε, δ) pair or an array of pairs, shape (P, 2)."""
    try:
        pairs = np.atleast_2d(np.asarray(privacy_profile, dtype=np.float64))
    except (TypeError, ValueError):
        raise InvalidArgument(
            f"privacy_profile must be an (ε, δ) pair or a sequence of pairs; got {privacy_profile!r}."
        ) from None
    if pairs.ndim != 2 or pairs.shape[1] != 2 or pairs.shape[0] == 0:
        raise InvalidArgument(
            f"privacy_profile must be an (ε, δ) pair or an array of shape (P, 2) with P ≥ 1; got shape {pairs.shape}."
        )
    epsilons, deltas = pairs[:, 0], pairs[:, 1]
    if np.any(np.isnan(pairs)) or np.any(epsilons < 0.0):
        raise InvalidArgument("privacy_profile ε values must be ≥ 0 (inf allowed) and not NaN.")
    if np.any(deltas < 0.0) or np.any(deltas > 1.0):
        raise InvalidArgument("privacy_profile δ values must lie in [0, 1].")
    return epsilons, deltas


def _envelope_lines(epsilons: np.ndarray, deltas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Slopes and intercepts of every line bounding TPR as a function of FPR (finite slopes)."""
    applies = np.isfinite(epsilons)
    epsilons, deltas = epsilons[applies], deltas[applies]
    with np.errstate(over="ignore"):
        steep = np.exp(epsilons)
    shallow = np.exp(-epsilons)
    # A slope e^ε that overflows only matters at FPR = 0 (TPR ≤ δ there), a null set for the AUC.
    keep = np.isfinite(steep)
    slopes = np.concatenate([steep[keep], shallow, [0.0]])
    intercepts = np.concatenate([deltas[keep], 1.0 - shallow * (1.0 - deltas), [1.0]])
    return slopes, intercepts


def max_tpr_at_fpr(fpr, privacy_profile) -> np.ndarray:
    """Largest TPR any attack can reach at each FPR under the given (ε, δ) guarantee(s).

    Args:
      fpr: FPR value(s) in [0, 1] (scalar or array).
      privacy_profile: one (ε, δ) pair or an array of shape (P, 2) of pairs that all hold.

    Returns:
      Array shaped like `fpr`: min over pairs of min(e^ε FPR + δ, 1 - e^{-ε}(1 - δ - FPR)),
      clipped to [0, 1].
    """
    fpr = np.asarray(fpr, dtype=np.float64)
    if np.any(np.isnan(fpr)) or np.any(fpr < 0.0) or np.any(fpr > 1.0):
        raise InvalidArgument(f"fpr must lie in [0, 1]; got {fpr!r}.")
    epsilons, deltas = _as_profile(privacy_profile)
    applies = np.isfinite(epsilons)
    epsilons, deltas = epsilons[applies], deltas[applies]
    x = fpr[..., np.newaxis]
    with np.errstate(over="ignore", invalid="ignore"):
        # At FPR = 0 the first bound is δ for every finite ε, even where e^ε overflows (inf·0).
        first = np.where(x > 0.0, np.exp(epsilons) * x + deltas, deltas)
    second = 1.0 - np.exp(-epsilons) * (1.0 - deltas - x)
    bound = np.minimum(first, second).min(axis=-1, initial=1.0)
    return np.clip(bound, 0.0, 1.0)


def max_auc(privacy_profile) -> float:
    """Largest AUC any attack can reach: ∫₀¹ max_tpr_at_fpr(x) dx, integrated exactly.

    The bound is the lower envelope of lines (module docstring); it is built with the convex-hull
    trick (lines by decreasing slope, each dropped once a later line undercuts it everywhere it was
    lowest) and integrated piece by piece in closed form.
    """
    slopes, intercepts = _envelope_lines(*_as_profile(privacy_profile))
    # Decreasing slope; among equal slopes only the lowest line can be on the envelope.
    order = np.lexsort((intercepts, -slopes))
    hull: list[tuple[float, float]] = []
    for slope, intercept in zip(slopes[order], intercepts[order]):
        if hull and hull[-1][0] == slope:
            continue
        while len(hull) >= 2 and _undercut(hull[-2], hull[-1], (slope, intercept)):
            hull.pop()
        hull.append((float(slope), float(intercept)))

    area = 0.0
    left = 0.0
    for index, (slope, intercept) in enumerate(hull):
        right = 1.0
        if index + 1 < len(hull):
            next_slope, next_intercept = hull[index + 1]
            right = min((next_intercept - intercept) / (slope - next_slope), 1.0)
        if right > left:
            area += slope * (right**2 - left**2) / 2.0 + intercept * (right - left)
            left = right
    return float(area)


def _undercut(first, middle, last) -> bool:
    """True if `middle` is nowhere strictly below both neighbours (slopes first > middle > last).

    `middle` is lowest on (x_first∩middle, x_middle∩last); it is empty when the line from `first`
    meets `last` no later than it meets `middle`. Cross-multiplied, as both slope gaps are > 0.
    """
    (a1, b1), (a2, b2), (a3, b3) = first, middle, last
    return (b3 - b1) * (a1 - a2) <= (b2 - b1) * (a1 - a3)


@dataclasses.dataclass(frozen=True)
class ProfileTest:
    """The audit's ROC against the region a privacy profile allows, at simultaneous Clopper-Pearson bounds.

    Attributes:
      violated: at some threshold the bounds put (FPR_hi, TPR_lo) above the largest TPR the profile allows at
        FPR_hi; wrong with probability ≤ 1 - `confidence` if the mechanism satisfies the profile.
      margin: TPR_lo - max_tpr_at_fpr(FPR_hi) at the threshold where it is largest (> 0 iff violated).
      threshold: that threshold (IN iff score ≥ it).
      fpr_upper: FPR_hi there.
      tpr_lower: TPR_lo there.
      allowed_tpr: max_tpr_at_fpr(FPR_hi, profile) there.
      true_positives: #IN scores ≥ threshold (as bounded).
      false_positives: #OUT scores ≥ threshold (as bounded).
      n_in: IN trials.
      n_out: OUT trials.
      confidence: 1 - α of all the thresholds' bounds together.
      max_margin: the margin of a perfect attack (every IN above every OUT) with these trials: ≤ 0 means no attack
        could have refuted the profile.
    """

    violated: bool
    margin: float
    threshold: float
    fpr_upper: float
    tpr_lower: float
    allowed_tpr: float
    true_positives: int
    false_positives: int
    n_in: int
    n_out: int
    confidence: float
    max_margin: float


def profile_test(
    in_scores,
    out_scores,
    privacy_profile,
    confidence: float = 0.95,
    strategy: PresetThresholds = _GRID,
) -> ProfileTest:
    """Does the ROC of IN/OUT scores leave the region ``privacy_profile`` allows? (docs/theory.md §3.7).

    At each threshold t_k of ``strategy`` the simultaneous one-sided bounds TPR_lo ≤ TPR(t_k), FPR_hi ≥ FPR(t_k)
    (:func:`attacks.epsilon.simultaneous_bounds`, the intervals of the Clopper-Pearson ε bound) are set against
    the profile's largest TPR, which increases with FPR: if every pair (ε_k, δ_k) holds, then
    TPR_lo ≤ TPR ≤ max_tpr_at_fpr(FPR) ≤ max_tpr_at_fpr(FPR_hi) at every threshold unless a bound failed. So
    ``violated`` errs with probability ≤ 1 - ``confidence``. The envelope includes the complement inequality
    TNR ≤ e^ε FNR + δ, so both directions of the Clopper-Pearson bound are covered; with the single pair (ε, δ)
    the test is violated exactly when `clopper_pearson_epsilon` at the same strategy exceeds ε.

    Args:
      in_scores: 1-D scores of independent IN trials (higher = member).
      out_scores: 1-D scores of independent OUT trials.
      privacy_profile: one (ε, δ) pair or an array (P, 2) of pairs the mechanism claims all at once.
      confidence: 1 - α of the whole test.
      strategy: the thresholds (default: the Clopper-Pearson bound's geometric grid).
    """
    check.open_unit("confidence", confidence)
    _as_profile(privacy_profile)
    bounds = simultaneous_bounds(in_scores, out_scores, confidence, strategy)
    allowed = max_tpr_at_fpr(bounds.fpr_upper, privacy_profile)
    margins = bounds.tpr_lower - allowed
    worst = int(np.argmax(margins))
    # A perfect attack's bounds at the same level: TPR_lo(n_in of n_in) and FPR_hi(0 of n_out). Every other
    # threshold has a smaller TPR_lo and a larger FPR_hi, so no attack's margin exceeds this one.
    perfect_tpr = float(clopper_pearson_lower(bounds.n_in, bounds.n_in, bounds.alpha_per_bound))
    perfect_fpr = float(clopper_pearson_upper(0, bounds.n_out, bounds.alpha_per_bound))
    return ProfileTest(
        violated=bool(margins[worst] > 0.0),
        margin=float(margins[worst]),
        threshold=float(bounds.thresholds[worst]),
        fpr_upper=float(bounds.fpr_upper[worst]),
        tpr_lower=float(bounds.tpr_lower[worst]),
        allowed_tpr=float(allowed[worst]),
        true_positives=int(bounds.true_positives[worst]),
        false_positives=int(bounds.false_positives[worst]),
        n_in=bounds.n_in,
        n_out=bounds.n_out,
        confidence=bounds.confidence,
        max_margin=perfect_tpr - float(max_tpr_at_fpr(perfect_fpr, privacy_profile)),
    )


@dataclasses.dataclass(frozen=True)
class AuditVerdict:
    """Does an audit contradict an analytic bound?

    Attributes:
      outcome: "violated", "consistent" or "inconclusive" (rule in `audit_verdict`).
      reason: one sentence with the numbers behind the outcome.
      empirical_epsilon: the empirical ε lower bound.
      analytic_epsilon: the analytic ε at the same δ (None if missing).
      delta: the δ of both.
      confidence: confidence of the empirical ε lower bound.
      max_certifiable_epsilon: the largest ε lower bound these trials could ever give.
      auc_lower: lower confidence limit of the attack's AUC (None if not used).
      max_allowed_auc: largest AUC the analytic guarantee allows (None if not used).
      profile: the ROC tested against the claimed privacy profile (None if not used).
    """

    outcome: Outcome
    reason: str
    empirical_epsilon: float
    analytic_epsilon: float | None
    delta: float
    confidence: float
    max_certifiable_epsilon: float
    auc_lower: float | None
    max_allowed_auc: float | None
    profile: ProfileTest | None


def audit_verdict(
    empirical: EpsilonLowerBound,
    analytic_epsilon: float | None,
    *,
    auc_lower: float | None = None,
    max_allowed_auc: float | None = None,
    profile: ProfileTest | None = None,
    claim: str = "the analytic guarantee",
) -> AuditVerdict:
    """Compares an audit with an analytic bound by these rules, applied in order.

    1. inconclusive: `analytic_epsilon` is None, NaN or +inf. There is no finite bound to test
       (a bound whose theorem does not apply reports ε = inf, docs/theory.md §0).
    2. violated: (if given) `profile.violated`, the ROC leaves the region the claimed privacy
       profile allows; the empirical ε lower bound > `analytic_epsilon`; or (if given)
       `auc_lower` > `max_allowed_auc`. The first two rest on the same simultaneous intervals
       (`profile_test` at the ε bound's strategy) and are wrong together with probability
       ≤ 1 - `empirical.confidence`; with the AUC route the error probabilities add (union bound),
       e.g. 0.05 + 0.025 for a 95% ε bound and the lower limit of a two-sided 95% AUC interval.
    3. inconclusive: `empirical.max_certifiable_epsilon` ≤ `analytic_epsilon` (with a profile:
       `profile.max_margin` ≤ 0). Even a perfect attack (every IN score above every OUT score)
       could not have refuted the claim with these trial counts and this confidence: the audit
       had no power; run more trials.
    4. consistent: otherwise. The audit could have shown a violation and did not; this does not
       prove the bound (only an absence of evidence against it).

    Args:
      empirical: result of `clopper_pearson_epsilon` or `gdp_epsilon`.
      analytic_epsilon: the analytic ε at δ = `empirical.delta`, for the same neighbouring
        relation as the audit's IN/OUT trials.
      auc_lower: lower limit of the attack's AUC confidence interval
        (`metrics.summarize(...).auc_ci[0]`).
      max_allowed_auc: `max_auc(profile)` of the analytic guarantee. Give both or neither.
      profile: `profile_test` of the same scores against the claimed profile (which should include
        the pair (`analytic_epsilon`, δ)), at the strategy and confidence of `empirical`.
      claim: what the profile is, for the reason: "... above the 0.23 {claim} allows".
    """
    if not isinstance(empirical, EpsilonLowerBound):
        raise InvalidArgument(
            "empirical must be an EpsilonLowerBound from clopper_pearson_epsilon or gdp_epsilon; "
            f"got {type(empirical).__name__}."
        )
    if (auc_lower is None) != (max_allowed_auc is None):
        raise InvalidArgument("auc_lower and max_allowed_auc go together: give both or neither.")
    for name, value in (("auc_lower", auc_lower), ("max_allowed_auc", max_allowed_auc)):
        if value is not None and not (isinstance(value, numbers.Real) and 0.0 <= value <= 1.0):
            raise InvalidArgument(f"{name} must be in [0, 1]; got {value!r}.")
    if analytic_epsilon is not None and (not isinstance(analytic_epsilon, numbers.Real) or analytic_epsilon < 0.0):
        raise InvalidArgument(f"analytic_epsilon must be ≥ 0, inf, NaN or None; got {analytic_epsilon!r}.")

    def verdict(outcome: Outcome, reason: str) -> AuditVerdict:
        return AuditVerdict(
            outcome=outcome,
            reason=reason,
            empirical_epsilon=empirical.epsilon,
            analytic_epsilon=None if analytic_epsilon is None else float(analytic_epsilon),
            delta=empirical.delta,
            confidence=empirical.confidence,
            max_certifiable_epsilon=empirical.max_certifiable_epsilon,
            auc_lower=auc_lower,
            max_allowed_auc=max_allowed_auc,
            profile=profile,
        )

    at = f"at δ = {empirical.delta:g}"
    if analytic_epsilon is None or math.isnan(analytic_epsilon) or math.isinf(analytic_epsilon):
        return verdict("inconclusive", f"no finite analytic ε {at} to test against.")
    if profile is not None and profile.violated:
        return verdict(
            "violated",
            f"at FPR ≤ {profile.fpr_upper:.3g} the attack reaches TPR ≥ {profile.tpr_lower:.3g} "
            f"({profile.confidence:.0%} simultaneous bounds), above the {profile.allowed_tpr:.3g} {claim} allows.",
        )
    if empirical.epsilon > analytic_epsilon:
        return verdict(
            "violated",
            f"empirical ε ≥ {empirical.epsilon:.4g} ({empirical.confidence:.0%} confidence) "
            f"exceeds the analytic ε = {analytic_epsilon:.4g} {at}.",
        )
    if auc_lower is not None and auc_lower > max_allowed_auc:
        return verdict(
            "violated",
            f"the AUC's lower confidence limit {auc_lower:.4g} exceeds the largest AUC "
            f"{max_allowed_auc:.4g} the analytic guarantee allows.",
        )
    if profile is not None and profile.max_margin <= 0.0:
        return verdict(
            "inconclusive",
            f"with {profile.n_in} + {profile.n_out} trials even a perfect attack stays inside the region "
            f"{claim} allows; run more trials.",
        )
    if profile is None and empirical.max_certifiable_epsilon <= analytic_epsilon:
        return verdict(
            "inconclusive",
            f"with {empirical.n_in} + {empirical.n_out} trials even a perfect attack certifies at "
            f"most ε = {empirical.max_certifiable_epsilon:.4g}, not above the analytic "
            f"ε = {analytic_epsilon:.4g} {at}; run more trials.",
        )
    if profile is not None:
        return verdict(
            "consistent",
            f"at every threshold the ROC stays inside the region {claim} allows ({profile.confidence:.0%} "
            f"simultaneous bounds), which these trials could have left; empirical ε ≥ {empirical.epsilon:.4g} ≤ "
            f"the analytic ε = {analytic_epsilon:.4g} {at}.",
        )
    return verdict(
        "consistent",
        f"empirical ε ≥ {empirical.epsilon:.4g} does not exceed the analytic ε = "
        f"{analytic_epsilon:.4g} {at}, which these trials could have refuted "
        f"(up to ε = {empirical.max_certifiable_epsilon:.4g}).",
    )

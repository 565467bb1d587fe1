"""Audit a mechanism by sampling its release; compare the audit with the analytic bounds (the one place for verdicts).

The auditor fixes a neighbouring pair (V, V') (:mod:`dpaudit.release_audit.releases`), draws the release N times
under each input, scores every draw with the best attack it can compute, and turns the scores into evidence:

* **Attack scores** (higher = more likely drawn under V, the "IN" side):

  - exact log-likelihood ratio ``L = log p(y)/q(y)`` where the release density is known
    (:func:`log_likelihood_ratio`): the Gaussian mechanism; the vector Wishart release by [W] Lemma 9 with the
    exponent ``(r-d-1)/2`` derived in docs/theory.md §2.4, ``L = (d+1-r)/2 ln A + B/2 (1/A - 1)``; the Gaussian sketch,
    whose columns are i.i.d. ``N(0, sigma_A^2 Q Q^T + sigma_g^2 I)`` ([S] App. D.1). ``L = +inf`` marks a
    draw outside the other input's support. By Neyman-Pearson no test of the same level beats L;
  - a learned distinguisher (scikit-learn gradient boosting) for M1/M2, trained on draws independent of the
    ones it is scored on, reading the maximal invariant of the release (which loses nothing, see
    :class:`~dpaudit.release_audit.releases._MatrixRelease`);
  - a support certificate for the noise-free matrix projection ([W] Prop. 2): ``V^T Y`` is symmetric for
    every ``Y = M V`` (``V^T M V``, M symmetric) and, under V', equals ``V^T M V'``, symmetric with probability
    0 ([W] Lemma 11). All draws under V in the event and none under V' is the evidence of "not DP".

* **Two routes to an audited epsilon**, reported side by side:

  (a) a statistically valid lower bound from the attack scores, :func:`attacks.epsilon.clopper_pearson_epsilon`
      (the Gaussian-DP route is shown too, but it assumes a Gaussian-shaped tradeoff curve and can exceed the
      true epsilon for other mechanisms: it never enters a verdict). With N draws per side it can certify at
      most about ``ln(N / ln(1/alpha))``;
  (b) for exact likelihood ratios, the empirical privacy profile (:func:`estimate_profile`)
      ``delta_hat(eps) = max(E_P[(1 - e^{eps-L})_+], E_Q[(1 - e^{eps+L})_+])`` with the mass of infinite
      losses included, an estimate of the true profile with an empirical-Bernstein confidence band, inverted
      at the target delta. It is unbiased for the true epsilon, not a lower bound; its band is a confidence
      interval for it. A necessary check that L really is ``log dP/dQ`` comes with it
      (:class:`ChangeOfMeasureCheck`).

* **Comparison** (:func:`compare`): every analytic bound at the same delta is tested with
  :func:`attacks.tradeoff.audit_verdict` (route a, plus the AUC route against
  :func:`attacks.tradeoff.max_auc`), and against the lower end of route (b)'s band. The audit's outcome is
  ``"not DP"`` (support certificate), ``"violated"`` (some bound refuted), ``"consistent"`` (the audit could
  have refuted a bound and did not), or ``"inconclusive"``.

What is particular to one release (its exact likelihood ratio, support certificate, bounds, exact profile and
reported parameters) is its entry in :data:`dpaudit.release_audit.kinds.RELEASES`; this module dispatches on the
release's type through that table and names no release.

Every random draw comes from ``numpy.random.default_rng([seed, stream])`` with the fixed streams of
``_STREAMS``. numpy/scipy only (scikit-learn is imported for M1/M2 audits only); no torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from accountants import validation as check
from accountants._montecarlo import SortedLosses, invert
from accountants.jsondata import json_safe
from accountants.result import Bound
from accountants.validation import InvalidArgument
from attacks.epsilon import (
    BonferroniThresholds,
    EpsilonLowerBound,
    SplitThreshold,
    clopper_pearson_epsilon,
    gdp_epsilon,
)
from attacks.metrics import summarize
from attacks.tradeoff import audit_verdict, max_auc
from dpaudit.release_audit.kinds import RELEASES, kind_of
from dpaudit.release_audit.releases import drawn_numbers

Outcome = Literal["consistent", "violated", "inconclusive", "not DP"]

# Stable stream ids under the audit seed; the pair constructors use stream 0.
_STREAMS = {"V": 1, "V'": 2, "train V": 3, "train V'": 4, "classifier": 5, "exact profile": 6, "threshold": 7}

# Bonferroni over every threshold costs one Beta quantile per candidate (~9 microseconds each); above this many
# draws per side the threshold is chosen on a seeded 10% split instead (attacks.epsilon.SplitThreshold).
_BONFERRONI_LIMIT = 50_000
_SELECTION_FRACTION = 0.1
# Random numbers an audit may draw: sampling full releases runs at about 10^7 numbers a second on one core, so this
# is about ten minutes. More is refused rather than left running without an end in sight ([W]'s matrices at
# d = 10^5 and the default 10^5 releases would take days).
MAX_DRAWN_NUMBERS = 2**33


def _rng(seed: int, purpose: str) -> np.random.Generator:
    return np.random.default_rng([seed, _STREAMS[purpose]])


def _seed_int(seed: int, purpose: str) -> int:
    """An integer seed for APIs that take one (accountants' Monte Carlo, scikit-learn), derived like :func:`_rng`."""
    return int(np.random.SeedSequence([seed, _STREAMS[purpose]]).generate_state(1)[0] >> 1)


# ---------------------------------------------------------------------------------------------- scores


def log_likelihood_ratio(mechanism, statistic: np.ndarray) -> np.ndarray:
    """Exact ``L = log p(y)/q(y)`` (p: release law under V, q: under V') from the release statistic T(y).

    * Gaussian: ``L = (|v'|^2 - |v|^2 - 2T) / (2 sigma^2)``, ``T = <y, v' - v>``.
    * Vector Wishart, ``T = (s, s', |y|^2) = (v^T y, v'^T y, |y|^2)``: [W] Lemma 9 gives
      ``p(y) = C (v^T y)^{(r-d-1)/2} exp(-r |y|^2 / (2 v^T y))`` on ``{v^T y > 0}`` (sigma^2 = 1/r; the
      paper's Eqs. 22/25 print the exponent (r-d+1)/2, docs/theory.md §2.4), hence
      ``L = (r-d-1)/2 (ln s - ln s') - r |y|^2 / 2 (1/s - 1/s') = (d+1-r)/2 ln A + B/2 (1/A - 1)``
      with ``A = s'/s``, ``B = r|y|^2/s`` ([W] Eq. 18); ``+inf`` where ``s > 0 >= s'`` (outside q's
      support), ``-inf`` where ``s' > 0 >= s``.
    * Gaussian sketch: ``L = -T/2 - (r/2) ln(det Sigma_V / det Sigma_V')``, ``T = sum_k y_k^T D y_k``.

    Each formula is the ``log_likelihood_ratio`` of the release's :class:`~dpaudit.release_audit.kinds.ReleaseKind`.
    """
    statistic = np.asarray(statistic, float)
    kind = kind_of(mechanism)
    if kind is None or kind.log_likelihood_ratio is None:
        raise InvalidArgument(
            f"no closed-form likelihood ratio for {type(mechanism).__name__}; audit it with a learned distinguisher"
        )
    return kind.log_likelihood_ratio(mechanism, statistic)


def learned_distinguisher_scores(
    mechanism, samples: int, training_samples: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Scores of a gradient-boosted classifier trained to tell V's releases from V''s, on its own draws.

    Training uses streams ``"train V"``/``"train V'"``, scoring ``"V"``/``"V'"``: the evaluation draws are
    independent of the fitted model, so the scores are i.i.d. draws of a fixed test statistic and the
    Clopper-Pearson bound on them is valid. Features: :meth:`statistic` of the release (the maximal invariant
    for matrix releases). Score: the classifier's decision function (log-odds of V).
    """
    from sklearn.ensemble import HistGradientBoostingClassifier  # scikit-learn is slow to import

    train = [mechanism.sample_statistic(_rng(seed, f"train {side}"), training_samples, side) for side in ("V", "V'")]
    classifier = HistGradientBoostingClassifier(
        max_iter=300, learning_rate=0.1, early_stopping=True, random_state=_seed_int(seed, "classifier")
    )
    classifier.fit(np.vstack(train), np.repeat([1, 0], training_samples))
    return tuple(
        classifier.decision_function(mechanism.sample_statistic(_rng(seed, side), samples, side))
        for side in ("V", "V'")
    )


def _finite(in_scores: np.ndarray, out_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Infinite losses mapped just beyond the finite range: monotone, so every threshold test is unchanged."""
    finite = np.concatenate([in_scores[np.isfinite(in_scores)], out_scores[np.isfinite(out_scores)]])
    low, high = (finite.min() - 1, finite.max() + 1) if finite.size else (-1.0, 1.0)
    return tuple(np.clip(scores, low, high) for scores in (in_scores, out_scores))


# ---------------------------------------------------------------------------------------------- profile


@dataclass(frozen=True, eq=False)
class ProfileEstimate:
    """Empirical privacy profile from exact privacy-loss draws (docs/theory.md §2.4, for any mechanism).

    ``delta(eps) = max(delta_PQ(eps), delta_QP(eps))`` with ``delta_PQ(eps) = P(L = +inf) + E_P[(1 - e^{eps-L})_+ ;
    L < inf]`` (the hockey-stick divergence written under P, e.g. [W] Thm 1's proof) and ``delta_QP`` the same
    for ``-L`` under Q. Each direction is a mean of [0, 1]-valued draws; its band is the empirical Bernstein
    band of :class:`accountants._montecarlo.SortedLosses` at level ``1 - (1 - confidence)/2``, so that both
    bands, and the band of their maximum, hold together with probability >= ``confidence``.
    """

    forward: SortedLosses
    backward: SortedLosses
    confidence: float

    def bands(self, epsilon: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(estimate, lower, upper) of delta at each epsilon."""
        return tuple(np.maximum(a, b) for a, b in zip(self.forward.bands(epsilon), self.backward.bands(epsilon)))

    def delta(self, epsilon: float) -> tuple[float, float, float]:
        estimate, lower, upper = self.bands(np.array([float(epsilon)]))
        return float(estimate[0]), float(lower[0]), float(upper[0])

    def epsilon(self, delta: float) -> tuple[float, float, float]:
        """(estimate, lower, upper) of eps(delta) by test inversion of the bands (inf where delta is out of reach)."""
        grid = np.union1d(self.forward.grid(), self.backward.grid())
        return invert(self.bands, delta, grid)


def estimate_profile(in_losses, out_losses, confidence: float = 0.95) -> ProfileEstimate:
    """:class:`ProfileEstimate` from L at draws under V (``in_losses``, +inf allowed) and V' (-inf allowed)."""
    in_losses, out_losses = np.asarray(in_losses, float), np.asarray(out_losses, float)
    confidence = check.open_unit("confidence", confidence)
    if np.isnan(in_losses).any() or np.isneginf(in_losses).any():
        raise InvalidArgument("in_losses must be > -inf and not NaN (a draw under V lies in V's support)")
    if np.isnan(out_losses).any() or np.isposinf(out_losses).any():
        raise InvalidArgument("out_losses must be < +inf and not NaN (a draw under V' lies in V''s support)")
    each = 1 - (1 - confidence) / 2
    forward = SortedLosses(in_losses[np.isfinite(in_losses)], int(np.isposinf(in_losses).sum()), each)
    backward = SortedLosses(-out_losses[np.isfinite(out_losses)], int(np.isneginf(out_losses).sum()), each)
    return ProfileEstimate(forward, backward, confidence)


@dataclass(frozen=True)
class ChangeOfMeasureCheck:
    """``E_P[e^{-L}; L > 0] = Q(L > 0)`` and ``E_Q[e^{L}; L < 0] = P(L < 0)``, compared as z-scores.

    Both identities hold when L is ``log dP/dQ`` (change of measure on the event where the integrand lives), so a
    wrong density breaks them: with the exponent printed in [W] Eqs. 22/25 the vector release gives |z| of 40 to
    90 at 10^6 draws (d = 6..20). Restricting to ``L > 0`` keeps every integrand in [0, 1], so the standard errors
    are honest (the unrestricted ``E_P[e^{-L}]`` is heavy-tailed). Necessary, not sufficient; read |z| > 4 as a
    failure.
    """

    forward_mean: float
    forward_expected: float
    forward_z: float
    backward_mean: float
    backward_expected: float
    backward_z: float


def change_of_measure_check(in_losses: np.ndarray, out_losses: np.ndarray) -> ChangeOfMeasureCheck:
    """:class:`ChangeOfMeasureCheck` from L at draws under V (``in_losses``) and under V' (``out_losses``)."""

    def side(own: np.ndarray, other: np.ndarray) -> tuple[float, float, float]:
        # Mean of e^{-own} on {0 < own < inf} against the frequency of {other < 0}: forward own = L under P and
        # other = -L under Q; backward own = -L under Q and other = L under P.
        weights = np.where(np.isfinite(own) & (own > 0), np.exp(-np.abs(np.where(np.isfinite(own), own, 0.0))), 0.0)
        target = (other < 0).astype(float)
        errors = [x.std(ddof=1) / math.sqrt(x.size) for x in (weights, target)]
        error = math.hypot(*errors)
        mean, expected = float(weights.mean()), float(target.mean())
        return mean, expected, (mean - expected) / error if error > 0 else 0.0

    return ChangeOfMeasureCheck(*side(in_losses, -out_losses), *side(-out_losses, in_losses))


# ---------------------------------------------------------------------------------------------- bounds


def analytic_bounds(mechanism, delta: float, *, seed: int = 0) -> tuple[Bound, ...]:
    """The papers' (eps, delta) bounds for this mechanism and pair, at ``delta`` (replace-one neighbours).

    Monte-Carlo bounds (M2's mixture bound) draw from the ``"exact profile"`` stream of ``seed``.
    """
    kind = kind_of(mechanism)
    if kind is None:
        raise InvalidArgument(f"unknown mechanism {type(mechanism).__name__}")
    return kind.analytic_bounds(mechanism, delta, _seed_int(seed, "exact profile"))


def exact_profile(
    mechanism, delta: float, *, samples: int = 10**6, seed: int = 0, confidence: float = 0.99
) -> Bound | None:
    """The exact (or, for M2, the mixture) eps(delta), where one is available; None otherwise.

    Gaussian: Balle-Wang closed form. Vector Wishart: [W] Lemma 8 Monte Carlo (accountants, its own seed
    stream). Sketch with a rank-one covariance change: the chi-square closed form of
    :func:`dpaudit.release_audit.kinds._sketch_profile_delta`. M2's mixture bound is listed among the bounds (it is
    the exact profile of the release together with M, an upper bound for the release alone).
    """
    kind = kind_of(mechanism)
    if kind is None or kind.exact_profile is None:
        return None
    return kind.exact_profile(mechanism, delta, samples, _seed_int(seed, "exact profile"), confidence)


# ---------------------------------------------------------------------------------------------- comparison


@dataclass(frozen=True)
class SupportEvidence:
    """How the attack separated the supports: the event ``E = {defect <= tolerance}`` for a statistic's defect."""

    statistic: str
    tolerance: float
    largest_under_v: float
    smallest_under_v_prime: float
    in_event_under_v: int
    in_event_under_v_prime: int
    draws: int

    @property
    def disjoint(self) -> bool:
        """Every draw under V in E and none under V': P(E) = 1, Q(E) = 0 on the evidence."""
        return self.in_event_under_v == self.draws and self.in_event_under_v_prime == 0


@dataclass(frozen=True)
class BoundComparison:
    """One analytic bound against the audit.

    Attributes:
      bound: the analytic bound (its ``epsilon`` is at the audit's delta).
      outcome: ``"violated"``, ``"consistent"`` or ``"inconclusive"``.
      route: which evidence decided: ``"clopper-pearson"`` (incl. the AUC route), ``"profile"``, ``"support"``.
      reason: one sentence with the numbers.
      ratio_to_exact: bound eps / exact-profile eps (None when either is missing or 0).
      ratio_to_audit: bound eps / audited eps (route b where available, else route a).
    """

    bound: Bound
    outcome: Literal["consistent", "violated", "inconclusive"]
    route: str
    reason: str
    ratio_to_exact: float | None
    ratio_to_audit: float | None


def _ratio(numerator: float, denominator: float | None) -> float | None:
    if denominator is None or not denominator > 0 or not math.isfinite(denominator):
        return None
    return numerator / denominator


def compare(
    bound: Bound,
    empirical: EpsilonLowerBound,
    auc_lower: float,
    *,
    profile_epsilon: tuple[float, float, float] | None = None,
    support: SupportEvidence | None = None,
    exact_epsilon: float | None = None,
) -> BoundComparison:
    """Test one analytic bound with the audit's evidence (the rule of the module docstring).

    A Monte-Carlo bound is tested at the upper end of its own interval (conservative). Support evidence of
    disjoint supports refutes every finite (eps, delta < 1). Otherwise the Clopper-Pearson bound and the AUC's
    lower confidence limit go through :func:`attacks.tradeoff.audit_verdict`, and route (b) refutes the bound
    when the lower end of its band exceeds the bound's eps.
    """
    audited = profile_epsilon[0] if profile_epsilon is not None else empirical.epsilon
    ratios = dict(ratio_to_exact=_ratio(bound.epsilon, exact_epsilon), ratio_to_audit=_ratio(bound.epsilon, audited))
    if not bound.valid:
        return BoundComparison(
            bound, "inconclusive", "none", f"{bound.source} gives no finite eps: {bound.reason}", **ratios
        )
    tested = bound.epsilon_interval[1] if bound.epsilon_interval else bound.epsilon
    if support is not None and support.disjoint:
        return BoundComparison(
            bound,
            "violated",
            "support",
            f"{bound.source} allows eps = {tested:.4g} at delta = {bound.delta:g}, but an event has probability 1 "
            f"under V and 0 under V' ({support.draws} draws each), so no eps works for delta < 1.",
            **ratios,
        )
    verdict = audit_verdict(empirical, tested, auc_lower=auc_lower, max_allowed_auc=max_auc((tested, bound.delta)))
    if verdict.outcome != "violated" and profile_epsilon is not None and profile_epsilon[1] > tested:
        return BoundComparison(
            bound,
            "violated",
            "profile",
            f"the estimated profile's eps({bound.delta:g}) >= {profile_epsilon[1]:.4g} (lower end of its band) "
            f"exceeds {bound.source}'s eps = {tested:.4g}.",
            **ratios,
        )
    return BoundComparison(bound, verdict.outcome, "clopper-pearson", f"{bound.source}: {verdict.reason}", **ratios)


def _overall(comparisons: tuple[BoundComparison, ...], support: SupportEvidence | None) -> tuple[Outcome, str]:
    if support is not None and support.disjoint:
        return "not DP", (
            f"{support.statistic}: every one of {support.draws} draws under V lies in the event "
            f"(largest defect {support.largest_under_v:.2g} <= {support.tolerance:g}) and none under V' "
            f"(smallest {support.smallest_under_v_prime:.2g}); the supports are disjoint ([W] Prop. 2), "
            "so the mechanism is not (eps, delta)-DP for any eps and delta < 1."
        )
    violated = [c for c in comparisons if c.outcome == "violated"]
    if violated:
        return "violated", " ".join(c.reason for c in violated)
    consistent = [c.bound.source for c in comparisons if c.outcome == "consistent"]
    if consistent:
        return "consistent", "the audit could have refuted, and did not refute: " + "; ".join(consistent) + "."
    return "inconclusive", "no bound could be tested: " + " ".join(c.reason for c in comparisons)


# ---------------------------------------------------------------------------------------------- audit


@dataclass(frozen=True)
class ProfileSummary:
    """Route (b): the estimated eps(delta) with its band, and delta_hat at each bound's eps."""

    epsilon: tuple[float, float, float]
    delta_at: tuple[tuple[str, float, tuple[float, float, float]], ...]
    change_of_measure: ChangeOfMeasureCheck


@dataclass(frozen=True)
class MechanismAudit:
    """Everything an audit of one mechanism and pair found (see the module docstring).

    Attributes:
      mechanism: the release's name in :data:`dpaudit.release_audit.kinds.RELEASES` (``"gaussian"``,
        ``"wishart-vector"``, ``"wishart-m1"``, ``"wishart-m2"``, ``"sketch"``, ``"projection"`` built in).
      parameters: the mechanism's and the pair's parameters, measured from the arrays.
      delta, confidence, samples, seed: the audit's settings (``samples`` draws per side are scored).
      attack: what produced the scores.
      bounds: analytic bounds at delta; exact_profile: the exact eps(delta), when available.
      clopper_pearson, gaussian_dp: route (a); only the first enters verdicts.
      auc, auc_interval: attack AUC with its ``confidence`` interval (Newcombe).
      profile: route (b) for exact-likelihood-ratio attacks, else None.
      support: the support certificate for the noise-free projection, else None.
      comparisons: every bound (and the exact profile) against the audit.
      outcome, reason: the audit's verdict.
    """

    mechanism: str
    parameters: Mapping[str, Any]
    delta: float
    confidence: float
    samples: int
    seed: int
    attack: str
    bounds: tuple[Bound, ...]
    exact_profile: Bound | None
    clopper_pearson: EpsilonLowerBound
    gaussian_dp: EpsilonLowerBound
    auc: float
    auc_interval: tuple[float, float]
    profile: ProfileSummary | None
    support: SupportEvidence | None
    comparisons: tuple[BoundComparison, ...]
    outcome: Outcome
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: bounds by :meth:`Bound.to_dict`, inf and nan as strings (:mod:`accountants.jsondata`)."""
        summary = json_safe({field.name: getattr(self, field.name) for field in dataclasses.fields(self)})
        for name in ("clopper_pearson", "gaussian_dp"):  # name the threshold strategy (Bonferroni has no fields)
            strategy = getattr(self, name).strategy
            summary[name]["strategy"] = dict(kind=type(strategy).__name__, **summary[name]["strategy"])
        # The keys `dpaudit audit --json` uses for the same numbers (dpaudit.reporting.summary.summary): one key set.
        summary["verdict"], summary["verdict_reason"] = summary.pop("outcome"), summary.pop("reason")
        summary["epsilon_lower_bound"] = summary["clopper_pearson"]["epsilon"]
        summary["epsilon_lower_bound_max_certifiable"] = summary["clopper_pearson"]["max_certifiable_epsilon"]
        summary["epsilon_lower_bound_gdp"] = summary["gaussian_dp"]["epsilon"]
        return summary


def describe(mechanism) -> dict[str, Any]:
    """The parameters an audit reports for this mechanism and pair (measured from the arrays)."""
    kind = kind_of(mechanism)
    if kind is None:
        raise InvalidArgument(f"unknown mechanism {type(mechanism).__name__}")
    return kind.describe(mechanism)


def audit(
    mechanism,
    *,
    delta: float = 1e-3,
    samples: int = 100_000,
    seed: int = 0,
    confidence: float = 0.95,
    training_samples: int | None = None,
    full_releases: bool = False,
    max_random_numbers: int = MAX_DRAWN_NUMBERS,
) -> MechanismAudit:
    """Audit ``mechanism`` (a :mod:`dpaudit.release_audit.releases` mechanism holding its pair).

    Args:
      mechanism: the release to audit, holding its neighbouring pair.
      delta: the delta at which every epsilon is reported and compared.
      samples: releases scored per side.
      training_samples: releases per side the learned distinguisher trains on, besides the scored ones (default
        ``samples``).
      seed: root of every random stream of the audit.
      confidence: level of the Clopper-Pearson bound, of the AUC interval and of the profile band.
      max_random_numbers: the most random numbers the audit may draw (:data:`MAX_DRAWN_NUMBERS`, about ten minutes
        of one core); an audit that would draw more is refused before it starts.
      full_releases: score full releases instead of drawing the statistic from its law (exact either way; the
        full path is the slow cross-check). Matrix releases are always sampled in full.
    """
    check.one_of("mechanism", type(mechanism).__name__, [c.__name__ for c in RELEASES])
    kind = RELEASES[type(mechanism)]
    delta = check.open_unit("delta", delta)
    confidence = check.open_unit("confidence", confidence)
    seed = check.seed("seed", seed)
    samples = check.count("samples", samples, minimum=10)
    training_samples = check.count(
        "training_samples", samples if training_samples is None else training_samples, minimum=10
    )
    width = mechanism.sample_statistic(_rng(seed, "V"), 1, "V").shape[1]
    # per draw and side: the statistic, its scores and losses, and the sorted copies and ROC counts built from them
    check.allocation(f"{samples} releases per input", 2 * 8 * samples * (width + 24), "lower --samples")
    learned = kind.log_likelihood_ratio is None and kind.support is None
    if learned:
        check.allocation(
            f"{training_samples} training releases per input",
            2 * 8 * training_samples * (width + 8),
            "lower --training-samples",
        )
    max_random_numbers = check.count("--max-random-numbers", max_random_numbers)
    drawn = drawn_numbers(mechanism, 2 * (samples + (training_samples if learned else 0)), full_releases)
    if drawn > max_random_numbers:
        minutes = drawn / MAX_DRAWN_NUMBERS * 10
        raise InvalidArgument(
            f"{samples} releases per input{f' and {training_samples} training ones' if learned else ''} draw about"
            f" {drawn:.3g} random numbers (about {minutes:.3g} minutes of one core), more than the"
            f" {max_random_numbers:.3g} allowed: lower --samples{' and --training-samples' if learned else ''} or the"
            f" dimensions, or run it anyway with --max-random-numbers {int(drawn) + 1}"
        )
    bounds = analytic_bounds(mechanism, delta, seed=seed)
    exact = exact_profile(mechanism, delta, samples=max(samples, 10**5), seed=seed)
    tested = (*bounds, *((exact,) if exact is not None else ()))
    profile = support = None
    if kind.log_likelihood_ratio is not None:
        attack = "exact likelihood ratio log p(y)/q(y)"
        in_losses, out_losses = (
            log_likelihood_ratio(
                mechanism, mechanism.sample_statistic(_rng(seed, side), samples, side, full_releases=full_releases)
            )
            for side in ("V", "V'")
        )
        estimate = estimate_profile(in_losses, out_losses, confidence)
        profile = ProfileSummary(
            epsilon=estimate.epsilon(delta),
            delta_at=tuple((b.source, b.epsilon, estimate.delta(b.epsilon)) for b in tested if b.valid),
            change_of_measure=change_of_measure_check(in_losses, out_losses),
        )
        in_scores, out_scores = _finite(in_losses, out_losses)
    elif kind.support is not None:
        certificate = kind.support
        attack = certificate.attack
        defects = [
            certificate.defect(mechanism, mechanism.sample_statistic(_rng(seed, side), samples, side))
            for side in ("V", "V'")
        ]
        support = SupportEvidence(
            certificate.statistic,
            certificate.tolerance,
            float(defects[0].max()),
            float(defects[1].min()),
            int(np.sum(defects[0] <= certificate.tolerance)),
            int(np.sum(defects[1] <= certificate.tolerance)),
            samples,
        )
        in_scores, out_scores = -defects[0], -defects[1]
    else:
        training_samples = int(training_samples)
        attack = (
            f"learned distinguisher (gradient boosting on the release's maximal invariant, "
            f"{training_samples} independent training draws per side)"
        )
        in_scores, out_scores = learned_distinguisher_scores(mechanism, samples, training_samples, seed)
    strategy = (
        BonferroniThresholds()
        if samples <= _BONFERRONI_LIMIT
        else SplitThreshold(_SELECTION_FRACTION, _seed_int(seed, "threshold"))
    )
    empirical = clopper_pearson_epsilon(in_scores, out_scores, delta, confidence, strategy)
    gdp = gdp_epsilon(in_scores, out_scores, delta, confidence, strategy)
    metrics = summarize(in_scores, out_scores, confidence=confidence)
    exact_epsilon = exact.epsilon if exact is not None and exact.valid else None
    comparisons = tuple(
        compare(
            b,
            empirical,
            metrics.auc_ci[0],
            support=support,
            exact_epsilon=exact_epsilon,
            profile_epsilon=profile.epsilon if profile else None,
        )
        for b in tested
    )
    outcome, reason = _overall(comparisons, support)
    return MechanismAudit(
        mechanism=kind.name,
        parameters=describe(mechanism),
        delta=delta,
        confidence=confidence,
        samples=samples,
        seed=seed,
        attack=attack,
        bounds=bounds,
        exact_profile=exact,
        clopper_pearson=empirical,
        gaussian_dp=gdp,
        auc=metrics.auc,
        auc_interval=metrics.auc_ci,
        profile=profile,
        support=support,
        comparisons=comparisons,
        outcome=outcome,
        reason=reason,
    )

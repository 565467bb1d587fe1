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
from scipy import stats

from accountants import gaussian, sketch, wishart
from accountants import validation as check
from accountants._montecarlo import SortedLosses, invert
from accountants._numeric import solve_decreasing
from accountants.jsondata import json_safe
from accountants.result import REPLACE_ONE, Bound, inapplicable
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
from dpaudit.release_audit.releases import (
    GaussianMechanism,
    GaussianSketchRelease,
    MatrixProjection,
    NoisyProjectionM1,
    NoisyProjectionM2Release,
    OneColumnChange,
    WishartVector,
)

Outcome = Literal["consistent", "violated", "inconclusive", "not DP"]

_EXACT_LIKELIHOOD = (GaussianMechanism, WishartVector, GaussianSketchRelease)
# The release classes audit() accepts → their names in ``dpaudit audit-mechanism`` and in its results.
RELEASE_NAMES = {
    GaussianMechanism: "gaussian",
    WishartVector: "wishart-vector",
    NoisyProjectionM1: "wishart-m1",
    NoisyProjectionM2Release: "wishart-m2",
    GaussianSketchRelease: "sketch",
    MatrixProjection: "projection",
}

# Stable stream ids under the audit seed; the pair constructors use stream 0.
_STREAMS = {"V": 1, "V'": 2, "train V": 3, "train V'": 4, "classifier": 5, "exact profile": 6, "threshold": 7}

# Bonferroni over every threshold costs one Beta quantile per candidate (~9 microseconds each); above this many
# draws per side the threshold is chosen on a seeded 10% split instead (attacks.epsilon.SplitThreshold).
_BONFERRONI_LIMIT = 50_000
_SELECTION_FRACTION = 0.1

# Relative symmetry defect below which V^T Y counts as symmetric. Float64 rounding of the sums behind
# Y = Z (Z^T V) leaves about 1e-15 (1e-14 at d = 400, r = 64). Under V' the defect is a continuous variable of
# scale |Delta V| with a bounded density at 0, so P(defect <= 1e-11) is about 1e-11 / |Delta V| per draw.
_SYMMETRY_TOLERANCE = 1e-11


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
    """
    statistic = np.asarray(statistic, float)
    if isinstance(mechanism, GaussianMechanism):
        pair = mechanism.pair
        offset = pair.v_prime @ pair.v_prime - pair.v @ pair.v
        return (offset - 2 * statistic[:, 0]) / (2 * mechanism.sigma**2)
    if isinstance(mechanism, WishartVector):
        return _wishart_vector_loss(statistic, mechanism.pair.d, mechanism.r)
    if isinstance(mechanism, GaussianSketchRelease):
        log_det_ratio = (
            np.linalg.slogdet(mechanism.covariance("V"))[1] - np.linalg.slogdet(mechanism.covariance("V'"))[1]
        )
        return -statistic[:, 0] / 2 - mechanism.r / 2 * log_det_ratio
    raise InvalidArgument(
        f"no closed-form likelihood ratio for {type(mechanism).__name__}; audit it with a learned distinguisher"
    )


def _wishart_vector_loss(statistic: np.ndarray, d: int, r: int) -> np.ndarray:
    own, other, squared_norm = statistic.T
    if np.any((own <= 0) & (other <= 0)):
        raise ValueError("a release with v^T y <= 0 and v'^T y <= 0 lies in neither support: not a Wishart release")
    inside = (own > 0) & (other > 0)
    s, s_prime, q = own[inside], other[inside], squared_norm[inside]
    losses = np.where(own > 0, np.inf, -np.inf)
    losses[inside] = (r - d - 1) / 2 * (np.log(s) - np.log(s_prime)) - r * q / 2 * (1 / s - 1 / s_prime)
    return losses


def symmetry_defect(mechanism: MatrixProjection, statistic: np.ndarray) -> np.ndarray:
    """``|V^T Y - Y^T V|_F / |V^T Y|_F`` from the invariant statistic (``V^T Y = (W^T V)^T (W^T Y)``).

    0 up to rounding for every ``Y = M V`` (``V^T M V`` is symmetric); for ``Y = M V'`` it is
    ``|V^T M V' - V'^T M V|_F / |V^T M V'|_F``, non-zero with probability 1 when n >= 2 ([W] Lemma 11).
    """
    projected = np.einsum(
        "kn,ckm->cnm", mechanism.pair.span_basis().T @ mechanism.pair.V, mechanism.projected_release(statistic)
    )
    defect = np.linalg.norm(projected - projected.transpose(0, 2, 1), axis=(1, 2))
    return defect / np.maximum(np.linalg.norm(projected, axis=(1, 2)), np.finfo(float).tiny)


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


def _relabel(bound: Bound, source: str, **details) -> Bound:
    return dataclasses.replace(bound, source=source, details=dict(bound.details, **details))


def _sketch_lemma71(mechanism: GaussianSketchRelease, delta: float) -> tuple[Bound, Bound]:
    """[S] Lemma 7.1 as stated, and in the one-column form of [S] App. D.1 that the paper calls tight.

    As stated: ``B_C = 2 B_F B_S`` and lambda_bar bounding the Gram matrices of both inputs (the lemma's
    assumption must hold for every dataset, so that both orders of the Renyi divergence are covered),
    ``tau = rank(Delta Sigma) = 1``. One-column form: ``B_C = |Q Q^T - Q' Q'^T|_F = B_S^2``, ``tau = 1`` and
    ``lambda_bar = lambda_min(Q Q^T)`` of the dataset holding the column, the first argument of the divergence in
    the proof (Eq. 45 uses lambda_min(Sigma_1) only).
    """
    pair = mechanism.pair
    stated = sketch.lemma71(
        delta,
        min(pair.lambda_min, pair.lambda_min_neighbour),
        mechanism.sigma_g,
        mechanism.sigma_a,
        pair.norm_bound,
        pair.sensitivity,
        mechanism.r,
        tau=1,
    )
    one_column = sketch.lemma71(
        delta,
        pair.lambda_min,
        mechanism.sigma_g,
        mechanism.sigma_a,
        pair.norm_bound,
        pair.sensitivity,
        mechanism.r,
        tau=1,
        gram_sensitivity=pair.gram_sensitivity,
    )
    return (
        stated,
        _relabel(one_column, "[S] Lemma 7.1, one-column form (App. D.1: B_C = B_S^2, tau = 1) + [S] Prop. 4.3"),
    )


def analytic_bounds(mechanism, delta: float, *, seed: int = 0) -> tuple[Bound, ...]:
    """The papers' (eps, delta) bounds for this mechanism and pair, at ``delta`` (replace-one neighbours)."""
    if isinstance(mechanism, GaussianMechanism):
        sensitivity = mechanism.pair.sensitivity
        return (
            gaussian.classical_epsilon(delta, sensitivity, mechanism.sigma),
            gaussian.rdp_epsilon(delta, sensitivity, mechanism.sigma),
        )
    if isinstance(mechanism, WishartVector):
        return (wishart.theorem1_epsilon(delta, mechanism.pair.rho, mechanism.pair.d, mechanism.r),)
    if isinstance(mechanism, NoisyProjectionM1):
        calibrations: tuple[wishart.GaussianCalibration, ...] = ("classical", "exact")
        return tuple(_m1_theorem3(mechanism, delta, calibration) for calibration in calibrations)
    if isinstance(mechanism, NoisyProjectionM2Release):
        pair, sigma = mechanism.pair, mechanism.sigma
        singular_values = pair.difference_singular_values
        rank_one = singular_values.size == 1
        baseline = gaussian.epsilon(delta, pair.frobenius_distance, sigma)
        return (
            wishart.theorem5_epsilon(delta, pair.frobenius_distance, sigma, pair.d, mechanism.r, pair.difference_rank),
            wishart.m2_mixture_epsilon(
                delta,
                pair.frobenius_distance,
                sigma,
                pair.d,
                mechanism.r,
                None if rank_one else singular_values.tolist(),
                seed=_seed_int(seed, "exact profile"),
            ),
            _relabel(baseline, "Gaussian mechanism on V + Xi, M as post-processing (docs/theory.md §2.1)"),
        )
    if isinstance(mechanism, GaussianSketchRelease):
        return _sketch_lemma71(mechanism, delta)
    if isinstance(mechanism, MatrixProjection):
        return (_proposition2(mechanism, delta), _lora_claim(mechanism, delta))
    raise InvalidArgument(f"unknown mechanism {type(mechanism).__name__}")


def _m1_theorem3(mechanism: NoisyProjectionM1, delta: float, calibration: wishart.GaussianCalibration) -> Bound:
    """[W] Thm 3 (Thm 4 per column, Lemma 2, Lemma 14/15) with the Gaussian part calibrated as named."""
    pair = mechanism.pair
    source = f"[W] Thm 3 ({calibration} Gaussian calibration of Eq. 3)"
    if not isinstance(pair, OneColumnChange):
        return inapplicable(
            source, REPLACE_ONE, "[W] Thm 3 needs a one-column adjacency chain ([W] Def. 4)", delta=delta
        )
    bound = wishart.theorem3_epsilon(
        delta,
        len(pair.changed_columns),
        pair.column_sensitivity,
        mechanism.sigma,
        pair.d,
        mechanism.r,
        pair.span_dimension,
        pair.rho_perp,
        pair.beta_perp,
        calibration,
    )
    return _relabel(bound, source)


def _proposition2(mechanism: MatrixProjection, delta: float) -> Bound:
    return inapplicable(
        "[W] Prop. 2",
        REPLACE_ONE,
        "the noise-free matrix projection is not (eps, delta)-DP for any "
        "eps and delta < 1: M V and M V' have disjoint supports",
        delta=delta,
        inputs=dict(d=mechanism.pair.d, n=mechanism.pair.n, r=mechanism.r),
    )


def _lora_claim(mechanism: MatrixProjection, delta: float) -> Bound:
    """[S]'s guarantee for noise-free LoRA-FA, whose release ``V^T A^T A`` is this projection (docs/theory.md §1.2).

    [S] Lemma 7.2's proof calls the released weights ``W_0 - eta (G A^T + Z) A`` a post-processing of the
    sketch ``G A^T + Z`` and applies Lemma 7.1 to it. Here ``Q = V^T`` (rows are the records' gradients),
    ``sigma_A^2 = 1/r`` (A = Z^T), ``sigma_g = 0``, lambda_bar over both Gram matrices, ``B_C = 2 B_F B_S``.
    """
    pair = mechanism.pair
    gram_change = pair.V.T @ pair.V - pair.V_prime.T @ pair.V_prime
    values = np.linalg.eigvalsh(gram_change)
    tau = max(int(np.count_nonzero(np.abs(values) > 1e-10 * max(np.abs(values).max(), 1e-300))), 1)
    lambda_bar = min(np.linalg.eigvalsh(pair.V.T @ pair.V)[0], np.linalg.eigvalsh(pair.V_prime.T @ pair.V_prime)[0])
    norm_bound = max(np.linalg.norm(pair.V), np.linalg.norm(pair.V_prime))
    claim = sketch.lemma71(
        delta,
        max(float(lambda_bar), 0.0),
        0.0,
        1 / math.sqrt(mechanism.r),
        float(norm_bound),
        pair.frobenius_distance,
        mechanism.r,
        tau,
    )
    return _relabel(
        claim, "[S] Lemma 7.1 as applied to LoRA-FA's release by [S] Lemma 7.2 (sigma_g = 0) + [S] Prop. 4.3"
    )


def _probability_above(weight: float, offset: float, epsilon: float, r: int) -> float:
    """``P((weight K - offset)/2 > epsilon)`` for ``K ~ chi2_r``."""
    threshold = (2 * epsilon + offset) / weight
    return float(stats.chi2.sf(threshold, r) if weight > 0 else stats.chi2.cdf(threshold, r))


def _sketch_profile_delta(epsilon: float, ratio: float, r: int) -> float:
    """Exact delta(eps) of the sketch when ``Sigma_V'^{-1} Sigma_V`` has one eigenvalue ``ratio != 1`` (tau = 1).

    Along that direction the r columns are ``N(0, s_V)`` vs ``N(0, s_V')``, ``ratio = s_V/s_V'``: under V,
    ``L = ((ratio - 1) K - r ln ratio)/2``; under V', ``L = ((1 - 1/ratio) K - r ln ratio)/2``, ``K ~ chi2_r``.
    ``delta = max(P(L > eps) - e^eps Q(L > eps), Q(-L > eps) - e^eps P(-L > eps))``.
    """
    under_v, under_v_prime, offset = ratio - 1, 1 - 1 / ratio, r * math.log(ratio)
    forward = _probability_above(under_v, offset, epsilon, r) - math.exp(epsilon) * _probability_above(
        under_v_prime, offset, epsilon, r
    )
    backward = _probability_above(-under_v_prime, -offset, epsilon, r) - math.exp(epsilon) * _probability_above(
        -under_v, -offset, epsilon, r
    )
    return max(forward, backward, 0.0)


def exact_profile(
    mechanism, delta: float, *, samples: int = 10**6, seed: int = 0, confidence: float = 0.99
) -> Bound | None:
    """The exact (or, for M2, the mixture) eps(delta), where one is available; None otherwise.

    Gaussian: Balle-Wang closed form. Vector Wishart: [W] Lemma 8 Monte Carlo (accountants, its own seed
    stream). Sketch with a rank-one covariance change: the chi-square closed form of
    :func:`_sketch_profile_delta`. M2's mixture bound is listed among the bounds (it is the exact profile of
    the release together with M, an upper bound for the release alone).
    """
    if isinstance(mechanism, GaussianMechanism):
        return gaussian.epsilon(delta, mechanism.pair.sensitivity, mechanism.sigma)
    if isinstance(mechanism, WishartVector):
        return wishart.vector_profile_epsilon(
            delta,
            mechanism.pair.rho,
            mechanism.pair.d,
            mechanism.r,
            samples=samples,
            seed=_seed_int(seed, "exact profile"),
            confidence=confidence,
        )
    if isinstance(mechanism, GaussianSketchRelease):
        ratios = np.linalg.eigvals(np.linalg.solve(mechanism.covariance("V'"), mechanism.covariance("V"))).real
        changed = ratios[np.abs(ratios - 1) > 1e-10]
        if changed.size != 1:
            return None
        source = "[S] Eq. 1 sketch, exact profile (rank-one covariance change, chi-square closed form)"
        value = solve_decreasing(
            lambda e: math.log(max(_sketch_profile_delta(e, changed[0], mechanism.r), 1e-320)),
            math.log(delta),
            0.0,
            1.0,
        )
        return Bound(
            epsilon=value,
            delta=delta,
            neighbouring=REPLACE_ONE,
            source=source,
            inputs=dict(delta=delta, r=mechanism.r),
            details=dict(variance_ratio=float(changed[0])),
        )
    return None


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
      mechanism: ``"gaussian"``, ``"wishart-vector"``, ``"wishart-m1"``, ``"wishart-m2"``, ``"sketch"``,
        ``"projection"``.
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
    if isinstance(mechanism, GaussianMechanism):
        return dict(d=mechanism.pair.d, sensitivity=mechanism.pair.sensitivity, sigma=mechanism.sigma, mu=mechanism.mu)
    if isinstance(mechanism, WishartVector):
        return dict(d=mechanism.pair.d, r=mechanism.r, rho=mechanism.pair.rho)
    if isinstance(mechanism, GaussianSketchRelease):
        pair = mechanism.pair
        return dict(
            n=pair.n,
            m=pair.m,
            r=mechanism.r,
            sigma_a=mechanism.sigma_a,
            sigma_g=mechanism.sigma_g,
            norm_bound=pair.norm_bound,
            sensitivity=pair.sensitivity,
            lambda_min=pair.lambda_min,
            lambda_min_neighbour=pair.lambda_min_neighbour,
            gram_sensitivity=pair.gram_sensitivity,
            direction=pair.direction,
        )
    pair = mechanism.pair
    parameters = dict(
        d=pair.d,
        n=pair.n,
        r=mechanism.r,
        changed_columns=len(pair.changed_columns),
        difference_rank=pair.difference_rank,
        frobenius_distance=pair.frobenius_distance,
    )
    if isinstance(mechanism, (NoisyProjectionM1, NoisyProjectionM2Release)):
        parameters["sigma"] = mechanism.sigma
    if isinstance(pair, OneColumnChange):
        parameters.update(
            beta_perp=pair.beta_perp,
            rho_parallel=pair.rho_parallel,
            rho_perp=pair.rho_perp,
            span_dimension=pair.span_dimension,
            column_sensitivity=pair.column_sensitivity,
        )
    return parameters


def audit(
    mechanism,
    *,
    delta: float = 1e-3,
    samples: int = 100_000,
    seed: int = 0,
    confidence: float = 0.95,
    training_samples: int | None = None,
    full_releases: bool = False,
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
      full_releases: score full releases instead of drawing the statistic from its law (exact either way; the
        full path is the slow cross-check). Matrix releases are always sampled in full.
    """
    check.one_of("mechanism", type(mechanism).__name__, [c.__name__ for c in RELEASE_NAMES])
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
    if type(mechanism) not in _EXACT_LIKELIHOOD + (MatrixProjection,):
        check.allocation(
            f"{training_samples} training releases per input",
            2 * 8 * training_samples * (width + 8),
            "lower --training-samples",
        )
    bounds = analytic_bounds(mechanism, delta, seed=seed)
    exact = exact_profile(mechanism, delta, samples=max(samples, 10**5), seed=seed)
    tested = (*bounds, *((exact,) if exact is not None else ()))
    profile = support = None
    if isinstance(mechanism, _EXACT_LIKELIHOOD):
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
    elif isinstance(mechanism, MatrixProjection):
        attack = "support certificate: symmetry defect of V^T Y ([W] Prop. 2, Lemma 11)"
        defects = [
            symmetry_defect(mechanism, mechanism.sample_statistic(_rng(seed, side), samples, side))
            for side in ("V", "V'")
        ]
        support = SupportEvidence(
            "symmetry of V^T Y",
            _SYMMETRY_TOLERANCE,
            float(defects[0].max()),
            float(defects[1].min()),
            int(np.sum(defects[0] <= _SYMMETRY_TOLERANCE)),
            int(np.sum(defects[1] <= _SYMMETRY_TOLERANCE)),
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
        mechanism=RELEASE_NAMES[type(mechanism)],
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

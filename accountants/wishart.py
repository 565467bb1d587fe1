"""Privacy of Wishart projections, [W] (Hu, Düngler, Schölkopf, Sanyal): docs/theory.md §1.1, §1.3, §2.3-2.7.

``M = Z Z^T`` with ``Z in R^{d x r}``, i.i.d. ``N(0, 1/r)`` entries. Neighbouring datasets differ in one
record (replace-one, [W] Sec. 2). Three releases:

* vector ``y = M v`` with unit ``v`` and alignment ``rho = <v, v'>``: [W] Thm 1 and the exact profile
  (Lemma 8, sampled);
* M1 ``M V + Xi``: Lemma 2, Lemma 14 (+ Lemma 15), Thm 4 (one column), Thm 3 (k columns);
* M2 ``M (V + Xi)``: Thm 5, its multi-step use (App. F.2), and the mixture bound (docs/theory.md §2.7, beyond [W]).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
from scipy.optimize import brentq
from scipy.special import betaincc, betainccinv, betaincinv, chdtri, stdtr, stdtrit

from accountants import gaussian
from accountants import validation as check
from accountants._montecarlo import SampledMixture, SortedLosses, invert
from accountants._numeric import minimize_on_grid, solve_decreasing
from accountants.result import ADD_REMOVE, REPLACE_ONE, Bound, inapplicable
from accountants.validation import InvalidArgument

GaussianCalibration = Literal["exact", "classical"]


# --------------------------------------------------------------------------------------------
# Vector release y = M v: [W] Thm 1 and the exact profile (Lemma 8)
# --------------------------------------------------------------------------------------------


def _support_escape(rho: float, r: int) -> float:
    """``P(A <= 0) = E_{x~chi2_r}[Phi(-rho sqrt(x) / sqrt(1-rho^2))]`` ([W] Eq. 17).

    By Lemma 8, ``A = rho + sqrt((1-rho^2)/r) T_r`` with T_r Student-t, so the expectation is the
    t CDF ``t_r(-rho sqrt(r/(1-rho^2)))``.
    """
    if rho == 1.0:
        return 0.0
    return float(stdtr(r, -rho * math.sqrt(r / ((1 - rho) * (1 + rho)))))


def _theorem1_epsilon(rho: float, d: int, r: int, delta_prime: float) -> tuple[float, str]:
    """([W] Thm 1's eps, "") or (inf, reason) when its condition rho > K fails."""
    t = -float(stdtrit(r, delta_prime))  # t_r(1 - delta'), computed from the small tail
    k = math.sqrt((1 - rho) * (1 + rho) / r) * t
    if not (t > 0 and rho > k):  # t is inf (or garbage) below ~1e-250
        return math.inf, (
            f"[W] Thm 1 needs rho > K = sqrt((1-rho^2)/r) t_r(1-delta') = {k:.6g} "
            f"(equivalently rho > t/sqrt(r+t^2)); got rho = {rho}"
        )
    kappa = float(chdtri(d + r - 1, delta_prime))  # kappa_{d+r-1}(1 - delta')
    return (d - r + 1) / 2 * math.log(rho + k) + (1 - rho + k) * kappa / (2 * (rho - k)), ""


def _vector_inputs(rho, d, r):
    rho = check.alignment("rho", rho)
    r, d = check.rank(r, d)
    return rho, d, r


def theorem1(rho: float, d: int, r: int, delta_prime: float) -> Bound:
    """[W] Thm 1: the vector projection is (eps_rho, delta_rho)-DP (replace-one).

    With ``t = t_r(1 - delta')``, ``K = sqrt((1-rho^2)/r) t``, valid iff ``rho > K``:
    ``eps = (d-r+1)/2 ln(rho+K) + (1-rho+K) kappa_{d+r-1}(1-delta') / (2(rho-K))``,
    ``delta = E_{x~chi2_r}[Phi(-rho sqrt(x)/sqrt(1-rho^2))] + 3 delta'`` (docs/theory.md §2.3).
    """
    rho, d, r = _vector_inputs(rho, d, r)
    delta_prime = check.open_unit("delta_prime", delta_prime)
    inputs = dict(rho=rho, d=d, r=r, delta_prime=delta_prime)
    escape = _support_escape(rho, r)
    value, reason = _theorem1_epsilon(rho, d, r, delta_prime)
    delta = escape + 3 * delta_prime
    if reason or delta >= 1:
        return inapplicable(
            "[W] Thm 1",
            REPLACE_ONE,
            reason or f"delta = {delta:.4g} >= 1 is vacuous",
            delta=min(delta, 1.0),
            inputs=inputs,
        )
    return Bound(
        epsilon=value,
        delta=delta,
        neighbouring=REPLACE_ONE,
        source="[W] Thm 1",
        inputs=inputs,
        details=dict(support_escape=escape),
    )


def theorem1_epsilon(delta: float, rho: float, d: int, r: int) -> Bound:
    """[W] Thm 1 at a target delta: ``delta' = (delta - P(A <= 0)) / 3`` (the largest, hence best, delta')."""
    rho, d, r = _vector_inputs(rho, d, r)
    delta = check.open_unit("delta", delta)
    escape = _support_escape(rho, r)
    inputs = dict(delta=delta, rho=rho, d=d, r=r)
    if delta <= escape:
        return inapplicable(
            "[W] Thm 1", REPLACE_ONE, f"delta must exceed P(A <= 0) = {escape:.4g}", delta=delta, inputs=inputs
        )
    delta_prime = (delta - escape) / 3
    value, reason = _theorem1_epsilon(rho, d, r, delta_prime)
    if reason:
        return inapplicable("[W] Thm 1", REPLACE_ONE, reason, delta=delta, inputs=inputs)
    return Bound(
        epsilon=value,
        delta=delta,
        neighbouring=REPLACE_ONE,
        source="[W] Thm 1",
        inputs=inputs,
        details=dict(delta_prime=delta_prime, support_escape=escape),
    )


def theorem1_delta(epsilon: float, rho: float, d: int, r: int) -> Bound:
    """[W] Thm 1 at a target eps: the smallest delta' whose eps_rho(delta') <= eps (eps_rho falls as delta' grows)."""
    rho, d, r = _vector_inputs(rho, d, r)
    epsilon = check.non_negative("epsilon", epsilon)
    escape = _support_escape(rho, r)
    inputs = dict(epsilon=epsilon, rho=rho, d=d, r=r)
    largest = (1 - escape) / 3 * (1 - 1e-12)  # delta' beyond it makes delta >= 1

    def excess(log_delta_prime: float) -> float:
        value = _theorem1_epsilon(rho, d, r, math.exp(log_delta_prime))[0]
        return min(value, 1e300) - epsilon

    if excess(math.log(largest)) > 0:
        return inapplicable(
            "[W] Thm 1", REPLACE_ONE, f"[W] Thm 1 cannot reach eps = {epsilon} with delta < 1", inputs=inputs
        )
    smallest = math.log(1e-200)
    log_delta_prime = smallest if excess(smallest) <= 0 else brentq(excess, smallest, math.log(largest), xtol=1e-12)
    delta_prime = math.exp(log_delta_prime)
    return Bound(
        epsilon=epsilon,
        delta=escape + 3 * delta_prime,
        neighbouring=REPLACE_ONE,
        source="[W] Thm 1",
        inputs=inputs,
        details=dict(delta_prime=delta_prime, support_escape=escape),
    )


@dataclass(frozen=True)
class VectorProfile:
    """Exact privacy profile of ``y = M v`` vs ``y' = M v'``, sampled (docs/theory.md §2.4, [W] Lemma 8).

    With independent ``K1 ~ chi2_r, K2 ~ N(0,1), K3 ~ chi2_{d-2}``: ``A = rho + sqrt(1-rho^2) K2/sqrt(K1)``,
    ``B = K1 + K2^2 + K3`` is the law of ``(v'^T y / v^T y, r |y|^2 / v^T y)`` for ``y ~ P``, and the
    privacy loss is ``L = (d+1-r)/2 ln A + B/2 (1/A - 1)`` if ``A > 0``; otherwise y lies outside the
    support of Q. Hence ``delta(eps) = P(A <= 0) + E[(1 - e^{eps-L})_+ ; A > 0]``. (The density
    exponent in [W] Eqs. 22/25 reads (r-d+1)/2; the derivation gives (r-d-1)/2, which yields this L.)
    By symmetry of (v, v') the profile is the same in both directions.
    """

    rho: float
    d: int
    r: int
    samples: int
    seed: int
    confidence: float
    losses: SortedLosses

    def delta(self, epsilon: float) -> Bound:
        """The estimated δ at ``epsilon``, with its confidence interval."""
        epsilon = check.non_negative("epsilon", epsilon)
        estimate, lower, upper = (float(x[0]) for x in self.losses.bands(np.array([epsilon])))
        return Bound(
            epsilon=epsilon,
            delta=estimate,
            neighbouring=REPLACE_ONE,
            source=self._source,
            inputs=dict(epsilon=epsilon, **self._inputs),
            delta_interval=(lower, upper),
            confidence=self.confidence,
        )

    def epsilon(self, delta: float) -> Bound:
        """Estimated eps(delta) with its confidence interval (inf when delta <= P(A <= 0))."""
        delta = check.open_unit("delta", delta)
        estimate, lower, upper = invert(self.losses.bands, delta, self.losses.grid())
        inputs = dict(delta=delta, **self._inputs)
        if not math.isfinite(estimate):
            return inapplicable(
                self._source,
                REPLACE_ONE,
                f"delta = {delta} is below the estimated P(A <= 0) = {self.losses.atoms / self.losses.n:.4g}",
                delta=delta,
                inputs=inputs,
            )
        return Bound(
            epsilon=estimate,
            delta=delta,
            neighbouring=REPLACE_ONE,
            source=self._source,
            inputs=inputs,
            epsilon_interval=(lower, upper),
            confidence=self.confidence,
        )

    @property
    def _source(self) -> str:
        return "[W] vector projection, exact profile (Monte Carlo, Lemma 8)"

    @property
    def _inputs(self) -> dict:
        return dict(rho=self.rho, d=self.d, r=self.r, samples=self.samples, seed=self.seed)


def vector_profile(
    rho: float, d: int, r: int, *, samples: int = 10**6, seed: int = 0, confidence: float = 0.99
) -> VectorProfile:
    """Sample the exact profile of the vector projection ([W] Lemma 8) from ``seed``."""
    rho, d, r = _vector_inputs(rho, d, r)
    if d < 2:
        raise InvalidArgument(f"d must be >= 2 for the sampled profile (K3 ~ chi2_(d-2)), got {d}")
    samples = check.count("samples", samples, minimum=2)
    # k1, k2, k3, a, b, the losses and their sorted copies: about ten float64 arrays of `samples`
    check.allocation(f"the sampled profile of {samples} draws", 10 * 8 * samples, "lower --samples")
    confidence = check.open_unit("confidence", confidence)
    rng = np.random.default_rng(check.seed("seed", seed))
    k1 = rng.chisquare(r, samples)
    k2 = rng.standard_normal(samples)
    k3 = rng.chisquare(d - 2, samples) if d > 2 else np.zeros(samples)
    a = rho + math.sqrt((1 - rho) * (1 + rho)) * k2 / np.sqrt(k1)
    inside = a > 0
    a, b = a[inside], (k1 + k2**2 + k3)[inside]
    losses = (d + 1 - r) / 2 * np.log(a) + b / 2 * (1 / a - 1)
    return VectorProfile(
        rho,
        d,
        r,
        samples,
        seed,
        confidence,
        SortedLosses(losses, atoms=int(samples - inside.sum()), confidence=confidence),
    )


def vector_profile_delta(
    epsilon: float, rho: float, d: int, r: int, *, samples: int = 10**6, seed: int = 0, confidence: float = 0.99
) -> Bound:
    """delta(eps) of the exact vector profile, Monte Carlo with a confidence interval."""
    return vector_profile(rho, d, r, samples=samples, seed=seed, confidence=confidence).delta(epsilon)


def vector_profile_epsilon(
    delta: float, rho: float, d: int, r: int, *, samples: int = 10**6, seed: int = 0, confidence: float = 0.99
) -> Bound:
    """eps(delta) of the exact vector profile, Monte Carlo with a confidence interval."""
    return vector_profile(rho, d, r, samples=samples, seed=seed, confidence=confidence).epsilon(delta)


# --------------------------------------------------------------------------------------------
# M1: M V + Xi, large-r regime ([W] Sec. 4.1, App. D.1)
# --------------------------------------------------------------------------------------------


def _m1_dimensions(d, r, s) -> tuple[int, int, int]:
    r, d = check.rank(r, d)
    s = check.count("s", s, minimum=0)
    if s > d:
        raise InvalidArgument(f"s = dim span(V_-j) must be <= d, got s={s} > d={d}")
    return d, r, s


def lemma14_gamma(beta: float, d: int, r: int, s: int) -> float:
    """[W] Lemma 14: the high-probability bound ``Gamma_beta`` on ``|M_par u|``.

    With probability >= 1 - beta given H, ``|M_par u| <= Gamma_beta``, with
    ``Gamma_beta = sigma_M^2 (sqrt d + sqrt p + g)(sqrt p + g)``, ``g = sqrt(2 ln(2/beta))``, ``sigma_M^2 = 1/r``
    and ``p = rank(U^T Z) = min(s, r)`` almost surely.
    """
    beta = check.open_unit("delta_s", beta)
    d, r, s = _m1_dimensions(d, r, s)
    p = min(s, r)
    g = math.sqrt(2 * math.log(2 / beta))
    return (math.sqrt(d) + math.sqrt(p) + g) * (math.sqrt(p) + g) / r


def lemma2_residual(rho_perp: float, d: int, r: int, s: int, delta_prime: float, beta_perp: float = 1.0) -> Bound:
    """[W] Lemma 2: the residual ``R(b) = M_perp b`` is (eps_perp, delta_perp)-DP.

    It is [W] Thm 1 for a Wishart of dimension ``m = d - s`` and rank ``q = r - p`` (p = min(s, r))
    with alignment rho_perp, at quantile ``1 - delta'/3``: ``K = sqrt((1-rho^2)/q) t_q(1-delta'/3)``,
    ``eps = (m-q+1)/2 ln(rho+K) + kappa_{m+q-1}(1-delta'/3)/2 (1/(rho-K) - 1)``,
    ``delta = E_{chi2_q}[Phi(-rho sqrt X / sqrt(1-rho^2))] + delta'``. (The main text prints
    ``1/(rho+K)``; the appendix and the proof of Thm 1 give ``1/(rho-K)``.) When ``q = 0`` or
    ``beta_perp = 0`` the residual is identically 0 and the term is (0, 0)-DP.
    """
    d, r, s = _m1_dimensions(d, r, s)
    delta_prime = check.open_unit("delta_prime", delta_prime)
    beta_perp = check.non_negative("beta_perp", beta_perp)
    inputs = dict(rho_perp=rho_perp, d=d, r=r, s=s, delta_prime=delta_prime, beta_perp=beta_perp)
    if s == d and beta_perp > 0:
        raise InvalidArgument("beta_perp must be 0 when s = d (the changed column has no component outside span(V_-j))")
    m, q = d - s, r - min(s, r)
    if q == 0 or beta_perp == 0:
        return Bound(
            epsilon=0.0,
            delta=0.0,
            neighbouring=REPLACE_ONE,
            source="[W] Lemma 2",
            inputs=inputs,
            details=dict(m=m, q=q, trivial="residual is identically 0"),
        )
    instance = theorem1(rho_perp, m, q, delta_prime / 3)
    if not instance.valid:
        return inapplicable("[W] Lemma 2", REPLACE_ONE, instance.reason, delta=instance.delta, inputs=inputs)
    escape = instance.details["support_escape"]
    return Bound(
        epsilon=instance.epsilon,
        delta=escape + delta_prime,
        neighbouring=REPLACE_ONE,
        source="[W] Lemma 2",
        inputs=inputs,
        details=dict(m=m, q=q, support_escape=escape),
    )


def lemma15_correlated(
    sensitivity: float,
    sigma: float,
    d: int,
    r: int,
    s: int,
    delta_parallel: float,
    delta_s: float,
    calibration: GaussianCalibration = "exact",
) -> Bound:
    """[W] Lemma 14 + Lemma 15: the correlated term ``M_par v + xi`` is (eps_par, delta_par + delta_s)-DP.

    On the event ``|M_par u| <= Gamma`` (Lemma 14, probability >= 1 - delta_s) it is a Gaussian
    mechanism with sensitivity ``Gamma Delta_v`` and noise sigma. ``calibration="classical"`` uses
    [W] Eq. (3), ``eps_par = Gamma Delta_v / sigma sqrt(2 ln(1.25/delta_par))``, which Lemma 1 only
    licenses for eps_par < 1 (inf beyond); ``"exact"`` uses the exact Gaussian profile, valid for every eps.
    """
    sensitivity = check.positive("sensitivity", sensitivity)
    if sensitivity > 2:
        raise InvalidArgument(f"sensitivity = |v_j - v'_j| must be <= 2 for unit columns, got {sensitivity}")
    sigma = check.positive("sigma", sigma)
    delta_parallel = check.open_unit("delta_parallel", delta_parallel)
    delta_s = check.open_unit("delta_s", delta_s)
    gamma = lemma14_gamma(delta_s, d, r, s)
    inputs = dict(
        sensitivity=sensitivity,
        sigma=sigma,
        d=d,
        r=r,
        s=s,
        delta_parallel=delta_parallel,
        delta_s=delta_s,
        calibration=calibration,
    )
    if calibration == "classical":
        part = gaussian.classical_epsilon(delta_parallel, gamma * sensitivity, sigma)
    elif calibration == "exact":
        part = gaussian.epsilon(delta_parallel, gamma * sensitivity, sigma)
    else:
        raise InvalidArgument(f"calibration must be 'exact' or 'classical', got {calibration!r}")
    if not part.valid:
        return inapplicable(
            "[W] Lemma 15", REPLACE_ONE, part.reason, delta=min(delta_parallel + delta_s, 1.0), inputs=inputs
        )
    return Bound(
        epsilon=part.epsilon,
        delta=min(delta_parallel + delta_s, 1.0),
        neighbouring=REPLACE_ONE,
        source="[W] Lemma 14 + Lemma 15",
        inputs=inputs,
        details=dict(gamma=gamma),
    )


def theorem4(
    sensitivity: float,
    sigma: float,
    d: int,
    r: int,
    s: int,
    rho_perp: float,
    delta_parallel: float,
    delta_s: float,
    delta_prime: float,
    beta_perp: float = 1.0,
    calibration: GaussianCalibration = "exact",
) -> Bound:
    """[W] Thm 4 (M1, one changed column).

    ``eps_one = eps_par + eps_perp``, ``delta_one = delta_par + delta_perp + delta_s`` (Lemma 15 + Lemma 2).
    """
    correlated = lemma15_correlated(sensitivity, sigma, d, r, s, delta_parallel, delta_s, calibration)
    residual = lemma2_residual(rho_perp, d, r, s, delta_prime, beta_perp)
    inputs = dict(correlated.inputs, rho_perp=rho_perp, delta_prime=residual.inputs["delta_prime"], beta_perp=beta_perp)
    delta = min(correlated.delta + residual.delta, 1.0)
    for part in (correlated, residual):
        if not part.valid:
            return inapplicable("[W] Thm 4", REPLACE_ONE, part.reason, delta=delta, inputs=inputs)
    return Bound(
        epsilon=correlated.epsilon + residual.epsilon,
        delta=delta,
        neighbouring=REPLACE_ONE,
        source="[W] Thm 4",
        inputs=inputs,
        details=dict(
            epsilon_parallel=correlated.epsilon,
            epsilon_perp=residual.epsilon,
            delta_perp=residual.delta,
            gamma=correlated.details["gamma"],
        ),
    )


_SPLIT_FRACTIONS = [float(x) for x in np.geomspace(1e-4, 1.0, 17)]
_SMALLEST_DELTA = 1e-300


def theorem4_epsilon(
    delta: float,
    sensitivity: float,
    sigma: float,
    d: int,
    r: int,
    s: int,
    rho_perp: float,
    beta_perp: float = 1.0,
    calibration: GaussianCalibration = "exact",
) -> Bound:
    """[W] Thm 4 at a target delta, minimised over splits ``delta_par + delta_s + delta' = delta - P(A_perp <= 0)``.

    The fractions of the budget range over ``10^-4 ... 1`` (17 geometric steps each); when the
    residual is identically 0 (q = 0 or beta_perp = 0) delta' is not needed.
    """
    delta = check.open_unit("delta", delta)
    d, r, s = _m1_dimensions(d, r, s)
    rho_perp = check.alignment("rho_perp", rho_perp)
    q = r - min(s, r)
    trivial = q == 0 or check.non_negative("beta_perp", beta_perp) == 0
    escape = 0.0 if trivial else _support_escape(rho_perp, q)
    inputs = dict(
        delta=delta,
        sensitivity=sensitivity,
        sigma=sigma,
        d=d,
        r=r,
        s=s,
        rho_perp=rho_perp,
        beta_perp=beta_perp,
        calibration=calibration,
    )
    budget = (delta - escape) * (1 - 1e-9)  # keep the sum strictly below delta despite rounding
    if budget <= 0:
        return inapplicable(
            "[W] Thm 4", REPLACE_ONE, f"delta must exceed P(A_perp <= 0) = {escape:.4g}", delta=delta, inputs=inputs
        )
    smallest_prime = 0.0 if trivial else _SPLIT_FRACTIONS[0]
    candidates = (
        theorem4(
            sensitivity,
            sigma,
            d,
            r,
            s,
            rho_perp,
            w_parallel * budget,
            w_s * budget,
            max(1 - w_parallel - w_s, _SPLIT_FRACTIONS[0]) * budget,
            beta_perp,
            calibration,
        )
        for w_parallel in _SPLIT_FRACTIONS
        for w_s in _SPLIT_FRACTIONS
        if 1 - w_parallel - w_s >= smallest_prime - 1e-12
    )
    best = min(candidates, key=lambda bound: bound.epsilon)
    if not best.valid:
        return inapplicable("[W] Thm 4", REPLACE_ONE, best.reason, delta=delta, inputs=inputs)
    split = {k: best.inputs[k] for k in ("delta_parallel", "delta_s", "delta_prime")}
    return Bound(
        epsilon=best.epsilon,
        delta=delta,
        neighbouring=REPLACE_ONE,
        source="[W] Thm 4",
        inputs=inputs,
        details=dict(best.details, **split),
    )


def theorem3(k: int, one_column: Bound) -> Bound:
    """[W] Thm 3: k changed columns along an adjacency chain (group-privacy composition).

    ``eps = k eps_one``, ``delta = k e^{(k-1) eps_one} delta_one``.
    """
    k = check.count("k", k)
    inputs = dict(one_column.inputs, k=k)
    if not one_column.valid:
        return inapplicable("[W] Thm 3", REPLACE_ONE, one_column.reason, delta=one_column.delta, inputs=inputs)
    log_delta = math.log(k) + (k - 1) * one_column.epsilon + math.log(max(one_column.delta, 1e-320))
    if log_delta >= 0:
        return inapplicable("[W] Thm 3", REPLACE_ONE, "k e^{(k-1) eps_one} delta_one >= 1 is vacuous", inputs=inputs)
    return Bound(
        epsilon=k * one_column.epsilon,
        delta=math.exp(log_delta) if one_column.delta > 0 else 0.0,
        neighbouring=REPLACE_ONE,
        source="[W] Thm 3",
        inputs=inputs,
        details=dict(epsilon_one=one_column.epsilon, delta_one=one_column.delta),
    )


def theorem3_epsilon(
    delta: float,
    k: int,
    sensitivity: float,
    sigma: float,
    d: int,
    r: int,
    s: int,
    rho_perp: float,
    beta_perp: float = 1.0,
    calibration: GaussianCalibration = "exact",
) -> Bound:
    """[W] Thm 3 at a target delta: solve ``eps_one = Thm4_eps(delta / (k e^{(k-1) eps_one}))``."""
    delta = check.open_unit("delta", delta)
    k = check.count("k", k)

    def one_column(eps_one: float) -> Bound:
        delta_one = delta * math.exp(-(k - 1) * eps_one) / k
        if delta_one < _SMALLEST_DELTA:
            return inapplicable("[W] Thm 4", REPLACE_ONE, f"delta_one = {delta_one:.3g} is below {_SMALLEST_DELTA}")
        return theorem4_epsilon(delta_one, sensitivity, sigma, d, r, s, rho_perp, beta_perp, calibration)

    inputs = dict(
        delta=delta,
        k=k,
        sensitivity=sensitivity,
        sigma=sigma,
        d=d,
        r=r,
        s=s,
        rho_perp=rho_perp,
        beta_perp=beta_perp,
        calibration=calibration,
    )
    start = one_column(0.0)
    if not start.valid:
        return inapplicable("[W] Thm 3", REPLACE_ONE, start.reason, delta=delta, inputs=inputs)

    def gap(eps_one: float) -> float:
        return min(one_column(eps_one).epsilon, 1e300) - eps_one

    upper = max(start.epsilon, 1e-12)
    for _ in range(60):
        if gap(upper) <= 0:
            break
        upper *= 2
    else:
        return inapplicable(
            "[W] Thm 3", REPLACE_ONE, "no fixed point: the chain is too long for this delta", delta=delta, inputs=inputs
        )
    root = brentq(gap, 0.0, upper, xtol=1e-12)
    # Just right of the root eps_one(x) <= x, so k e^{(k-1) eps_one(x)} delta_one(x) <= delta.
    result = theorem3(k, one_column(min(root * (1 + 1e-9) + 1e-12, upper)))
    return Bound(
        epsilon=result.epsilon,
        delta=delta,
        neighbouring=REPLACE_ONE,
        source="[W] Thm 3",
        inputs=inputs,
        details=dict(result.details, delta_spent=result.delta),
    )


# --------------------------------------------------------------------------------------------
# M2: M (V + Xi), small-r regime ([W] Sec. 4.2, App. D.2, App. F.2) and the mixture bound
# --------------------------------------------------------------------------------------------


def _m2_inputs(sensitivity, sigma, d, r):
    sensitivity = check.positive("sensitivity", sensitivity)
    sigma = check.positive("sigma", sigma)
    r, d = check.rank(r, d)
    return sensitivity / sigma, d, r


def _failure_probability(alpha: float, d: int, r: int, s: int) -> float:
    """``s [1 - I_alpha(r/2, (d-r)/2)]``: union bound on ``|P_M Delta V|^2 > alpha |Delta V|^2`` ([W] Lemma 17)."""
    return s * float(betaincc(r / 2, (d - r) / 2, alpha))


def _check_s(s, d) -> int:
    s = check.count("s", s)
    if s > d:
        raise InvalidArgument(f"s (rank of Delta V, at most min(n, d)) must be <= d, got s={s} > d={d}")
    return s


def theorem5_delta(
    epsilon: float, sensitivity: float, sigma: float, d: int, r: int, s: int, alpha: float | None = None
) -> Bound:
    """[W] Thm 5: ``delta_alpha(eps) = T(eps; alpha |Delta V|^2/sigma^2) + s [1 - I_alpha(r/2, (d-r)/2)]``.

    ``T`` is :func:`accountants.gaussian.privacy_loss_tail`; ``s = min(n, d)`` or ``rank(Delta V)``.
    ``alpha=None`` minimises over alpha in (0, 1). Needs r <= d - 1 (Lemma 17).
    """
    epsilon = check.non_negative("epsilon", epsilon)
    mu, d, r = _m2_inputs(sensitivity, sigma, d, r)
    s = _check_s(s, d)
    inputs = dict(epsilon=epsilon, sensitivity=sensitivity, sigma=sigma, d=d, r=r, s=s, alpha=alpha)
    if r == d:
        return inapplicable("[W] Thm 5", REPLACE_ONE, "[W] Lemma 17 needs r <= d - 1", inputs=inputs)

    def bound(a: float) -> float:
        return gaussian.privacy_loss_tail(epsilon, math.sqrt(a) * mu) + _failure_probability(a, d, r, s)

    if alpha is None:
        log_alpha, _ = minimize_on_grid(lambda x: bound(math.exp(x)), np.linspace(math.log(1e-8), -1e-12, 160))
        alpha = math.exp(log_alpha)
    else:
        alpha = check.open_unit("alpha", alpha)
    return Bound(
        epsilon=epsilon,
        delta=min(bound(alpha), 1.0),
        neighbouring=REPLACE_ONE,
        source="[W] Thm 5",
        inputs=inputs,
        details=dict(alpha=alpha, delta_projection=_failure_probability(alpha, d, r, s)),
    )


def _alpha_for_failure(failure: float, d: int, r: int, s: int) -> float:
    """The smallest alpha with ``s [1 - I_alpha(r/2,(d-r)/2)] <= failure``."""
    return float(betainccinv(r / 2, (d - r) / 2, failure / s))


def theorem5_epsilon(delta: float, sensitivity: float, sigma: float, d: int, r: int, s: int) -> Bound:
    """[W] Thm 5 at a target delta, minimised over alpha in (0, 1).

    A share ``theta`` of delta goes to the projection failure, which fixes alpha through the Beta
    tail; eps solves ``T(eps; alpha mu^2) = (1 - theta) delta``; theta is optimised on a log grid.
    """
    delta = check.open_unit("delta", delta)
    mu, d, r = _m2_inputs(sensitivity, sigma, d, r)
    s = _check_s(s, d)
    inputs = dict(delta=delta, sensitivity=sensitivity, sigma=sigma, d=d, r=r, s=s)
    if r == d:
        return inapplicable("[W] Thm 5", REPLACE_ONE, "[W] Lemma 17 needs r <= d - 1", delta=delta, inputs=inputs)

    def epsilon_at(log_share: float) -> float:
        share = math.exp(log_share)
        alpha = _alpha_for_failure(share * delta, d, r, s)
        return gaussian.privacy_loss_tail_epsilon((1 - share) * delta, math.sqrt(alpha) * mu)

    log_share, value = minimize_on_grid(epsilon_at, np.linspace(math.log(1e-12), math.log(1 - 1e-6), 48))
    share = math.exp(log_share)
    return Bound(
        epsilon=value,
        delta=delta,
        neighbouring=REPLACE_ONE,
        source="[W] Thm 5",
        inputs=inputs,
        details=dict(
            alpha=_alpha_for_failure(share * delta, d, r, s),
            delta_projection=share * delta,
            delta_gaussian=(1 - share) * delta,
        ),
    )


def m2_multistep_epsilon(
    delta: float,
    sensitivity: float,
    sigma: float,
    d: int,
    r: int,
    s: int,
    sample_rate: float,
    steps: int,
    delta_projection: float | None = None,
) -> Bound:
    """[W] App. F.2: M2 with a fresh M every step, Poisson sampling rate q, T steps.

    Given a per-step failure budget ``delta_p``, alpha is the smallest value with
    ``s [1 - I_alpha(r/2,(d-r)/2)] <= delta_p`` (F.2 says "largest admissible"; the smallest is the
    one that helps, and any alpha meeting the budget is sound). On the intersection of the good
    events each step is a subsampled Gaussian with sensitivity ``sqrt(alpha) Delta``, composed by
    the PLD accountant at ``delta - T delta_p``; the union bound adds ``T delta_p``.
    ``delta_projection=None`` optimises ``T delta_p / delta`` on a log grid.
    """
    from accountants import dpsgd

    delta = check.open_unit("delta", delta)
    mu, d, r = _m2_inputs(sensitivity, sigma, d, r)
    s = _check_s(s, d)
    steps = check.count("steps", steps)
    sample_rate = check.sample_rate("sample_rate", sample_rate)
    inputs = dict(
        delta=delta,
        sensitivity=sensitivity,
        sigma=sigma,
        d=d,
        r=r,
        s=s,
        sample_rate=sample_rate,
        steps=steps,
        delta_projection=delta_projection,
    )
    if r == d:
        return inapplicable("[W] App. F.2", ADD_REMOVE, "[W] Lemma 17 needs r <= d - 1", delta=delta, inputs=inputs)

    def account(per_step: float) -> Bound:
        alpha = _alpha_for_failure(per_step, d, r, s)
        return dpsgd.epsilon(1 / (math.sqrt(alpha) * mu), sample_rate, steps, delta - steps * per_step)

    if delta_projection is None:
        log_share, _ = minimize_on_grid(
            lambda x: account(math.exp(x) * delta / steps).epsilon,
            np.linspace(math.log(1e-3), math.log(0.9), 7),
            xatol=0.05,
        )
        delta_projection = math.exp(log_share) * delta / steps
    elif not 0 < delta_projection < delta / steps:
        raise InvalidArgument(
            f"delta_projection must be in (0, delta/steps) = (0, {delta / steps:.3g}), got {delta_projection}"
        )
    composed = account(delta_projection)
    if not composed.valid:
        reason = f"the composition at delta - T delta_p has no finite eps: {composed.reason}"
        return inapplicable("[W] Thm 5 + App. F.2", ADD_REMOVE, reason, delta=delta, inputs=inputs)
    return Bound(
        epsilon=composed.epsilon,
        delta=delta,
        neighbouring=ADD_REMOVE,
        source="[W] Thm 5 + App. F.2",
        inputs=inputs,
        details=dict(
            alpha=_alpha_for_failure(delta_projection, d, r, s),
            delta_projection=delta_projection,
            effective_noise_multiplier=composed.inputs["noise_multiplier"],
        ),
    )


_GAUSS_LEGENDRE = np.polynomial.legendre.leggauss(10)
_PANEL_WIDTH = 0.25  # in decades of tail probability
_LOWER_DECADES = 20  # the mass below the 1e-20 quantile contributes at most 1e-20
_UPPER_DECADES = 40  # the mass above the 1 - 1e-40 quantile contributes at most 1e-40


def _decade_panels(decades: float) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes t and weights for ``int_{log10 2}^{decades} g(t) ln(10) 10^-t dt``."""
    nodes, weights = _GAUSS_LEGENDRE
    lefts = np.arange(math.log10(2), decades, _PANEL_WIDTH)
    t = (lefts[:, None] + _PANEL_WIDTH / 2 * (nodes + 1)).ravel()
    return t, _PANEL_WIDTH / 2 * np.tile(weights, lefts.size) * math.log(10) * 10.0**-t


@lru_cache(maxsize=64)
def _beta_quadrature(d: int, r: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes b_k and weights w_k with ``E f(B) ~ sum_k w_k f(b_k)`` for ``B ~ Beta(r/2, (d-r)/2)``.

    Substituting u = F(b), the lower half u < 1/2 is integrated in ``t = -log10 u`` and the upper
    half in ``t = -log10(1 - u)``, 10-point Gauss-Legendre per quarter decade: the far tails, where
    small deltas come from, get as many nodes as the bulk. It agrees with a 5x finer rule to ~1e-13
    relative (tests compare it with adaptive quadrature).
    """
    a, b = r / 2, (d - r) / 2
    lower_t, lower_w = _decade_panels(_LOWER_DECADES)
    upper_t, upper_w = _decade_panels(_UPPER_DECADES)
    nodes = np.concatenate([betaincinv(a, b, 10.0**-lower_t), betainccinv(a, b, 10.0**-upper_t)])
    return nodes, np.concatenate([lower_w, upper_w])


def _rank_one_mixture_delta(epsilon, mu: float, d: int, r: int):
    """``E_B[delta_Gauss(eps; mu sqrt(B))]``, ``B ~ Beta(r/2, (d-r)/2)`` (vectorised over eps)."""
    epsilon = np.asarray(epsilon, float)
    if r == d:
        return gaussian.delta_for_mu(epsilon, mu)
    nodes, weights = _beta_quadrature(d, r)
    value = gaussian.delta_for_mu(epsilon[..., None], mu * np.sqrt(nodes)) @ weights
    value = np.clip(value, 0.0, 1.0)
    return value if value.ndim else float(value)


def captured_energy(rng: np.random.Generator, d: int, r: int, s: int, n: int, chunk: int = 2**22) -> np.ndarray:
    """Draw ``(|P_M u_1|^2, ..., |P_M u_s|^2)`` n times for a Haar rank-r projector P_M ([W] Lemma 17).

    Only a k x k Gram matrix is factorised, k = min(s, r). If s <= r: the frame ``U = G L^{-T}`` of a
    Gaussian ``G in R^{d x s}`` (``L L^T = G^T G``) is Haar, and with ``P_M`` the first r coordinates,
    ``U^T P_M U = L^{-1} X L^{-T}``, ``X = G_r^T G_r ~ W_s(r)``, ``G^T G = X + W_s(d - r)``.
    If s > r: ``|P_M e_j|^2 = z_j^T (Z^T Z)^{-1} z_j`` for the rows z_j of a Gaussian Z in R^{d x r},
    with ``Z^T Z = W^T W + W_r(d - s)``, W the first s rows. Returns an (n, s) array.
    """
    k = min(s, r)
    per_chunk = max(1, chunk // (k * max(s, r)))
    parts = [_captured_energy_chunk(rng, d, r, s, min(per_chunk, n - start)) for start in range(0, n, per_chunk)]
    return np.concatenate(parts)


def _standard_wishart_factor(rng: np.random.Generator, dof: int, dim: int, n: int) -> np.ndarray:
    """F with ``F F^T ~ W_dim(dof, I)``: Bartlett's triangular factor if dof >= dim, else a Gaussian dim x dof."""
    if dof < dim:
        return rng.standard_normal((n, dim, dof))
    factor = np.tril(rng.standard_normal((n, dim, dim)), -1)
    diagonal = np.sqrt(rng.chisquare(dof - np.arange(dim), size=(n, dim)))
    factor[:, np.arange(dim), np.arange(dim)] = diagonal
    return factor


def _captured_energy_chunk(rng, d, r, s, n):
    if s <= r:
        signal = _standard_wishart_factor(rng, r, s, n)  # X = F F^T, s x s
        rest = _standard_wishart_factor(rng, d - r, s, n) if d > r else np.zeros((n, s, 1))
        axis = 2  # row norms
    else:
        signal = rng.standard_normal((n, r, s))  # W^T: column j is z_j
        rest = _standard_wishart_factor(rng, d - s, r, n) if d > s else np.zeros((n, r, 1))
        axis = 1  # column norms
    gram = signal @ np.swapaxes(signal, 1, 2) + rest @ np.swapaxes(rest, 1, 2)
    whitened = np.linalg.solve(np.linalg.cholesky(gram), signal)
    return np.sum(whitened**2, axis=axis)


def _normalised_spectrum(singular_values, sensitivity: float) -> np.ndarray:
    values = np.asarray(singular_values, float).reshape(-1)
    if values.size == 0 or np.any(~np.isfinite(values)) or np.any(values < 0) or not np.any(values > 0):
        raise InvalidArgument("singular_values must be finite, >= 0, with at least one > 0")
    values = values[values > 0] / values.max()  # in (0, 1]: the sum of squares neither overflows nor underflows
    return values * (sensitivity / np.linalg.norm(values))


@dataclass(frozen=True)
class _Mixture:
    """The mixture profile of M2 for one configuration: quadrature (rank 1) or sampled (any rank)."""

    mu: float
    d: int
    r: int
    sampled: SampledMixture | None

    def delta(self, epsilon: float) -> tuple[float, tuple[float, float] | None]:
        if self.sampled is None:
            return _rank_one_mixture_delta(epsilon, self.mu, self.d, self.r), None
        estimate, lower, upper = (float(x[0]) for x in self.sampled.bands(np.array([epsilon])))
        return estimate, (lower, upper)

    def epsilon(self, delta: float) -> tuple[float, tuple[float, float] | None]:
        if self.sampled is None:
            value = solve_decreasing(
                lambda e: math.log(max(self.delta(e)[0], 1e-320)),
                math.log(delta),
                0.0,
                gaussian.epsilon_for_mu(delta, self.mu) + 1.0,
            )
            return value, None
        top = gaussian.epsilon_for_mu(min(delta, 0.5) * 1e-3, float(self.sampled.mus.max())) + 1.0
        grid = np.concatenate([[0.0], np.geomspace(1e-4, top, 255)])
        estimate, lower, upper = invert(self.sampled.bands, delta, grid)
        return estimate, (lower, upper)


def _mixture(sensitivity, sigma, d, r, singular_values, samples, seed, confidence) -> _Mixture:
    mu, d, r = _m2_inputs(sensitivity, sigma, d, r)
    spectrum = None if singular_values is None else _normalised_spectrum(singular_values, sensitivity)
    if spectrum is None or spectrum.size == 1 or r == d:
        return _Mixture(mu, d, r, None)
    if spectrum.size > d:
        raise InvalidArgument(f"Delta V has at most d = {d} non-zero singular values, got {spectrum.size}")
    rng = np.random.default_rng(check.seed("seed", seed))
    samples = check.count("samples", samples, minimum=2)
    # per sample: s captured energies (drawn in chunks), then the mixture's mu and its sorted losses
    check.allocation(
        f"the mixture bound's {samples} sampled subspaces", 8 * samples * (spectrum.size + 10), "lower --samples"
    )
    energy = captured_energy(rng, d, r, spectrum.size, samples)
    mus = np.sqrt(energy @ spectrum**2) / sigma
    return _Mixture(mu, d, r, SampledMixture(mus, gaussian.delta_for_mu, check.open_unit("confidence", confidence)))


_MIXTURE = "M2 mixture bound (docs/theory.md §2.7; joint convexity over M)"


def _mixture_inputs(mixture: _Mixture, sensitivity, sigma, singular_values, samples, seed, **query):
    return dict(
        query,
        sensitivity=sensitivity,
        sigma=sigma,
        d=mixture.d,
        r=mixture.r,
        singular_values=None if singular_values is None else [float(v) for v in np.ravel(singular_values)],
        **(dict(samples=samples, seed=seed) if mixture.sampled is not None else {}),
    )


def m2_mixture_delta(
    epsilon: float,
    sensitivity: float,
    sigma: float,
    d: int,
    r: int,
    singular_values: Sequence[float] | None = None,
    *,
    samples: int = 20000,
    seed: int = 0,
    confidence: float = 0.99,
) -> Bound:
    """Mixture bound for M2: ``delta(eps) <= E_M[delta_Gauss(eps; |P_M Delta V|_F / sigma)]`` (docs/theory.md §2.7).

    Conditioned on M the release is a Gaussian mechanism on col(M) with sensitivity ``|P_M Delta V|_F``;
    joint convexity of the hockey-stick divergence gives the bound (it is the exact profile of the
    release ``(M, M(V + Xi))``). Rank-1 Delta V (``singular_values=None``): ``|P_M u|^2 ~ Beta(r/2, (d-r)/2)``
    and the expectation is a 1-D Gauss-Legendre quadrature. Any rank: ``singular_values`` (rescaled to have l2 norm
    ``sensitivity``) and Haar subspaces sampled from ``seed``, with a confidence interval.
    """
    epsilon = check.non_negative("epsilon", epsilon)
    mixture = _mixture(sensitivity, sigma, d, r, singular_values, samples, seed, confidence)
    value, interval = mixture.delta(epsilon)
    return Bound(
        epsilon=epsilon,
        delta=value,
        neighbouring=REPLACE_ONE,
        source=_MIXTURE,
        inputs=_mixture_inputs(mixture, sensitivity, sigma, singular_values, samples, seed, epsilon=epsilon),
        delta_interval=interval,
        confidence=confidence if interval else None,
    )


def m2_mixture_epsilon(
    delta: float,
    sensitivity: float,
    sigma: float,
    d: int,
    r: int,
    singular_values: Sequence[float] | None = None,
    *,
    samples: int = 20000,
    seed: int = 0,
    confidence: float = 0.99,
) -> Bound:
    """eps(delta) of the M2 mixture bound (see :func:`m2_mixture_delta`)."""
    delta = check.open_unit("delta", delta)
    mixture = _mixture(sensitivity, sigma, d, r, singular_values, samples, seed, confidence)
    value, interval = mixture.epsilon(delta)
    inputs = _mixture_inputs(mixture, sensitivity, sigma, singular_values, samples, seed, delta=delta)
    if not math.isfinite(value):
        return inapplicable(
            _MIXTURE, REPLACE_ONE, "the sampled profile does not reach this delta", delta=delta, inputs=inputs
        )
    return Bound(
        epsilon=value,
        delta=delta,
        neighbouring=REPLACE_ONE,
        source=_MIXTURE,
        inputs=inputs,
        epsilon_interval=interval,
        confidence=confidence if interval else None,
    )


_MIXTURE_MULTISTEP = "M2 mixture bound, T resampled full-batch steps (docs/theory.md §2.7; joint convexity over the Ms)"


def m2_mixture_multistep_epsilon(
    delta: float, sensitivity: float, sigma: float, dims: Sequence[int], r: int, steps: int, *, grid: int = 4000
) -> Bound:
    """eps(delta) of the M2 mixture bound for T full-batch steps (q = 1), M_l resampled every step on every layer.

    ``dims``: the projected dimension d_l of each adapted layer, whose example change is rank 1 (one example's
    Linear-layer gradient) and jointly clipped, ``sum_l |Delta V_l|^2 <= sensitivity^2``. Given the step's Ms, the
    release is a Gaussian mechanism of ``mu_t^2 = sum_l |Delta V_l|^2 B_l / sigma^2 <= (sensitivity / sigma)^2
    max_l B_l``, ``B_l = |P_{M_l} u_l|^2 ~ Beta(r/2, (d_l - r)/2)`` independent of the past (M_l is drawn after the
    change's direction u_l). Composing the T revealed-M mixtures (f-DP composition allows the adaptivity) gives
    ``delta(eps) <= E[delta_Gauss(eps; (sensitivity / sigma) sqrt(X))]``, ``X = sum_t max_l B_tl``. X is computed
    exactly on a ``grid`` of 1/grid-wide cells per step, each max rounded up to its cell's right end (so the
    discrete X dominates the true one and, delta_Gauss increasing in mu, the bound stays an upper bound), the T
    steps convolved. One layer at T = 1 is :func:`m2_mixture_epsilon`'s quadrature, rounded up.
    """
    delta = check.open_unit("delta", delta)
    dims = [int(d) for d in dims]
    if not dims:
        raise InvalidArgument("dims must name at least one layer's projected dimension")
    mu = 0.0
    for d in dims:
        mu, _, r = _m2_inputs(sensitivity, sigma, d, r)
    steps = check.count("steps", steps)
    grid = check.count("grid", grid, minimum=2)
    edges = np.linspace(0.0, 1.0, grid + 1)
    # P(max_l B_l > x) = 1 - prod_l (1 - P(B_l > x)), in log1p form for the far tail that sets delta
    with np.errstate(divide="ignore"):  # log1p(-1) = -inf at x = 0, where the survival is 1
        survival = -np.expm1(sum(np.log1p(-betaincc(r / 2, (d - r) / 2, edges)) for d in dims))
    step_mass = survival[:-1] - survival[1:]  # mass of cell k, placed at its right end (k + 1) / grid
    mass = np.array([1.0])
    for _ in range(steps):
        mass = np.convolve(mass, step_mass)
    support = mu * np.sqrt((np.arange(mass.size) + steps) / grid)
    inputs = dict(delta=delta, sensitivity=sensitivity, sigma=sigma, dims=dims, r=r, steps=steps, grid=grid)
    value = solve_decreasing(
        lambda e: math.log(max(float(gaussian.delta_for_mu(e, support) @ mass), 1e-320)),
        math.log(delta),
        0.0,
        gaussian.epsilon_for_mu(delta, mu * math.sqrt(steps)) + 1.0,
    )
    return Bound(epsilon=value, delta=delta, neighbouring=ADD_REMOVE, source=_MIXTURE_MULTISTEP, inputs=inputs)

"""The Gaussian mechanism: exact profile, classical calibration, RDP, and the conversions of [S] Sec. 4.

Notation: sensitivity Delta, noise standard deviation sigma, ``mu = Delta / sigma``. The privacy loss
of ``f(D) + N(0, sigma^2 I)`` is ``L ~ N(mu^2/2, mu^2)`` (docs/theory.md §2.1).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.special import log_ndtr, ndtri

from accountants import validation as check
from accountants._numeric import minimize_on_grid, solve_decreasing
from accountants.result import REPLACE_ONE, Bound, Neighbouring, inapplicable
from accountants.validation import InvalidArgument

# Beyond this mu = sensitivity / sigma, eps(delta) ~ mu^2 / 2 is not a float64.
_LARGEST_MU = 1e150
_EXACT = "Gaussian exact profile (Balle & Wang 2018), docs/theory.md §2.1"


def delta_for_mu(epsilon, mu):
    """Exact profile ``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)`` (docs/theory.md §2.1).

    Vectorised over ``epsilon`` and ``mu`` (``mu = 0`` gives 0). Computed as
    ``Phi(a) * (1 - exp(eps + log Phi(b) - log Phi(a)))`` so that neither the difference of two
    tiny numbers nor ``e^eps`` loses precision or overflows.
    """
    epsilon, mu = np.broadcast_arrays(np.asarray(epsilon, float), np.asarray(mu, float))
    safe_mu = np.where(mu > 0, mu, 1.0)
    with np.errstate(over="ignore"):  # eps / mu beyond float64 (eps near 1e308): log Phi(-inf) = -inf, delta 0
        log_a = log_ndtr(-epsilon / safe_mu + safe_mu / 2)
        log_b = log_ndtr(-epsilon / safe_mu - safe_mu / 2)
    with np.errstate(invalid="ignore"):  # log_a = log_b = -inf only where the profile is 0
        delta = np.exp(log_a) * -np.expm1(np.minimum(epsilon + log_b - log_a, 0.0))
    delta = np.where((mu > 0) & np.isfinite(log_a), delta, 0.0)
    return delta if delta.ndim else float(delta)


def _representable(mu: float) -> float:
    if not mu <= _LARGEST_MU:
        raise InvalidArgument(
            f"mu = sensitivity / sigma = {mu:.3g} must be <= {_LARGEST_MU:g}: its epsilon, about mu^2 / 2, overflows "
            "(the noise gives no privacy at all); raise sigma"
        )
    return mu


def epsilon_for_mu(delta: float, mu: float) -> float:
    """Inverse of :func:`delta_for_mu` in epsilon: the smallest eps >= 0 with delta(eps) <= delta."""
    if _representable(mu) == 0:
        return 0.0
    first_guess = mu * mu / 2 - mu * ndtri(delta) + 1.0  # Phi(-eps/mu + mu/2) <= delta beyond it
    return solve_decreasing(lambda e: math.log(max(delta_for_mu(e, mu), 1e-320)), math.log(delta), 0.0, first_guess)


def _log_tail(epsilon, mu):
    """Log P(|L| > eps), L ~ N(mu^2/2, mu^2), for mu > 0; plain ufuncs, so cheap on Python floats too."""
    with np.errstate(over="ignore"):  # eps / mu beyond float64: log Phi(-inf) = -inf, the tail's true limit
        return np.logaddexp(log_ndtr((-epsilon + mu * mu / 2) / mu), log_ndtr((-epsilon - mu * mu / 2) / mu))


def privacy_loss_tail(epsilon, mu):
    """``P(|L| > eps)`` for ``L ~ N(mu^2/2, mu^2)``: [W] Sec. 4.2.1's ``T(eps; mu^2)``.

    ``T(eps; mu^2) = Phi((-eps + mu^2/2)/mu) + 1 - Phi((eps + mu^2/2)/mu)``; it bounds the exact
    profile from above and is the Gaussian term of [W] Thm 5 and the baseline of [W] Eq. (10).
    Vectorised; ``mu = 0`` gives 0 ([W]: T(eps; 0) = 0).
    """
    epsilon, mu = np.broadcast_arrays(np.asarray(epsilon, float), np.asarray(mu, float))
    tail = np.where(mu > 0, np.exp(_log_tail(epsilon, np.where(mu > 0, mu, 1.0))), 0.0)
    return tail if tail.ndim else float(tail)


def privacy_loss_tail_epsilon(tail: float, mu: float) -> float:
    """Inverse of :func:`privacy_loss_tail` in epsilon (T(0) = 1, T decreasing in eps)."""
    if _representable(mu) == 0:
        return 0.0
    first_guess = mu * mu / 2 - mu * ndtri(tail / 2) + 1.0
    return solve_decreasing(lambda e: float(_log_tail(e, mu)), math.log(tail), 0.0, first_guess)


def delta(epsilon: float, sensitivity: float, sigma: float, neighbouring: Neighbouring = REPLACE_ONE) -> Bound:
    """The exact δ at ``epsilon`` of the Gaussian mechanism (Balle & Wang 2018; docs/theory.md §2.1)."""
    epsilon = check.non_negative("epsilon", epsilon)
    mu = check.positive("sensitivity", sensitivity) / check.positive("sigma", sigma)
    return Bound(
        epsilon=epsilon,
        delta=delta_for_mu(epsilon, mu),
        neighbouring=neighbouring,
        source=_EXACT,
        inputs=dict(epsilon=epsilon, sensitivity=sensitivity, sigma=sigma),
        details=dict(mu=mu),
    )


def epsilon(delta: float, sensitivity: float, sigma: float, neighbouring: Neighbouring = REPLACE_ONE) -> Bound:
    """Exact eps(delta) of the Gaussian mechanism: inverse of the profile (docs/theory.md §2.1)."""
    delta = check.open_unit("delta", delta)
    mu = check.positive("sensitivity", sensitivity) / check.positive("sigma", sigma)
    return Bound(
        epsilon=epsilon_for_mu(delta, mu),
        delta=delta,
        neighbouring=neighbouring,
        source=_EXACT,
        inputs=dict(delta=delta, sensitivity=sensitivity, sigma=sigma),
        details=dict(mu=mu),
    )


def tail_epsilon(delta: float, sensitivity: float, sigma: float, neighbouring: Neighbouring = REPLACE_ONE) -> Bound:
    """The Gaussian baseline of [W] Eq. (10): eps solving ``T(eps; mu^2) = delta`` (looser than :func:`epsilon`)."""
    delta = check.open_unit("delta", delta)
    mu = check.positive("sensitivity", sensitivity) / check.positive("sigma", sigma)
    return Bound(
        epsilon=privacy_loss_tail_epsilon(delta, mu),
        delta=delta,
        neighbouring=neighbouring,
        source="Gaussian two-sided tail, [W] Eq. 10",
        inputs=dict(delta=delta, sensitivity=sensitivity, sigma=sigma),
        details=dict(mu=mu),
    )


def calibrate_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Smallest sigma whose exact profile satisfies delta(eps) <= delta (inverse in sigma)."""
    epsilon = check.positive("epsilon", epsilon)
    delta = check.open_unit("delta", delta)
    sensitivity = check.positive("sensitivity", sensitivity)
    # delta(eps) of the exact profile decreases as sigma grows.
    return solve_decreasing(
        lambda sigma: math.log(max(delta_for_mu(epsilon, sensitivity / sigma), 1e-320)),
        math.log(delta),
        1e-12 * sensitivity,
        sensitivity,
    )


def classical_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Classical calibration ``sigma = Delta sqrt(2 ln(1.25/delta)) / eps`` (Dwork & Roth Thm A.1; docs/theory.md §2.1).

    Only valid for eps < 1; larger eps raise InvalidArgument (use :func:`calibrate_sigma`).
    """
    epsilon = check.positive("epsilon", epsilon)
    if epsilon >= 1:
        raise InvalidArgument(
            f"epsilon must be < 1 for the classical calibration, got {epsilon}; "
            "use accountants.gaussian.calibrate_sigma for the exact one"
        )
    delta = check.open_unit("delta", delta)
    return check.positive("sensitivity", sensitivity) * math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def classical_epsilon(
    delta: float, sensitivity: float, sigma: float, neighbouring: Neighbouring = REPLACE_ONE
) -> Bound:
    """Classical ``eps = (Delta/sigma) sqrt(2 ln(1.25/delta))``, valid only when it is < 1 ([W] Lemma 1, Eq. 3)."""
    delta = check.open_unit("delta", delta)
    mu = check.positive("sensitivity", sensitivity) / check.positive("sigma", sigma)
    source = "Gaussian classical calibration (Dwork & Roth Thm A.1)"
    inputs = dict(delta=delta, sensitivity=sensitivity, sigma=sigma)
    value = mu * math.sqrt(2 * math.log(1.25 / delta))
    if value >= 1:
        return inapplicable(
            source,
            neighbouring,
            f"classical calibration needs eps < 1, it gives {value:.4g}",
            delta=delta,
            inputs=inputs,
        )
    return Bound(epsilon=value, delta=delta, neighbouring=neighbouring, source=source, inputs=inputs)


def rdp(order, sensitivity: float, sigma: float):
    """Renyi DP of the Gaussian mechanism: ``eps(alpha) = alpha Delta^2 / (2 sigma^2)`` (Mironov 2017)."""
    mu = check.positive("sensitivity", sensitivity) / check.positive("sigma", sigma)
    return np.asarray(order, float) * mu * mu / 2


def rdp_to_dp(delta: float, rdp_curve: Callable[[float], float], max_order: float = math.inf) -> tuple[float, float]:
    """RDP -> (eps, delta) [S] Prop. 4.3 (Canonne et al. 2020), optimised over the order.

    ``eps(delta) = inf_{1 < alpha < max_order} rdp(alpha) + log(1/(alpha delta))/(alpha-1) + log(1 - 1/alpha)``.
    ``rdp_curve`` may return inf outside its range. Returns ``(epsilon, best_order)``.
    """
    delta = check.open_unit("delta", delta)

    def converted(log_excess: float) -> float:
        order = 1.0 + math.exp(log_excess)
        if order >= max_order:
            return math.inf
        value = float(rdp_curve(order))
        return value + (math.log(1 / delta) - math.log(order)) / (order - 1) + math.log1p(-1 / order)

    top = math.log(max_order - 1) if math.isfinite(max_order) else math.log(1e8)
    grid = np.linspace(min(math.log(1e-8), top - 5), top, 240)
    if math.isfinite(max_order):
        grid = grid[:-1]  # orders must stay strictly below max_order
    log_excess, value = minimize_on_grid(converted, grid)
    return max(value, 0.0), 1.0 + math.exp(log_excess)


def tcdp_to_dp(delta: float, rho: float, omega: float) -> float:
    """(rho, omega)-tCDP -> (eps, delta) with both branches, [S] Prop. 4.4 (Bun et al. 2018).

    ``eps = rho + 2 sqrt(rho log(1/delta))`` if ``log(1/delta) <= (omega-1)^2 rho``,
    else ``eps = rho omega + log(1/delta)/(omega - 1)``.
    """
    delta = check.open_unit("delta", delta)
    rho = check.positive("rho", rho)
    omega = check.positive("omega", omega)
    if omega <= 1:
        raise InvalidArgument(f"omega must be > 1 for tCDP, got {omega}")
    log_inv_delta = math.log(1 / delta)
    if log_inv_delta <= (omega - 1) ** 2 * rho:
        return rho + 2 * math.sqrt(rho * log_inv_delta)
    return rho * omega + log_inv_delta / (omega - 1)


def rdp_epsilon(delta: float, sensitivity: float, sigma: float, neighbouring: Neighbouring = REPLACE_ONE) -> Bound:
    """eps(delta) of the Gaussian mechanism through its RDP curve and [S] Prop. 4.3 (looser than exact)."""
    _representable(check.positive("sensitivity", sensitivity) / check.positive("sigma", sigma))
    value, order = rdp_to_dp(delta, lambda a: rdp(a, sensitivity, sigma))
    return Bound(
        epsilon=value,
        delta=delta,
        neighbouring=neighbouring,
        source="Gaussian RDP + [S] Prop. 4.3",
        inputs=dict(delta=delta, sensitivity=sensitivity, sigma=sigma),
        details=dict(order=order),
    )

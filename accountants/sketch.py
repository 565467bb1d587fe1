"""Gaussian sketching / noisy LoRA-FA, [S] (Malekmohammadi & Farnadi): docs/theory.md §1.4, §2.8.

The release ``Q A^T + Z`` (``A ~ N(0, sigma_A^2)^{r x m}``, ``Z ~ N(0, sigma_g^2)^{n x r}``) is RDP for
orders ``alpha in (1, Gamma)`` ([S] Lemma 7.1, Eq. 12):

    eps(alpha) = r L tau / (2 (alpha - 1)) [alpha ln(1 - 1/Gamma) - ln(1 - alpha/Gamma)],

with L = 1 for a single sketch, L layers for LoRA ([S] Lemma 7.2, Eq. 15), and ``tau <= n`` the
rank of the change of the Gram matrix ([S] App. D.1: tau = tau+ + tau-). [S] Cor. 7.3 states the
tCDP guarantee with tau = n; it is stated here for any tau, since its proof only uses k = r L tau.

These guarantees are conditional on data-dependent quantities: a lower bound lambda_bar on the
smallest eigenvalue of the Gram matrix ``Q Q^T`` (of the cumulative gradient for LoRA), and for
LoRA the smoothness beta and the per-example gradient bound C. Every bound here is flagged
``conditional_on`` them; dpaudit measures lambda_bar and C from the actual run.
"""

from __future__ import annotations

import math

import numpy as np

from accountants import validation as check
from accountants.gaussian import rdp_to_dp, tcdp_to_dp
from accountants.result import REPLACE_ONE, Bound, inapplicable


def gamma_sketch(
    lambda_min: float,
    sigma_g: float,
    sigma_a: float,
    norm_bound: float,
    sensitivity: float,
    gram_sensitivity: float | None = None,
) -> float:
    """[S] Lemma 7.1: ``Gamma = (lambda_bar + sigma_g^2 / sigma_A^2) / B_C`` with ``B_C = 2 B_F B_S`` by default.

    ``gram_sensitivity`` overrides B_C, a bound on ``|Q Q^T - Q' Q'^T|_F`` (e.g. ``B_S^2`` when one
    column changes, [S] App. D.1).
    """
    lambda_min = check.non_negative("lambda_min", lambda_min)
    sigma_g = check.non_negative("sigma_g", sigma_g)
    sigma_a = check.positive("sigma_a", sigma_a)
    if gram_sensitivity is None:
        log_gram = math.log(2 * check.positive("norm_bound", norm_bound)) + math.log(
            check.positive("sensitivity", sensitivity)
        )
    else:
        log_gram = math.log(check.positive("gram_sensitivity", gram_sensitivity))
    return _gamma(np.logaddexp(_log(lambda_min), 2 * (_log(sigma_g) - math.log(sigma_a))) - log_gram)


# Gamma is computed in logs (its factors over- and underflow at extreme inputs) and capped here: a smaller Gamma is a
# weaker guarantee ([S] Eq. 12 decreases in Gamma), so the cap keeps every bound valid.
_LARGEST_GAMMA = 1e150  # Cor. 7.3 squares it


def _log(value: float) -> float:
    return math.log(value) if value > 0 else -math.inf


def _gamma(log_gamma: float) -> float:
    return math.exp(min(float(log_gamma), math.log(_LARGEST_GAMMA)))


def gamma_lora(
    lr: float,
    smoothness: float,
    batch_size: int,
    lambda_min: float,
    sigma_g: float,
    grad_bound: float,
    steps: int,
    rank: int,
) -> float:
    """[S] Lemma 7.2: ``Gamma = (eta beta / 4) b (lambda_bar + r sigma_g^2) / (C^2 T ((1 + eta beta)^T - 1))``.

    This is Lemma 7.1's Gamma with ``sigma_A^2 = 1/r``, ``B_F = T C`` and
    ``B_S = (2C/b) ((1+eta beta)^T - 1)/(eta beta)`` ([S] Eqs. 51, 54).
    """
    log_lr_smooth = math.log(check.positive("lr", lr)) + math.log(check.positive("smoothness", smoothness))
    steps = check.count("steps", steps)
    log_noise_floor = math.log(check.count("rank", rank)) + 2 * _log(check.non_negative("sigma_g", sigma_g))
    log_numerator = math.log(check.count("batch_size", batch_size)) + np.logaddexp(
        _log(check.non_negative("lambda_min", lambda_min)), log_noise_floor
    )
    log_denominator = 2 * math.log(check.positive("grad_bound", grad_bound)) + math.log(steps)
    return _gamma(_log_rate_over_growth(log_lr_smooth, steps) - math.log(4) + log_numerator - log_denominator)


def _log_rate_over_growth(log_rate: float, steps: int) -> float:
    """``log(x / ((1 + x)^T - 1))`` for ``x = e^log_rate``, without overflow (large x T) or 0/0 (tiny x)."""
    rate = math.exp(log_rate)
    if rate == 0.0:  # (1 + x)^T - 1 = T x (1 + O(x T))
        return -math.log(steps)
    exponent = steps * math.log1p(rate)
    log_growth = exponent + math.log1p(-math.exp(-exponent)) if exponent > 30 else math.log(math.expm1(exponent))
    return log_rate - log_growth


def rdp_curve(order, gamma: float, rank: int, tau: int, layers: int = 1):
    """[S] Eq. 12 / Eq. 15, vectorised over ``order``; inf outside (1, Gamma).

    ``alpha ln(1 - 1/Gamma) - ln(1 - alpha/Gamma)`` is computed with log1p: both terms are O(1/Gamma)
    and their difference O(alpha^2/Gamma^2).
    """
    order = np.asarray(order, float)
    scale = check.count("rank", rank) * check.count("layers", layers) * check.count("tau", tau) / 2
    inside = (order > 1) & (order < gamma)
    safe = np.where(inside, order, 2.0)
    bracket = safe * np.log1p(-1 / gamma) - np.log1p(-safe / gamma)
    value = np.where(inside, scale * bracket / (safe - 1), np.inf)
    return value if value.ndim else float(value)


def _conditions(lemma: str) -> tuple[str, ...]:
    if lemma == "7.1":
        return ("lambda_min(Q Q^T) >= lambda_min", "|Q|_F <= norm_bound", "|Q(D) - Q(D')|_F <= sensitivity")
    return (
        "lambda_min(G G^T) >= lambda_min for the cumulative gradient G",
        "loss is smoothness-smooth",
        "per-example gradient norm <= grad_bound",
    )


def _rdp_bound(
    delta: float,
    gamma: float,
    rank: int,
    tau: int,
    layers: int,
    source: str,
    inputs: dict,
    conditional_on: tuple[str, ...],
) -> Bound:
    delta = check.open_unit("delta", delta)
    rank, tau, layers = check.count("rank", rank), check.count("tau", tau), check.count("layers", layers)
    inputs = dict(inputs, delta=delta, gamma=gamma)
    if not gamma > 1:
        return inapplicable(
            source,
            REPLACE_ONE,
            f"{source} needs Gamma > 1, got Gamma = {gamma:.4g}",
            delta=delta,
            inputs=inputs,
            conditional_on=conditional_on,
        )
    value, order = rdp_to_dp(delta, lambda a: rdp_curve(a, gamma, rank, tau, layers), max_order=gamma)
    return Bound(
        epsilon=value,
        delta=delta,
        neighbouring=REPLACE_ONE,
        source=f"{source} + [S] Prop. 4.3",
        inputs=inputs,
        conditional_on=conditional_on,
        details=dict(gamma=gamma, order=order),
    )


def lemma71(
    delta: float,
    lambda_min: float,
    sigma_g: float,
    sigma_a: float,
    norm_bound: float,
    sensitivity: float,
    rank: int,
    tau: int,
    gram_sensitivity: float | None = None,
) -> Bound:
    """[S] Lemma 7.1 RDP of one Gaussian sketch, converted to (eps, delta) by [S] Prop. 4.3."""
    gamma = gamma_sketch(lambda_min, sigma_g, sigma_a, norm_bound, sensitivity, gram_sensitivity)
    inputs = dict(
        lambda_min=lambda_min,
        sigma_g=sigma_g,
        sigma_a=sigma_a,
        norm_bound=norm_bound,
        sensitivity=sensitivity,
        gram_sensitivity=gram_sensitivity,
        rank=rank,
        tau=tau,
    )
    return _rdp_bound(delta, gamma, rank, tau, 1, "[S] Lemma 7.1", inputs, _conditions("7.1"))


def _lora_inputs(lr, smoothness, batch_size, lambda_min, sigma_g, grad_bound, steps, rank, layers, tau):
    return dict(
        lr=lr,
        smoothness=smoothness,
        batch_size=batch_size,
        lambda_min=lambda_min,
        sigma_g=sigma_g,
        grad_bound=grad_bound,
        steps=steps,
        rank=rank,
        layers=layers,
        tau=tau,
    )


def lemma72(
    delta: float,
    lr: float,
    smoothness: float,
    batch_size: int,
    lambda_min: float,
    sigma_g: float,
    grad_bound: float,
    steps: int,
    rank: int,
    layers: int,
    tau: int,
) -> Bound:
    """[S] Lemma 7.2 RDP of LoRA-FA (final adapters of L layers released), converted by [S] Prop. 4.3."""
    gamma = gamma_lora(lr, smoothness, batch_size, lambda_min, sigma_g, grad_bound, steps, rank)
    inputs = _lora_inputs(lr, smoothness, batch_size, lambda_min, sigma_g, grad_bound, steps, rank, layers, tau)
    return _rdp_bound(delta, gamma, rank, tau, layers, "[S] Lemma 7.2", inputs, _conditions("7.2"))


def corollary73(
    delta: float,
    lr: float,
    smoothness: float,
    batch_size: int,
    lambda_min: float,
    sigma_g: float,
    grad_bound: float,
    steps: int,
    rank: int,
    layers: int,
    tau: int,
) -> Bound:
    """[S] Cor. 7.3: ``(r L tau / (2 Gamma^2), 2 Gamma / 5)``-tCDP if Gamma > 5/2, converted by [S] Prop. 4.4.

    (The paper writes tau = n, the worst case.) With the first tCDP branch this is [S]'s
    ``r L n / (2 Gamma^2) + sqrt(2 r L n log(1/delta)) / Gamma``.
    """
    delta = check.open_unit("delta", delta)
    layers, tau = check.count("layers", layers), check.count("tau", tau)
    gamma = gamma_lora(lr, smoothness, batch_size, lambda_min, sigma_g, grad_bound, steps, rank)
    inputs = dict(
        _lora_inputs(lr, smoothness, batch_size, lambda_min, sigma_g, grad_bound, steps, rank, layers, tau),
        delta=delta,
        gamma=gamma,
    )
    source = "[S] Cor. 7.3"
    if not gamma > 2.5:
        return inapplicable(
            source,
            REPLACE_ONE,
            f"[S] Cor. 7.3 needs Gamma > 5/2, got Gamma = {gamma:.4g}",
            delta=delta,
            inputs=inputs,
            conditional_on=_conditions("7.2"),
        )
    rho = check.count("rank", rank) * check.count("layers", layers) * check.count("tau", tau) / (2 * gamma**2)
    omega = 2 * gamma / 5
    return Bound(
        epsilon=tcdp_to_dp(delta, rho, omega),
        delta=delta,
        neighbouring=REPLACE_ONE,
        source=f"{source} + [S] Prop. 4.4",
        inputs=inputs,
        conditional_on=_conditions("7.2"),
        details=dict(gamma=gamma, rho=rho, omega=omega),
    )

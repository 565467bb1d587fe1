"""Intrinsic noise energy of factor-space DP-LoRA vs PRISM ([P] Prop. 2.2, Cor. 2.3, Thm 3.1, Figs. 2-3).

Diagnostics for ``experiments/prism_noise_energy.py`` and the tests: per-draw energies measured by r×r traces,
their closed forms, and a sweep over the scalar gauges ``(cA, B/c)``; the analytic expectations are in
:mod:`accountants.prism`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from accountants import validation as check
from dpaudit.errors import UsageError
from dpaudit.mechanisms.prism.tangent import (
    TangentLift,
    _check_factors,
    _intrinsic_sq_norm,
    _standard_normal,
    sample_tangent_noise,
)


def factor_norm_statistic(A: Tensor, B: Tensor) -> Tensor:
    """``S_t = m‖B‖_F² + n‖A‖_F²`` ([P] Eq. 8, Sec. 4); factor-space noise energy is ``τ² S_t``. Sum over modules."""
    _check_factors(A, B)
    return A.shape[-2] * B.square().sum((-2, -1)) + B.shape[-2] * A.square().sum((-2, -1))


def prism_noise_energy_closed_form(m: int, n: int, rank: int, noise_std: float) -> float:
    """``E‖(σC/b) P(Ξ)‖_F² = (σC/b)² r(m+n−r)`` ([P] Thm 3.1, Eq. 20; Eq. 21 is its square root)."""
    return noise_std**2 * rank * (m + n - rank)


class SampledFactorNoiseEnergy(NamedTuple):
    """Per-draw energies of factor-space DP-LoRA noise ([P] Prop. 2.2), numpy, one entry per draw.

    ``first_order = ‖ξ_A Bᵀ + A ξ_Bᵀ‖²``, ``bilinear = ‖ξ_A ξ_Bᵀ‖²``, ``total = ‖ξ_A Bᵀ + A ξ_Bᵀ + ξ_A ξ_Bᵀ‖²`` .
    """

    first_order: np.ndarray
    bilinear: np.ndarray
    total: np.ndarray


def factor_space_noise_energy(
    A: Tensor, B: Tensor, noise_std: float, num_draws: int, generator: torch.Generator
) -> SampledFactorNoiseEnergy:
    """Sample ``ξ_A, ξ_B`` i.i.d. ``N(0, τ²)`` and measure the induced intrinsic noise by r×r traces.

    τ = ``noise_std`` per factor entry, step size included. Expectations (Eqs. 8-9): ``τ² S_t`` and ``mnr τ⁴``.
    Draw order: ξ_A (num_draws, m, r) then ξ_B (num_draws, n, r) from ``generator``. Unbatched A, B.
    """
    _check_factors(A, B)
    check.non_negative("noise_std", noise_std)
    check.count("num_draws", num_draws)
    if A.ndim != 2:
        raise UsageError("factor_space_noise_energy takes unbatched A (m, r), B (n, r)")
    xi_A = noise_std * _standard_normal((num_draws, *A.shape), generator, A)
    xi_B = noise_std * _standard_normal((num_draws, *B.shape), generator, B)
    first = _intrinsic_sq_norm(TangentLift(xi_A, xi_B), A, B, A.mT @ A, B.mT @ B)
    gram_xi_A, gram_xi_B = xi_A.mT @ xi_A, xi_B.mT @ xi_B
    bilinear = (gram_xi_A * gram_xi_B).sum((-2, -1))  # tr(ξ_AᵀΞ_A ξ_Bᵀξ_B), both symmetric
    # <ξ_A Bᵀ + A ξ_Bᵀ, ξ_A ξ_Bᵀ> = tr(ξ_Aᵀξ_A ξ_BᵀB) + tr(Aᵀξ_A ξ_Bᵀξ_B)
    cross = (gram_xi_A * (xi_B.mT @ B).mT).sum((-2, -1)) + ((A.mT @ xi_A) * gram_xi_B).sum((-2, -1))
    to_numpy = lambda t: t.detach().cpu().double().numpy()  # noqa: E731
    return SampledFactorNoiseEnergy(to_numpy(first), to_numpy(bilinear), to_numpy(first + bilinear + 2.0 * cross))


def prism_noise_energy(
    A: Tensor, B: Tensor, noise_std: float, num_draws: int, generator: torch.Generator
) -> np.ndarray:
    """Per-draw ``‖(σC/b)(Ξ_A Bᵀ + A Ξ_Bᵀ)‖_F²`` from the Eq. 19 sampler (numpy); mean → Thm 3.1's closed form."""
    check.non_negative("noise_std", noise_std)
    check.count("num_draws", num_draws)
    if A.ndim != 2:
        raise UsageError("prism_noise_energy takes unbatched A (m, r), B (n, r)")
    noise = sample_tangent_noise(A, B, generator, (num_draws,))
    energy = noise_std**2 * _intrinsic_sq_norm(noise, A, B, A.mT @ A, B.mT @ B)
    return energy.detach().cpu().double().numpy()


@dataclass(frozen=True)
class GaugeSweepNoiseEnergy:
    """Mean intrinsic noise energies at gauges ``(c A, B / c)`` ([P] Figs. 2-3, Cor. 2.3), one entry per c."""

    gauges: np.ndarray
    factor_norm_statistic: np.ndarray  # S_t = m‖B_c‖² + n‖A_c‖²
    factor_first_order: np.ndarray  # measured mean ‖ξ_A B_cᵀ + A_c ξ_Bᵀ‖²
    factor_bilinear: np.ndarray  # measured mean ‖ξ_A ξ_Bᵀ‖²
    factor_total: np.ndarray  # measured mean of the full factor-space perturbation
    factor_first_order_predicted: np.ndarray  # τ² S_t (Eq. 8)
    factor_bilinear_predicted: np.ndarray  # m n r τ⁴ (Eq. 9)
    prism: np.ndarray  # measured mean PRISM energy
    prism_closed_form: np.ndarray  # τ² r (m + n − r) (Thm 3.1)


def gauge_sweep_noise_energy(
    A: Tensor, B: Tensor, gauges: Sequence[float], noise_std: float, num_draws: int, generator: torch.Generator
) -> GaugeSweepNoiseEnergy:
    """Factor-space DP-LoRA vs PRISM intrinsic noise energy over the scalar gauge family ``(cA, B/c)`` (same Z).

    Per gauge, in order: factor-space draws then PRISM draws from ``generator``. Factor-space energy grows
    linearly in S_t (unbounded in c, Cor. 2.3); PRISM's is the gauge-free ``τ² r(m+n−r)``.
    """
    _check_factors(A, B)
    if len(gauges) == 0:
        raise UsageError("gauges must be a non-empty sequence of positive numbers; got an empty one")
    gauges = [check.positive(f"gauges[{index}]", c) for index, c in enumerate(gauges)]
    m, n, rank = A.shape[-2], B.shape[-2], A.shape[-1]
    rows = []
    for c in gauges:
        A_c, B_c = c * A, B / c
        factor = factor_space_noise_energy(A_c, B_c, noise_std, num_draws, generator)
        prism = prism_noise_energy(A_c, B_c, noise_std, num_draws, generator)
        statistic = float(factor_norm_statistic(A_c, B_c))
        rows.append(
            (
                c,
                statistic,
                factor.first_order.mean(),
                factor.bilinear.mean(),
                factor.total.mean(),
                noise_std**2 * statistic,
                m * n * rank * noise_std**4,
                prism.mean(),
                prism_noise_energy_closed_form(m, n, rank, noise_std),
            )
        )
    return GaugeSweepNoiseEnergy(*(np.array(column, dtype=np.float64) for column in zip(*rows)))


def linear_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least-squares ``y ≈ slope·x + intercept``; returns (slope, intercept, R²)."""
    x, y = check.finite_array("x", x, ndim=1), check.finite_array("y", y, ndim=1)
    if x.shape != y.shape or x.size < 3:
        raise UsageError(f"x and y must have equal lengths >= 3; got shapes {x.shape} and {y.shape}")
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (slope * x + intercept)
    total = np.sum((y - y.mean()) ** 2)
    r_squared = 1.0 - np.sum(residual**2) / total if total > 0 else 1.0
    return float(slope), float(intercept), float(r_squared)

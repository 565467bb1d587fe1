"""Intrinsic noise energy of private LoRA updates, [P] (PRISM): docs/theory.md §1.6, §2.9.

Notation of [P]: ``Z = A B^T`` with ``A in R^{m x r}``, ``B in R^{n x r}`` (for peft, ``A = lora_B.weight``
and ``B = lora_A.weight^T``, docs/theory.md §0). The effective intrinsic noise of a random perturbation N_Z of
Z is ``E_Z = sqrt(E |N_Z|_F^2)`` ([P] Def. 2.1).

Privacy itself is DP-SGD accounting: each PRISM step is a Poisson-subsampled Gaussian mechanism
with multiplier sigma on the intrinsic update ([P] Thm 3.4), see :func:`accountants.dpsgd.epsilon`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from accountants import validation as check
from accountants.validation import InvalidArgument

_LARGEST_SCALE = 1e60


def _layer(m, n, r) -> tuple[int, int, int]:
    m, n, r = check.count("m", m), check.count("n", n), check.count("r", r)
    if r > min(m, n):
        raise InvalidArgument(f"r must be <= min(m, n) = {min(m, n)} for a rank-r factorisation, got r={r}")
    return m, n, r


def intrinsic_noise_energy(noise_multiplier: float, clip: float, batch_size: float, m: int, n: int, r: int) -> float:
    """[P] Thm 3.1, Eq. 21: ``E_Z^PRISM = (sigma C / b) sqrt(r (m + n - r))``.

    ``r (m + n - r)`` is the dimension of the tangent space of rank-r m x n matrices, and
    ``E |P_{A,B}(Xi)|_F^2`` for a standard Gaussian Xi ([P] Eq. 20); b is the expected batch size.
    """
    m, n, r = _layer(m, n, r)
    scale = (
        check.real_in("noise_multiplier", noise_multiplier, 0.0, _LARGEST_SCALE, low_open=True)
        * check.real_in("clip", clip, 0.0, _LARGEST_SCALE, low_open=True)
        / check.real_in("batch_size", batch_size, 1 / _LARGEST_SCALE, _LARGEST_SCALE)
    )
    return scale * math.sqrt(r * (m + n - r))


@dataclass(frozen=True)
class FactorNoiseEnergy:
    """Expected squared intrinsic noise of factor-space noising, split as in [P] Prop. 2.2.

    ``first_order = E|xi_A B^T + A xi_B^T|_F^2 = tau^2 (m |B|_F^2 + n |A|_F^2)`` (Eq. 8),
    ``bilinear = E|xi_A xi_B^T|_F^2 = m n r tau^4`` (Eq. 9); the cross terms have mean 0, so the
    total is their sum. ``effective`` is [P] Def. 2.1's ``sqrt(total)``.
    """

    first_order: float
    bilinear: float

    @property
    def total(self) -> float:
        return self.first_order + self.bilinear

    @property
    def effective(self) -> float:
        return math.sqrt(self.total)


def factor_noise_energy(
    tau: float, m: int, n: int, r: int, a_frobenius: float, b_frobenius: float
) -> FactorNoiseEnergy:
    """[P] Prop. 2.2 for i.i.d. ``N(0, tau^2)`` noise on both factors ``A (m x r)`` and ``B (n x r)``.

    Under the gauge ``(cA, B/c)`` the first-order energy is ``tau^2 (m |B|^2/c^2 + n c^2 |A|^2)``,
    unbounded in c ([P] Cor. 2.3), while the PRISM energy does not depend on the factors.
    """
    m, n, r = _layer(m, n, r)
    # tau^4 m n r and the squared norms must stay float64 numbers
    tau = check.real_in("tau", tau, 0.0, _LARGEST_SCALE, low_open=True)
    a_sq = check.real_in("a_frobenius", a_frobenius, 0.0, _LARGEST_SCALE) ** 2
    b_sq = check.real_in("b_frobenius", b_frobenius, 0.0, _LARGEST_SCALE) ** 2
    return FactorNoiseEnergy(first_order=tau**2 * (m * b_sq + n * a_sq), bilinear=m * n * r * tau**4)

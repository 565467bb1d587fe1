"""PRISM's geometry: the tangent space of rank-r matrices at ``Z = A Bᵀ`` in factor coordinates ([P] Eqs. 11-16, 19).

Notation of [P] (docs/theory.md §0): a LoRA module's intrinsic update is ``Z = A Bᵀ`` with ``A ∈ R^{m×r}``,
``B ∈ R^{n×r}``, ``M = AᵀA``, ``N = BᵀB`` (peft's tensors map to them through
:class:`dpaudit.mechanisms.prism.PeftLoraAdapter`). This module holds the tangent projection, the canonical lift of
factor gradients, the intrinsic norm and the tangent noise sampler; :mod:`dpaudit.mechanisms.prism.update` builds
[P] Alg. 1's update from them.

Shapes. Every tensor may carry leading batch dims ``...`` (the engine stacks K shadow models), broadcast with
torch's rules. Per-example tensors carry one more dim, the example axis, right before the matrix dims:
``(..., b, m, r)``. All algebra is done on r×r matrices (QR of m×r / n×r factors, SVD of r×r cores); no m×n
matrix is ever decomposed, and none is formed except by the helpers that return a dense matrix on purpose
(:func:`tangent_project`, :func:`tangent_matrix`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from accountants import validation as check
from dpaudit.errors import UsageError

Generators = torch.Generator | Sequence[torch.Generator]  # one generator, or one per model (row-major)


# --------------------------------------------------------------------------------------------------------------
# Containers
# --------------------------------------------------------------------------------------------------------------


class LoraFactors(NamedTuple):
    """LoRA factors of [P]: ``Z = A Bᵀ``; A (..., m, r), B (..., n, r)."""

    A: Tensor
    B: Tensor


class FactorGradients(NamedTuple):
    """Factor gradients ``g_A = G B`` (..., m, r) and ``g_B = Gᵀ A`` (..., n, r) of ``G = ∇_Z ℓ`` ([P] Sec. 3)."""

    g_A: Tensor
    g_B: Tensor


class TangentLift(NamedTuple):
    """A factor-space representative (ΔA, ΔB) of the tangent matrix ``ΔZ = ΔA Bᵀ + A ΔBᵀ`` ([P] Eq. 11)."""

    dA: Tensor
    dB: Tensor


# --------------------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------------------


def _require_matrix(name: str, value) -> None:
    if not isinstance(value, Tensor):
        raise UsageError(f"{name} must be a torch.Tensor; got {type(value).__name__}")
    if value.ndim < 2:
        raise UsageError(f"{name} must have shape (..., rows, cols); got shape {tuple(value.shape)}")
    if not value.dtype.is_floating_point:
        raise UsageError(f"{name} must be a real floating tensor (float32 or float64); got {value.dtype}")


def _batch_shape(**tensors_with_batch: tuple[Tensor, int]) -> torch.Size:
    """Broadcast batch shape of tensors given as ``name=(tensor, number of trailing non-batch dims)``."""
    try:
        return torch.broadcast_shapes(*(t.shape[: t.ndim - k] for t, k in tensors_with_batch.values()))
    except RuntimeError:
        shapes = ", ".join(f"{name} {tuple(t.shape)}" for name, (t, _) in tensors_with_batch.items())
        raise UsageError(f"leading (batch) dims do not broadcast: {shapes}; stack the same models in each") from None


def _check_factors(A: Tensor, B: Tensor) -> None:
    _require_matrix("A", A)
    _require_matrix("B", B)
    if A.dtype != B.dtype or A.device != B.device:
        raise UsageError(f"A and B must share dtype and device; got {A.dtype}/{A.device} and {B.dtype}/{B.device}")
    if A.shape[-1] != B.shape[-1]:
        raise UsageError(
            f"A (..., m, r) and B (..., n, r) must have the same rank r; got A {tuple(A.shape)}, B {tuple(B.shape)}"
        )
    for name, factor in (("A", A), ("B", B)):
        if factor.shape[-2] < factor.shape[-1]:
            raise UsageError(
                f"{name} has {factor.shape[-2]} rows < rank {factor.shape[-1]}: a rank-r factor needs "
                f"at least r rows; lower the LoRA rank"
            )
    _batch_shape(A=(A, 2), B=(B, 2))


def _check_like(name: str, value: Tensor, like_name: str, like: Tensor, extra_dims: int = 0) -> None:
    """``value`` has ``like``'s matrix shape, dtype and device, and broadcastable batch dims."""
    _require_matrix(name, value)
    if value.shape[-2:] != like.shape[-2:] or value.dtype != like.dtype or value.device != like.device:
        raise UsageError(
            f"{name} must match {like_name}'s matrix shape {tuple(like.shape[-2:])}, dtype {like.dtype} "
            f"and device {like.device}; got shape {tuple(value.shape)}, {value.dtype}, {value.device}"
        )
    if value.ndim < 2 + extra_dims:
        raise UsageError(
            f"{name} needs an example axis: shape (..., b, {', '.join(map(str, like.shape[-2:]))}); "
            f"got {tuple(value.shape)}"
        )
    _batch_shape(**{name: (value, 2 + extra_dims), like_name: (like, 2)})


def _as_pair(kind, value, name: str):
    """Accept a plain 2-tuple where a LoraFactors / FactorGradients / TangentLift is expected."""
    if isinstance(value, Tensor) or len(value) != 2:
        raise UsageError(f"{name} must be a pair of tensors ({', '.join(kind._fields)}); got {type(value).__name__}")
    return kind(*value)


# --------------------------------------------------------------------------------------------------------------
# Products of factor-shaped matrices
# --------------------------------------------------------------------------------------------------------------


def _times(tall: Tensor, small: Tensor) -> Tensor:
    """``tall @ small`` for a factor-shaped (..., d, r) ``tall`` and a (..., r, k) ``small``, computed transposed.

    ``(smallᵀ tallᵀ)ᵀ``: the result is column-major (its (..., k, d) transpose is contiguous). MKL multiplies K
    small k×r by r×d matrices several times faster than K d×r by r×k ones (K = 64, d = 128, r = k = 8: 30 vs
    95 µs per batch, either layout of ``tall``), and a column-major operand keeps the next such product fast.
    """
    return (small.mT @ tall.mT).mT


def _add_product(values: Tensor, tall: Tensor, small: Tensor, alpha: float) -> Tensor:
    """``values + alpha · tall @ small`` for values (..., d, k), factor-shaped tall (..., d, r), small (..., r, k).

    For the engine's stacked (K, d, r) factors the sum is made inside the GEMM (``baddbmm``, in :func:`_times`'s
    orientation): one pass over the d-row matrices fewer than a product and a separate sum (K = 64, d = 128, r = 8:
    34 vs 51 µs). Other shapes (broadcast or unbatched operands) take the plain product and sum.
    """
    if values.ndim == tall.ndim == small.ndim == 3 and values.shape[0] == tall.shape[0] == small.shape[0]:
        return torch.baddbmm(values.mT, small.mT, tall.mT, alpha=alpha).mT
    return values + alpha * _times(tall, small)


# --------------------------------------------------------------------------------------------------------------
# Geometry of the factors: projectors and Gram inverses from QR + r×r SVD
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ColumnGeometry:
    """One factor X (..., d, r): orthonormal basis Q of col(X), ``R = QᵀX``, Gram ``XᵀX`` and its inverse powers.

    ``Π_X = Q Qᵀ`` ([P] Lemma A.18); from ``X = Q R`` and ``R = U S Vᵀ`` (r×r): ``XᵀX = V S² Vᵀ``,
    ``(XᵀX)^{-1} = V S^{-2} Vᵀ``, ``(XᵀX)^{-1/2} = V S^{-1} Vᵀ`` (symmetric, as Lemma A.17 requires). Full column
    rank makes ``† = ^{-1}``. Q is any orthonormal basis of col(X) (R need not be triangular).
    """

    factor: Tensor
    basis: Tensor
    coordinates: Tensor
    gram: Tensor
    gram_inverse: Tensor
    gram_inverse_sqrt: Tensor

    def project(self, values: Tensor) -> Tensor:
        """``Π_X Y = Q (Qᵀ Y)`` without forming the d×d projector."""
        return _times(self.basis, self.basis.mT @ values)

    def project_out(self, values: Tensor, scale: float = 1.0) -> Tensor:
        """``Y − scale · Π_X Y``, the subtraction fused into the product (:func:`_add_product`)."""
        return _add_product(values, self.basis, self.basis.mT @ values, -scale)


def _column_geometry(name: str, factor: Tensor) -> _ColumnGeometry:
    basis, triangular = torch.linalg.qr(factor)
    _, singular_values, right_vectors_t = torch.linalg.svd(triangular)
    return _geometry_from_svd(name, factor, basis, triangular, singular_values, right_vectors_t.mT)


def _geometry_from_svd(
    name: str, factor: Tensor, basis: Tensor, coordinates: Tensor, singular_values: Tensor, right_vectors: Tensor
) -> _ColumnGeometry:
    """The geometry of ``factor = basis @ coordinates`` given ``coordinates = U diag(singular_values) Vᵀ``."""
    _check_full_rank(name, factor, singular_values)
    powers = singular_values.unsqueeze(-2)
    return _ColumnGeometry(
        factor=factor,
        basis=basis,
        coordinates=coordinates,
        gram=(right_vectors * powers**2) @ right_vectors.mT,
        gram_inverse=(right_vectors / powers**2) @ right_vectors.mT,
        gram_inverse_sqrt=(right_vectors / powers) @ right_vectors.mT,
    )


def _check_full_rank(name: str, factor: Tensor, singular_values: Tensor) -> None:
    """Refuse a factor whose smallest singular value (of the descending ``singular_values``) is 0 to rounding."""
    tolerance = singular_values[..., :1] * max(factor.shape[-2:]) * torch.finfo(factor.dtype).eps
    if bool((singular_values[..., -1:] <= tolerance).any()):  # also catches X = 0 (tolerance 0)
        worst = singular_values[..., -1].min().item()
        raise UsageError(
            f"{name} is rank-deficient (smallest singular value {worst:.3g}); PRISM needs both LoRA "
            f"factors of full column rank r ([P] Thm 3.1). peft's lora_B = 0 start is rank 0: "
            f"initialise both factors, e.g. with balanced_random_factors"
        )


def _geometry(factors: LoraFactors) -> tuple[_ColumnGeometry, _ColumnGeometry]:
    A, B = factors
    _check_factors(A, B)
    return _column_geometry("A", A), _column_geometry("B", B)


def balanced_random_factors(
    m: int, n: int, rank: int, spectral_norm: float, generator: torch.Generator, dtype: torch.dtype = torch.float32
) -> LoraFactors:
    """Full-rank balanced start ``A = √c Q_A``, ``B = √c Q_B`` with Haar-random orthonormal Q (QR of Gaussians).

    ``Z = c Q_A Q_Bᵀ`` has all r singular values equal to ``c = spectral_norm``, ``AᵀA = BᵀB = c I``. PRISM needs
    full-rank factors ([P] Thm 3.1); a small c keeps the model close to its base function.
    """
    m, n = check.count("m", m), check.count("n", n)
    rank = check.integer("rank", rank, 1, min(m, n))
    check.positive("spectral_norm", spectral_norm)

    def haar_basis(rows: int) -> Tensor:
        basis, triangular = torch.linalg.qr(
            torch.randn((rows, rank), generator=generator, dtype=dtype, device=generator.device)
        )
        # Fixing the signs of diag(R) makes Q exactly Haar-distributed and a function of the draw alone.
        return basis * torch.sign(torch.diagonal(triangular)).unsqueeze(0)

    basis_A = haar_basis(m)
    return LoraFactors(math.sqrt(spectral_norm) * basis_A, math.sqrt(spectral_norm) * haar_basis(n))


# --------------------------------------------------------------------------------------------------------------
# Tangent projection, lift and intrinsic norm ([P] Eqs. 12-16)
# --------------------------------------------------------------------------------------------------------------


def _check_dense_gradient(G: Tensor, A: Tensor, B: Tensor) -> None:
    _check_factors(A, B)
    _require_matrix("G", G)
    if G.shape[-2:] != (A.shape[-2], B.shape[-2]) or G.dtype != A.dtype or G.device != A.device:
        raise UsageError(
            f"G must have shape (..., m, n) = (..., {A.shape[-2]}, {B.shape[-2]}) and A's dtype and "
            f"device; got {tuple(G.shape)}, {G.dtype}, {G.device}"
        )
    _batch_shape(G=(G, 2), A=(A, 2), B=(B, 2))


def factor_gradients(G: Tensor, A: Tensor, B: Tensor) -> FactorGradients:
    """Chain rule of [P] Sec. 3: ``g_A = G B``, ``g_B = Gᵀ A`` for a dense ``G = ∇_Z ℓ`` (..., m, n)."""
    _check_dense_gradient(G, A, B)
    return FactorGradients(G @ B, G.mT @ A)


def tangent_project(G: Tensor, A: Tensor, B: Tensor) -> Tensor:
    """Orthogonal projection onto ``T_Z M_r`` ([P] Eqs. 12-13): ``P(G) = Π_A G + G Π_B − Π_A G Π_B``.

    ``Π_A = A M† Aᵀ``, ``Π_B = B N† Bᵀ`` depend only on col(A), col(B), so P is gauge invariant ([P] Lemma A.12).
    Dense (..., m, n) output at O(mnr) cost, for checks and small layers; PRISM itself works on lifts.
    """
    _check_dense_gradient(G, A, B)
    geometry_A, geometry_B = _geometry(LoraFactors(A, B))
    left = geometry_A.project(G)  # Π_A G
    return left + geometry_B.project((G - left).mT).mT  # Π_A G + (I − Π_A) G Π_B


def _lift(gradients: FactorGradients, geometry_A: _ColumnGeometry, geometry_B: _ColumnGeometry) -> TangentLift:
    scaled_A = _times(gradients.g_A, geometry_B.gram_inverse)  # g_A N†
    scaled_B = _times(gradients.g_B, geometry_A.gram_inverse)  # g_B M†
    return TangentLift(geometry_A.project_out(scaled_A, 0.5), geometry_B.project_out(scaled_B, 0.5))


def lift_factor_gradients(gradients: FactorGradients, factors: LoraFactors) -> TangentLift:
    """Canonical lift of [P] Eq. 14 from factor gradients.

    ``ΔA = g_A N† − ½ Π_A (g_A N†)``, ``ΔB = g_B M† − ½ Π_B (g_B M†)``; ``ΔA Bᵀ + A ΔBᵀ = P(G)`` ([P] Lemma A.14).

    ``gradients`` (..., m, r), (..., n, r) broadcast against ``factors``; for per-example gradients
    (..., b, m, r) pass factors with the example axis inserted (``A.unsqueeze(-3)``).
    """
    factors = _as_pair(LoraFactors, factors, "factors")
    gradients = _as_pair(FactorGradients, gradients, "gradients")
    _check_factors(*factors)
    _check_like("g_A", gradients.g_A, "A", factors.A)
    _check_like("g_B", gradients.g_B, "B", factors.B)
    return _lift(gradients, *_geometry(factors))


def lift(G: Tensor, A: Tensor, B: Tensor) -> TangentLift:
    """[P] Eq. 14 for a dense intrinsic gradient ``G`` (..., m, n): the lift of ``g_A = G B``, ``g_B = Gᵀ A``."""
    return lift_factor_gradients(factor_gradients(G, A, B), LoraFactors(A, B))


def tangent_matrix(lift_: TangentLift, factors: LoraFactors) -> Tensor:
    """Dense ``ΔZ = ΔA Bᵀ + A ΔBᵀ`` (..., m, n) ([P] Eq. 11), O(mnr); for checks and small layers."""
    (dA, dB), (A, B) = _as_pair(TangentLift, lift_, "lift_"), _as_pair(LoraFactors, factors, "factors")
    return dA @ B.mT + A @ dB.mT


def _intrinsic_sq_norm(lift_: TangentLift, A: Tensor, B: Tensor, gram_A: Tensor, gram_B: Tensor) -> Tensor:
    dA, dB = lift_
    # tr(XᵀX S) = Σ (X S) ∘ X for symmetric S; tr(P Q) = Σ P ∘ Qᵀ.
    term_A = ((dA @ gram_B) * dA).sum((-2, -1))
    term_B = ((dB @ gram_A) * dB).sum((-2, -1))
    cross = ((A.mT @ dA) * (B.mT @ dB).mT).sum((-2, -1))
    return term_A + term_B + 2.0 * cross


def intrinsic_sq_norm(lift_: TangentLift, factors: LoraFactors) -> Tensor:
    """``‖ΔA Bᵀ + A ΔBᵀ‖_F²`` through r×r traces ([P] Eq. 15, Prop. A.15), shape = broadcast batch shape.

    ``tr(ΔAᵀΔA N) + tr(ΔBᵀΔB M) + 2 tr((AᵀΔA)(BᵀΔB))``. Valid for any pair (ΔA, ΔB), not only lifts.
    """
    lift_, factors = _as_pair(TangentLift, lift_, "lift_"), _as_pair(LoraFactors, factors, "factors")
    _check_factors(*factors)
    _check_like("dA", lift_.dA, "A", factors.A)
    _check_like("dB", lift_.dB, "B", factors.B)
    A, B = factors
    return _intrinsic_sq_norm(lift_, A, B, A.mT @ A, B.mT @ B)


FactorSqNorm = Callable[[str, Tensor | None, Tensor], Tensor]


def _tangent_sq_norms(factor_sq_norm: FactorSqNorm, geometry_A: _ColumnGeometry, geometry_B: _ColumnGeometry) -> Tensor:
    """Per-example ``‖P(G_i)‖_F²`` (= Eq. 15 of the lift, Lemma A.14) from norms of the factor gradients only.

    ``P(G) = Π_A G + (I − Π_A) G Π_B`` is an orthogonal sum, so ``‖P(G)‖² = ‖Π_A G‖² + ‖G Π_B‖² − ‖Π_A G Π_B‖²``,
    and with ``g_A = G B``, ``g_B = Gᵀ A``, ``Π_A = Q_A Q_Aᵀ``: ``‖Π_A G‖ = ‖g_B M^{-1/2}‖``, ``‖G Π_B‖ =
    ‖g_A N^{-1/2}‖``, ``‖Π_A G Π_B‖ = ‖Q_Aᵀ g_A N^{-1/2}‖``. No per-example lift is
    formed: clipping only needs these norms, and the clipped sum is lifted once (the lift is linear).
    ``factor_sq_norm(factor, left, right)`` returns ``‖left · g_{factor,i} · right‖_F²`` per example (``factor``
    "A" or "B"; left None = I).
    """
    return (
        factor_sq_norm("B", None, geometry_A.gram_inverse_sqrt)
        + factor_sq_norm("A", None, geometry_B.gram_inverse_sqrt)
        - factor_sq_norm("A", geometry_A.basis.mT, geometry_B.gram_inverse_sqrt)
    )


def _per_example_factor_sq_norm(gradients: FactorGradients) -> FactorSqNorm:
    """:data:`FactorSqNorm` of materialised per-example factor gradients (..., b, m, r), (..., b, n, r)."""

    def factor_sq_norm(factor: str, left: Tensor | None, right: Tensor) -> Tensor:
        values = gradients.g_A if factor == "A" else gradients.g_B
        if left is not None:
            values = left.unsqueeze(-3) @ values
        return (values @ right.unsqueeze(-3)).square().sum((-2, -1))

    return factor_sq_norm


# --------------------------------------------------------------------------------------------------------------
# Tangent noise ([P] Eq. 19, Thm 3.1)
# --------------------------------------------------------------------------------------------------------------


def _standard_normal(shape: Sequence[int], generator: torch.Generator, like: Tensor) -> Tensor:
    return torch.randn(tuple(shape), generator=generator, dtype=like.dtype, device=generator.device).to(like.device)


def _draw_omegas(A: Tensor, B: Tensor, generator: Generators, sample_shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """``Ω_A`` (*sample_shape, ..., m, r) and ``Ω_B`` (*sample_shape, ..., n, r), standard normal.

    One generator: Ω_A of the whole batch, then Ω_B. A sequence: generator k (row-major over the batch dims)
    draws its model's Ω_A (*sample_shape, m, r) then Ω_B (*sample_shape, n, r).
    """
    batch_shape = _batch_shape(A=(A, 2), B=(B, 2))
    shape_A, shape_B = (*A.shape[-2:],), (*B.shape[-2:],)
    if isinstance(generator, torch.Generator):
        omega_A = _standard_normal((*sample_shape, *batch_shape, *shape_A), generator, A)
        return omega_A, _standard_normal((*sample_shape, *batch_shape, *shape_B), generator, B)
    generators = list(generator)
    if not all(isinstance(g, torch.Generator) for g in generators):
        raise UsageError("generator must be a torch.Generator or a sequence of torch.Generator (one per model)")
    if len(batch_shape) == 0 or len(generators) != math.prod(batch_shape):
        raise UsageError(
            f"got {len(generators)} generators for factors with batch shape {tuple(batch_shape)}: pass "
            f"one generator per model (prod of the batch dims), or a single torch.Generator"
        )
    per_model = [
        (_standard_normal((*sample_shape, *shape_A), g, A), _standard_normal((*sample_shape, *shape_B), g, B))
        for g in generators
    ]
    axis = len(sample_shape)
    omega_A = torch.stack([a for a, _ in per_model], axis).reshape(*sample_shape, *batch_shape, *shape_A)
    omega_B = torch.stack([b for _, b in per_model], axis).reshape(*sample_shape, *batch_shape, *shape_B)
    return omega_A, omega_B


def _tangent_noise(
    omegas: tuple[Tensor, Tensor], geometry_A: _ColumnGeometry, geometry_B: _ColumnGeometry
) -> TangentLift:
    omega_A, omega_B = omegas
    xi_A = _times(geometry_A.project_out(omega_A), geometry_B.gram_inverse_sqrt)  # (I − Π_A) Ω_A N^{-1/2}
    xi_B = _times(omega_B, geometry_A.gram_inverse_sqrt)  # Ω_B M^{-1/2}
    return TangentLift(xi_A, xi_B)


def sample_tangent_noise(A: Tensor, B: Tensor, generator: Generators, sample_shape: Sequence[int] = ()) -> TangentLift:
    """Low-dimensional sampler of [P] Eq. 19: ``Ξ_A = (I − Π_A) Ω_A N^{-1/2}``, ``Ξ_B = Ω_B M^{-1/2}``.

    The induced ``Ξ_A Bᵀ + A Ξ_Bᵀ`` has the law of ``P(Ξ)`` for a dense standard Gaussian Ξ (m×n)
    ([P] Lemma A.17): an isotropic Gaussian on ``T_Z M_r`` with ``‖·‖_F² ~ χ²_{r(m+n−r)}`` (Thm 3.1, Lemma A.23),
    whatever the gauge of (A, B). Unit scale: the caller multiplies by ``σC/b`` (Eq. 17).

    ``generator``: one ``torch.Generator`` (draws the whole batch at once: the numbers then depend on the batch
    shape), or a sequence with one generator per model (row-major over A's batch dims) so that each model's
    noise comes from its own stream, ``Ω_A`` then ``Ω_B``, independent of batching. ``sample_shape`` prepends
    independent draws: output (*sample_shape, ..., m, r) and (*sample_shape, ..., n, r).
    """
    geometry = _geometry(LoraFactors(A, B))
    return _tangent_noise(_draw_omegas(A, B, generator, tuple(sample_shape)), *geometry)

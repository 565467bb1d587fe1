"""PRISM: gauge-invariant tangent-space DP for LoRA ([P] Alg. 1, Eqs. 12-26; SPEC §1.6).

Notation of [P] (SPEC §0): a LoRA module's intrinsic update is ``Z = A Bᵀ`` with ``A ∈ R^{m×r}``,
``B ∈ R^{n×r}``, ``M = AᵀA``, ``N = BᵀB``. peft stores ``ΔW = s · lora_B.weight @ lora_A.weight``, so
``A = lora_B.weight`` (n_out × r), ``B = lora_A.weightᵀ`` (n_in × r) and ``ΔW = s Z`` (:class:`PeftLoraAdapter`).

Shapes. Every tensor may carry leading batch dims ``...`` (the engine stacks K shadow models), broadcast with
torch's rules. Per-example tensors carry one more dim, the example axis, right before the matrix dims:
``(..., b, m, r)``. All algebra is done on r×r matrices (QR of m×r / n×r / m×2r factors, SVD or eigh of
r×r and 2r×2r cores); no m×n matrix is ever decomposed, and none is formed except by the helpers that return
a dense matrix on purpose (:func:`tangent_project`, :func:`tangent_matrix`, :meth:`PeftLoraAdapter.weight_delta`).

Engine integration (what one step needs)
----------------------------------------
* Inputs per module ℓ: the factors (A, B) of shape (..., m, r), (..., n, r), full column rank r (peft's
  ``lora_B = 0`` start is rank 0: initialise both factors, e.g. :func:`balanced_random_factors`), and the
  per-example *factor* gradients ``g_A,i = G_i B`` (..., b, m, r) and ``g_B,i = G_iᵀ A`` (..., b, n, r) of
  ``G_i = ∇_Z ℓ_i``. These are exactly the per-sample gradients of ``lora_B.weight`` and of ``lora_A.weight``
  (transposed) that opacus / functorch give for a peft model (:meth:`PeftLoraAdapter.gradients_to_prism`).
  They are sufficient: the lift (Eq. 14), the intrinsic norm (Eq. 15) and ``P(G_i)`` depend on ``G_i`` only
  through them, so the dense per-example ``G_i`` (for a Linear layer ``Σ_t δ_t x_tᵀ`` over positions t) is
  never needed. If only activations x_t and output gradients δ_t are at hand:
  ``g_A,i = Σ_t δ_t (Bᵀx_t)ᵀ`` and ``g_B,i = Σ_t x_t (Aᵀδ_t)ᵀ``, O(T(m+n)r) per example.
* Optional example weights (..., b) in [0, 1] (0 = padding of a Poisson batch to a common size).
* Randomness: one ``torch.Generator`` per model (a sequence, one per leading index); per step each model's
  generator draws, module by module in list order, ``Ω_A`` (m×r) then ``Ω_B`` (n×r). Results therefore do not
  depend on how models are batched. CPU generators are fine for CUDA tensors (draws are moved).
* State per model and module: :class:`PrismAdaptiveState` (m×r, n×r first moments, two r×r second moments).
* Cost per step and module: O(b (m+n) r²) for lifts and norms, O((m+n) r²) for noise, adaptive direction and
  retraction (QR of m×2r, n×2r and a 2r×2r SVD).

Privacy: each step is a Poisson-subsampled Gaussian mechanism with multiplier σ on the concatenated
intrinsic update, sensitivity C/b (Thm 3.4); everything after Eq. 17 is post-processing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from dpaudit.errors import UsageError
from dpaudit.mechanisms.base import Step

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


@dataclass(frozen=True)
class PeftLoraAdapter:
    """The map between peft's LoRA tensors and [P]'s factors (SPEC §0).

    peft: ``ΔW = s · lora_B.weight @ lora_A.weight``, ``lora_A.weight`` (r × n_in), ``lora_B.weight``
    (n_out × r), ``s = lora_alpha / r``. [P]: ``A = lora_B.weight``, ``B = lora_A.weightᵀ``, ``Z = A Bᵀ``, so
    ``ΔW = s Z`` and ``∇_Z ℓ = s ∇_W ℓ``. peft's factor gradients already contain s: ``∂ℓ/∂lora_B = s ∇_Wℓ ·
    lora_Aᵀ = (∇_Z ℓ) B = g_A`` and ``(∂ℓ/∂lora_A)ᵀ = (∇_Z ℓ)ᵀ A = g_B``. All PRISM quantities (clip norm C,
    noise, learning rate) therefore act on Z, not on ΔW. Conv2d LoRA tensors must first be flattened to
    ``lora_A`` (..., r, c_in·kh·kw) and ``lora_B`` (..., c_out, r) (SPEC §1.2 convention).
    """

    scale: float

    def __post_init__(self):
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise UsageError(f"scale must be a finite positive number (peft's lora_alpha / r); got {self.scale}")

    def to_prism(self, lora_A: Tensor, lora_B: Tensor) -> LoraFactors:
        """``(lora_A (..., r, n_in), lora_B (..., n_out, r)) -> (A, B) = (lora_B, lora_Aᵀ)``."""
        return LoraFactors(lora_B, lora_A.mT)

    def gradients_to_prism(self, grad_lora_A: Tensor, grad_lora_B: Tensor) -> FactorGradients:
        """Per-sample peft gradients (..., b, r, n_in), (..., b, n_out, r) -> ``(g_A, g_B)`` of ``∇_Z ℓ``."""
        return FactorGradients(grad_lora_B, grad_lora_A.mT)

    def to_peft(self, factors: LoraFactors) -> tuple[Tensor, Tensor]:
        """``(A, B) -> (lora_A, lora_B) = (Bᵀ, A)``."""
        A, B = _as_pair(LoraFactors, factors, "factors")
        return B.mT, A

    def intrinsic_gradient(self, weight_gradient: Tensor) -> Tensor:
        """``∇_Z ℓ = s ∇_W ℓ`` for a dense weight gradient (..., n_out, n_in)."""
        return self.scale * weight_gradient

    def weight_delta(self, factors: LoraFactors) -> Tensor:
        """``ΔW = s A Bᵀ`` (dense (..., n_out, n_in), for merging or checks)."""
        A, B = _as_pair(LoraFactors, factors, "factors")
        return self.scale * A @ B.mT


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


def _require_positive(name: str, value: float, allow_zero: bool = False) -> None:
    ok = math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise UsageError(f"{name} must be a finite number {bound}; got {value}")


def _as_pair(kind, value, name: str):
    """Accept a plain 2-tuple where a LoraFactors / FactorGradients / TangentLift is expected."""
    if isinstance(value, Tensor) or len(value) != 2:
        raise UsageError(f"{name} must be a pair of tensors ({', '.join(kind._fields)}); got {type(value).__name__}")
    return kind(*value)


# --------------------------------------------------------------------------------------------------------------
# Geometry of the factors: projectors and Gram inverses from QR + r×r SVD
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ColumnGeometry:
    """One factor X (..., d, r): orthonormal basis Q of col(X), Gram ``XᵀX`` and its inverse powers.

    ``Π_X = Q Qᵀ`` ([P] Lemma A.18); from ``X = Q R`` and ``R = U S Vᵀ`` (r×r): ``(XᵀX)^{-1} = V S^{-2} Vᵀ``,
    ``(XᵀX)^{-1/2} = V S^{-1} Vᵀ`` (symmetric, as Lemma A.17 requires). Full column rank makes ``† = ^{-1}``.
    """

    factor: Tensor
    basis: Tensor
    gram: Tensor
    gram_inverse: Tensor
    gram_inverse_sqrt: Tensor

    def project(self, values: Tensor) -> Tensor:
        """``Π_X Y = Q (Qᵀ Y)`` without forming the d×d projector."""
        return self.basis @ (self.basis.mT @ values)


def _column_geometry(name: str, factor: Tensor) -> _ColumnGeometry:
    basis, triangular = torch.linalg.qr(factor)
    _, singular_values, right_vectors_t = torch.linalg.svd(triangular)
    tolerance = singular_values[..., :1] * max(factor.shape[-2:]) * torch.finfo(factor.dtype).eps
    if bool((singular_values[..., -1:] <= tolerance).any()):  # also catches X = 0 (tolerance 0)
        worst = singular_values[..., -1].min().item()
        raise UsageError(
            f"{name} is rank-deficient (smallest singular value {worst:.3g}); PRISM needs both LoRA "
            f"factors of full column rank r ([P] Thm 3.1). peft's lora_B = 0 start is rank 0: "
            f"initialise both factors, e.g. with balanced_random_factors"
        )
    right_vectors = right_vectors_t.mT
    return _ColumnGeometry(
        factor=factor,
        basis=basis,
        gram=factor.mT @ factor,
        gram_inverse=(right_vectors / singular_values.unsqueeze(-2) ** 2) @ right_vectors_t,
        gram_inverse_sqrt=(right_vectors / singular_values.unsqueeze(-2)) @ right_vectors_t,
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
    if min(m, n) < rank or rank < 1:
        raise UsageError(f"rank must satisfy 1 <= rank <= min(m, n); got rank {rank}, m {m}, n {n}")
    _require_positive("spectral_norm", spectral_norm)

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
    scaled_A = gradients.g_A @ geometry_B.gram_inverse  # g_A N†
    scaled_B = gradients.g_B @ geometry_A.gram_inverse  # g_B M†
    return TangentLift(scaled_A - 0.5 * geometry_A.project(scaled_A), scaled_B - 0.5 * geometry_B.project(scaled_B))


def lift_factor_gradients(gradients: FactorGradients, factors: LoraFactors) -> TangentLift:
    """Canonical lift of [P] Eq. 14 from factor gradients: ``ΔA = g_A N† − ½ Π_A (g_A N†)``,
    ``ΔB = g_B M† − ½ Π_B (g_B M†)``; ``ΔA Bᵀ + A ΔBᵀ = P(G)`` ([P] Lemma A.14).

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
    """``‖ΔA Bᵀ + A ΔBᵀ‖_F²`` through r×r traces ([P] Eq. 15, Prop. A.15), shape = broadcast batch shape:

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
    ‖g_A N^{-1/2}‖``, ``‖Π_A G Π_B‖ = ‖Q_Aᵀ g_A N^{-1/2}‖``. No per-example lift is formed: clipping only
    needs these norms, and the clipped sum is lifted once (the lift is linear). ``factor_sq_norm(factor, left,
    right)`` returns ``‖left · g_{factor,i} · right‖_F²`` per example (``factor`` "A" or "B"; left None = I).
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


def global_intrinsic_norm(per_module_sq_norms: Sequence[Tensor]) -> Tensor:
    """``s_i = (Σ_ℓ ‖ΔZ_{i,ℓ}‖_F²)^{1/2}`` over LoRA modules ([P] Eq. 16); inputs (..., b) each."""
    if len(per_module_sq_norms) == 0:
        raise UsageError("per_module_sq_norms is empty: pass one (..., b) tensor per LoRA module")
    total = torch.stack(torch.broadcast_tensors(*per_module_sq_norms)).sum(0)
    # Eq. 15 is a difference of traces: round-off can make an exact 0 slightly negative.
    return total.clamp(min=0.0).sqrt()


def clip_factors(norms: Tensor, clip_norm: float) -> Tensor:
    """``α_i = min(1, C / s_i)`` ([P] Alg. 1 line 6); ``s_i = 0`` gives ``α_i = 1``."""
    _require_positive("clip_norm", clip_norm)
    return (clip_norm / norms).clamp(max=1.0)


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
    xi_A = (omega_A - geometry_A.project(omega_A)) @ geometry_B.gram_inverse_sqrt  # (I − Π_A) Ω_A N^{-1/2}
    xi_B = omega_B @ geometry_A.gram_inverse_sqrt  # Ω_B M^{-1/2}
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


# --------------------------------------------------------------------------------------------------------------
# Privatisation ([P] Alg. 1 lines 10-12, Eq. 17)
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrismPrivacyConfig:
    """Noise multiplier σ, clip norm C on the global intrinsic norm (Eq. 16), expected batch size b (qN)."""

    noise_multiplier: float
    clip_norm: float
    expected_batch_size: float

    def __post_init__(self):
        _require_positive("noise_multiplier", self.noise_multiplier, allow_zero=True)
        _require_positive("clip_norm", self.clip_norm)
        _require_positive("expected_batch_size", self.expected_batch_size)

    @property
    def noise_std(self) -> float:
        """``σC/b``: the std of the tangent noise added to the clipped mean (Eq. 17)."""
        return self.noise_multiplier * self.clip_norm / self.expected_batch_size


def _noisy_mean(
    clipped_sum: TangentLift,
    geometry_A: _ColumnGeometry,
    geometry_B: _ColumnGeometry,
    privacy: PrismPrivacyConfig,
    generator: Generators,
) -> TangentLift:
    """``(1/b) Σ_i α_i (ΔA_i, ΔB_i) + (σC/b)(Ξ_A, Ξ_B)`` from the clipped sum of lifts (Eq. 17)."""
    noise = _tangent_noise(_draw_omegas(geometry_A.factor, geometry_B.factor, generator, ()), geometry_A, geometry_B)
    b = privacy.expected_batch_size
    return TangentLift(
        clipped_sum.dA / b + privacy.noise_std * noise.dA, clipped_sum.dB / b + privacy.noise_std * noise.dB
    )


def privatize_module(
    per_example_lifts: TangentLift,
    clip_weights: Tensor,
    factors: LoraFactors,
    privacy: PrismPrivacyConfig,
    generator: Generators,
) -> TangentLift:
    """``(ΔA_dp, ΔB_dp) = (1/b) Σ_i α_i (ΔA_i, ΔB_i) + (σC/b)(Ξ_A, Ξ_B)`` ([P] Alg. 1 lines 10-12, Eq. 17).

    ``per_example_lifts`` (..., b, m, r), (..., b, n, r); ``clip_weights`` (..., b) are the α_i (times the
    example weights, 0 for padding); b in the divisor is the *expected* batch size (SPEC §1.5). The induced
    intrinsic increment is Eq. 18, ``(1/b) Σ α_i P(G_i) + (σC/b) P(Ξ)``, whose law depends on Z only (Thm 3.3).
    ``generator`` as in :func:`sample_tangent_noise`.
    """
    factors = _as_pair(LoraFactors, factors, "factors")
    per_example_lifts = _as_pair(TangentLift, per_example_lifts, "per_example_lifts")
    _check_factors(*factors)
    _check_like("per_example_lifts.dA", per_example_lifts.dA, "A", factors.A, extra_dims=1)
    _check_like("per_example_lifts.dB", per_example_lifts.dB, "B", factors.B, extra_dims=1)
    if not isinstance(clip_weights, Tensor) or clip_weights.shape[-1:] != per_example_lifts.dA.shape[-3:-2]:
        raise UsageError(f"clip_weights must be a (..., b) tensor with b = {per_example_lifts.dA.shape[-3]}")
    total = TangentLift(*(torch.einsum("...b,...bdr->...dr", clip_weights, lifts) for lifts in per_example_lifts))
    return _noisy_mean(total, *_geometry(factors), privacy, generator)


# --------------------------------------------------------------------------------------------------------------
# DP-aware adaptive direction ([P] Eqs. 24-26)
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrismAdaptiveConfig:
    """Rank-space Adam of [P] Eqs. 24-26.

    ``floor_scale`` is c in ``λ_A = c (σC/b)² tr(N^{-1})/r`` (Eq. 26 fixes λ only up to a constant);
    ``eps`` is added to both floors so the preconditioner stays invertible when σ = 0. ``bias_correction``
    divides the moments by ``1 − β^t`` as Adam does (Eqs. 24-25 print the uncorrected EMA; the authors'
    code corrects).
    """

    beta1: float = 0.9
    beta2: float = 0.999
    floor_scale: float = 1.0
    eps: float = 1e-8
    bias_correction: bool = True

    def __post_init__(self):
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise UsageError(f"{name} must lie in [0, 1); got {value}")
        _require_positive("floor_scale", self.floor_scale, allow_zero=True)
        _require_positive("eps", self.eps)


@dataclass(frozen=True)
class PrismAdaptiveState:
    """Per model and module: first moments m_A (..., m, r), m_B (..., n, r); rank-space second moments
    V_A, V_B (..., r, r) ([P] Eq. 24); ``steps`` taken (for bias correction).
    """

    first_A: Tensor
    first_B: Tensor
    second_A: Tensor
    second_B: Tensor
    steps: int = 0


def initial_adaptive_state(factors: LoraFactors) -> PrismAdaptiveState:
    """Zero moments shaped like ``factors`` (batch dims included)."""
    _check_factors(*factors)
    A, B = factors
    rank = A.shape[-1]
    second = torch.zeros((*_batch_shape(A=(A, 2), B=(B, 2)), rank, rank), dtype=A.dtype, device=A.device)
    return PrismAdaptiveState(torch.zeros_like(A), torch.zeros_like(B), second, second.clone())


def _floors(
    geometry_A: _ColumnGeometry, geometry_B: _ColumnGeometry, noise_std: float, floor_scale: float
) -> tuple[Tensor, Tensor]:
    rank = geometry_A.factor.shape[-1]
    coefficient = floor_scale * noise_std**2 / rank
    trace = lambda matrix: torch.diagonal(matrix, dim1=-2, dim2=-1).sum(-1)  # noqa: E731
    return coefficient * trace(geometry_B.gram_inverse), coefficient * trace(geometry_A.gram_inverse)


def dp_aware_floors(factors: LoraFactors, noise_std: float, floor_scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """``λ_A = c (σC/b)² tr(N^{-1})/r``, ``λ_B = c (σC/b)² tr(M^{-1})/r`` ([P] Eq. 26), shape = batch shape.

    Motivation ([P] App. A.26): the tangent noise has ``E[Ξ_AᵀΞ_A/m] = ((m−r)/m) N^{-1}`` and
    ``E[Ξ_BᵀΞ_B/n] = M^{-1}``, so λ is the mean noise eigenvalue the second moment would see. Invariant under
    orthogonal gauges ``(AQ, BQ)`` only: ``tr((RᵀMR)^{-1}) = tr(M^{-1}(RRᵀ)^{-1})``, so the invariance under
    every R ∈ GL(r) claimed at the end of App. A.26 does not hold (nor does it for V_A, Lemma A.30).
    """
    _require_positive("noise_std", noise_std, allow_zero=True)
    _require_positive("floor_scale", floor_scale, allow_zero=True)
    return _floors(*_geometry(factors), noise_std, floor_scale)


def _inverse_sqrt_spd(matrix: Tensor) -> Tensor:
    eigenvalues, eigenvectors = torch.linalg.eigh(matrix)
    return (eigenvectors * eigenvalues.rsqrt().unsqueeze(-2)) @ eigenvectors.mT


def _adaptive_direction(
    state: PrismAdaptiveState,
    noisy_update: TangentLift,
    geometry_A: _ColumnGeometry,
    geometry_B: _ColumnGeometry,
    noise_std: float,
    config: PrismAdaptiveConfig,
) -> tuple[TangentLift, PrismAdaptiveState]:
    dA, dB = noisy_update
    m, n = dA.shape[-2], dB.shape[-2]
    new_state = PrismAdaptiveState(
        first_A=config.beta1 * state.first_A + (1 - config.beta1) * dA,
        first_B=config.beta1 * state.first_B + (1 - config.beta1) * dB,
        second_A=config.beta2 * state.second_A + (1 - config.beta2) * (dA.mT @ dA) / m,
        second_B=config.beta2 * state.second_B + (1 - config.beta2) * (dB.mT @ dB) / n,
        steps=state.steps + 1,
    )
    first_scale, second_scale = 1.0, 1.0
    if config.bias_correction:
        first_scale = 1.0 / (1.0 - config.beta1**new_state.steps)
        second_scale = 1.0 / (1.0 - config.beta2**new_state.steps)
    floor_A, floor_B = _floors(geometry_A, geometry_B, noise_std, config.floor_scale)
    identity = torch.eye(dA.shape[-1], dtype=dA.dtype, device=dA.device)
    precondition_A = _inverse_sqrt_spd(
        second_scale * new_state.second_A + (floor_A + config.eps)[..., None, None] * identity
    )
    precondition_B = _inverse_sqrt_spd(
        second_scale * new_state.second_B + (floor_B + config.eps)[..., None, None] * identity
    )
    direction = TangentLift(
        first_scale * new_state.first_A @ precondition_A, first_scale * new_state.first_B @ precondition_B
    )
    return direction, new_state


def adaptive_direction(
    state: PrismAdaptiveState,
    noisy_update: TangentLift,
    factors: LoraFactors,
    noise_std: float,
    config: PrismAdaptiveConfig,
) -> tuple[TangentLift, PrismAdaptiveState]:
    """DP-aware rank-space preconditioning ([P] Eqs. 24-26); returns ``(U_A, U_B)`` and the new state.

    ``m_A ← β1 m_A + (1−β1) ΔA_dp``, ``V_A ← β2 V_A + (1−β2) ΔA_dpᵀΔA_dp / m`` (B side with n),
    ``U_A = m̂_A (V̂_A + (λ_A + eps) I)^{-1/2}`` with the floors of :func:`dp_aware_floors` and ``noise_std = σC/b``.
    Under an orthogonal gauge R the directions transform as ``U R`` and ``U_A Bᵀ + A U_Bᵀ`` is unchanged
    ([P] Lemma A.30). Pure: ``state`` is not modified.
    """
    factors = _as_pair(LoraFactors, factors, "factors")
    noisy_update = _as_pair(TangentLift, noisy_update, "noisy_update")
    _check_factors(*factors)
    _check_like("noisy_update.dA", noisy_update.dA, "A", factors.A)
    _check_like("noisy_update.dB", noisy_update.dB, "B", factors.B)
    _require_positive("noise_std", noise_std, allow_zero=True)
    return _adaptive_direction(state, noisy_update, *_geometry(factors), noise_std, config)


# --------------------------------------------------------------------------------------------------------------
# Retraction ([P] Eq. 22) and gauge alignment ([P] App. A.24)
# --------------------------------------------------------------------------------------------------------------


def retract(factors: LoraFactors, direction: TangentLift, learning_rate: float) -> LoraFactors:
    """Best rank-r approximation of ``Z − η(U_A Bᵀ + A U_Bᵀ)`` ([P] Eq. 22), balanced: ``A = U S^{1/2}``,
    ``B = V S^{1/2}`` (so ``AᵀA = BᵀB = S``).

    ``Z − η(U_A Bᵀ + A U_Bᵀ) = [A, U_A] K [B, U_B]ᵀ`` with ``K = [[I, −ηI], [−ηI, 0]]``; QR of the m×2r and
    n×2r blocks gives ``Q_1 (R_1 K R_2ᵀ) Q_2ᵀ`` and the SVD of the 2r×2r core gives the truncated SVD
    (Eckart-Young, [P] Lemma A.25). No ``η² U_A U_Bᵀ`` term: the step is additive in Z (Lemma A.26).
    The output has rank ≤ r (< r only if the update cancels directions of Z exactly).
    """
    factors = _as_pair(LoraFactors, factors, "factors")
    direction = _as_pair(TangentLift, direction, "direction")
    _check_factors(*factors)
    _check_like("U_A", direction.dA, "A", factors.A)
    _check_like("U_B", direction.dB, "B", factors.B)
    _require_positive("learning_rate", learning_rate, allow_zero=True)
    A, B = factors
    rank = A.shape[-1]
    basis_left, triangular_left = torch.linalg.qr(torch.cat(torch.broadcast_tensors(A, direction.dA), -1))
    basis_right, triangular_right = torch.linalg.qr(torch.cat(torch.broadcast_tensors(B, direction.dB), -1))
    identity = torch.eye(rank, dtype=A.dtype, device=A.device)
    coupling = torch.cat(
        [
            torch.cat([identity, -learning_rate * identity], -1),
            torch.cat([-learning_rate * identity, torch.zeros_like(identity)], -1),
        ],
        -2,
    )
    core = triangular_left @ coupling @ triangular_right.mT
    left, singular_values, right_t = torch.linalg.svd(core)
    root = singular_values[..., :rank].sqrt().unsqueeze(-2)
    return LoraFactors(basis_left @ left[..., :rank] * root, basis_right @ right_t.mT[..., :rank] * root)


def align_gauge(factors: LoraFactors, reference: LoraFactors) -> LoraFactors:
    """Orthogonal Procrustes gauge alignment ``(A Q, B Q)``, ``Q = argmin ‖AQ − A_ref‖² + ‖BQ − B_ref‖²``
    ([P] App. A.24, Lemma A.28): Z, the projectors and balance are unchanged; the factors stay close to the
    previous step's, so the factor-space moments of Eq. 24 keep referring to the same columns.
    """
    factors = _as_pair(LoraFactors, factors, "factors")
    reference = _as_pair(LoraFactors, reference, "reference")
    _check_factors(*factors)
    _check_factors(*reference)
    _check_like("reference.A", reference.A, "A", factors.A)
    _check_like("reference.B", reference.B, "B", factors.B)
    left, _, right_t = torch.linalg.svd(factors.A.mT @ reference.A + factors.B.mT @ reference.B)
    rotation = left @ right_t
    return LoraFactors(factors.A @ rotation, factors.B @ rotation)


# --------------------------------------------------------------------------------------------------------------
# One PRISM step ([P] Alg. 1)
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrismStepConfig:
    """Privacy parameters, learning rate η and the adaptive rule (None: plain tangent SGD, ``U = ΔA_dp``)."""

    privacy: PrismPrivacyConfig
    learning_rate: float
    adaptive: PrismAdaptiveConfig | None = PrismAdaptiveConfig()

    def __post_init__(self):
        _require_positive("learning_rate", self.learning_rate)


class PrismStepResult(NamedTuple):
    """New factors and states per module; the released noisy lifts (ΔA_dp, ΔB_dp) per module; the global
    per-example intrinsic norms s_i and clip factors α_i, both (..., b).
    """

    factors: tuple[LoraFactors, ...]
    states: tuple[PrismAdaptiveState, ...] | None
    noisy_updates: tuple[TangentLift, ...]
    per_example_norms: Tensor
    clip_factors: Tensor


def _check_step_inputs(factors, gradients, example_weights, states, config) -> None:
    if len(factors) == 0 or len(factors) != len(gradients):
        raise UsageError(
            f"pass one LoraFactors and one FactorGradients per module; got {len(factors)} factors and "
            f"{len(gradients)} gradients"
        )
    if states is not None and (config.adaptive is None or len(states) != len(factors)):
        raise UsageError("states must be None for plain tangent SGD (adaptive=None), else one state per module")
    for index, (state, module_factors) in enumerate(zip(states or (), factors)):
        if state.first_A.shape != module_factors.A.shape or state.first_B.shape != module_factors.B.shape:
            raise UsageError(
                f"states[{index}] has moments of shapes {tuple(state.first_A.shape)}, "
                f"{tuple(state.first_B.shape)}; factors[{index}] are {tuple(module_factors.A.shape)}, "
                f"{tuple(module_factors.B.shape)}: pass the states this module's last step returned"
            )
    examples = []
    for index, (module_factors, module_gradients) in enumerate(zip(factors, gradients)):
        _check_factors(*module_factors)
        _check_like(f"gradients[{index}].g_A", module_gradients.g_A, "A", module_factors.A, extra_dims=1)
        _check_like(f"gradients[{index}].g_B", module_gradients.g_B, "B", module_factors.B, extra_dims=1)
        examples.append(module_gradients.g_A.shape[:-2])
        examples.append(module_gradients.g_B.shape[:-2])
    if len(set(examples)) != 1:
        raise UsageError(f"all modules' per-example gradients must share the leading (..., b) dims; got {examples}")
    if example_weights is not None:
        if not isinstance(example_weights, Tensor) or example_weights.shape != examples[0]:
            raise UsageError(f"example_weights must be a tensor of shape {tuple(examples[0])} (..., b)")
        if bool(((example_weights < 0) | (example_weights > 1)).any()):
            raise UsageError(
                "example_weights must lie in [0, 1] (0 marks padding); larger weights would break the "
                "sensitivity bound C/b"
            )


def prism_step(
    factors: Sequence[LoraFactors],
    per_example_gradients: Sequence[FactorGradients],
    config: PrismStepConfig,
    generator: Generators,
    states: Sequence[PrismAdaptiveState] | None = None,
    example_weights: Tensor | None = None,
) -> PrismStepResult:
    """One PRISM update across all LoRA modules ([P] Alg. 1), pure.

    1. each example's intrinsic norm ``‖P(G_i)‖`` (Eq. 15, from its factor gradients: :func:`_tangent_sq_norms`)
       summed over modules (Eq. 16), ``α_i = min(1, C/s_i)``;
    2. per module: ``ΔA_dp = (1/b) Σ α_i w_i ΔA_i + (σC/b) Ξ_A`` (Eq. 17; w_i the example weights; the lift
       Eq. 14 is linear, so the clipped sum of gradients is lifted once), the adaptive direction (Eqs. 24-26) or
       ``U = ΔA_dp``, the retraction (Eq. 22) and a Procrustes gauge alignment to the input factors (App. A.24).

    ``factors[ℓ]``: (..., m_ℓ, r), (..., n_ℓ, r). ``per_example_gradients[ℓ]``: ``g_A`` (..., b, m_ℓ, r), ``g_B``
    (..., b, n_ℓ, r). ``generator``: as in :func:`sample_tangent_noise` (one per model for batched factors);
    modules draw in list order. ``states``: None starts from zero moments.
    """
    factors = [_as_pair(LoraFactors, pair, f"factors[{i}]") for i, pair in enumerate(factors)]
    per_example_gradients = [
        _as_pair(FactorGradients, pair, f"per_example_gradients[{i}]") for i, pair in enumerate(per_example_gradients)
    ]
    _check_step_inputs(factors, per_example_gradients, example_weights, states, config)
    geometries = [_geometry(module_factors) for module_factors in factors]
    norms = global_intrinsic_norm(
        [
            _tangent_sq_norms(_per_example_factor_sq_norm(gradients), *geometry)
            for gradients, geometry in zip(per_example_gradients, geometries)
        ]
    )
    alphas = clip_factors(norms, config.privacy.clip_norm)
    weights = alphas if example_weights is None else alphas * example_weights
    clipped_sums = [
        FactorGradients(*(torch.einsum("...b,...bdr->...dr", weights, g) for g in gradients))
        for gradients in per_example_gradients
    ]
    return _step_from_clipped_sums(factors, geometries, clipped_sums, norms, alphas, config, generator, states)


def _step_from_clipped_sums(
    factors: Sequence[LoraFactors],
    geometries,
    clipped_sums: Sequence[FactorGradients],
    norms: Tensor,
    alphas: Tensor,
    config: PrismStepConfig,
    generator: Generators,
    states: Sequence[PrismAdaptiveState] | None,
) -> PrismStepResult:
    """:func:`prism_step` after clipping: per module, lift ``Σ_i α_i w_i (g_A,i, g_B,i)`` (Eq. 14, linear, so this is
    the clipped sum of the per-example lifts), add the noise (Eq. 17), adaptive direction, retraction, alignment.
    """
    if config.adaptive is not None and states is None:
        states = [initial_adaptive_state(module_factors) for module_factors in factors]
    new_factors, new_states, noisy_updates = [], [], []
    for index, (module_factors, (geometry_A, geometry_B)) in enumerate(zip(factors, geometries)):
        noisy = _noisy_mean(
            _lift(clipped_sums[index], geometry_A, geometry_B), geometry_A, geometry_B, config.privacy, generator
        )
        noisy_updates.append(noisy)
        direction = noisy
        if config.adaptive is not None:
            direction, state = _adaptive_direction(
                states[index], noisy, geometry_A, geometry_B, config.privacy.noise_std, config.adaptive
            )
            new_states.append(state)
        new_factors.append(align_gauge(retract(module_factors, direction, config.learning_rate), module_factors))
    return PrismStepResult(
        tuple(new_factors),
        tuple(new_states) if config.adaptive is not None else None,
        tuple(noisy_updates),
        norms,
        alphas,
    )


def prism_module_step(
    factors: LoraFactors,
    per_example_gradients: FactorGradients,
    config: PrismStepConfig,
    generator: Generators,
    state: PrismAdaptiveState | None = None,
    example_weights: Tensor | None = None,
) -> PrismStepResult:
    """:func:`prism_step` for a model with a single LoRA module (its norm is then the global norm)."""
    return prism_step(
        [factors], [per_example_gradients], config, generator, None if state is None else [state], example_weights
    )


# --------------------------------------------------------------------------------------------------------------
# Diagnostics: intrinsic noise energy, factor space vs PRISM ([P] Prop. 2.2, Cor. 2.3, Thm 3.1, Figs. 2-3)
# --------------------------------------------------------------------------------------------------------------


def factor_norm_statistic(A: Tensor, B: Tensor) -> Tensor:
    """``S_t = m‖B‖_F² + n‖A‖_F²`` ([P] Eq. 8, Sec. 4); factor-space noise energy is ``τ² S_t``. Sum over modules."""
    _check_factors(A, B)
    return A.shape[-2] * B.square().sum((-2, -1)) + B.shape[-2] * A.square().sum((-2, -1))


def prism_noise_energy_closed_form(m: int, n: int, rank: int, noise_std: float) -> float:
    """``E‖(σC/b) P(Ξ)‖_F² = (σC/b)² r(m+n−r)`` ([P] Thm 3.1, Eq. 20; Eq. 21 is its square root)."""
    return noise_std**2 * rank * (m + n - rank)


class FactorNoiseEnergy(NamedTuple):
    """Per-draw energies of factor-space DP-LoRA noise ([P] Prop. 2.2): ``first_order = ‖ξ_A Bᵀ + A ξ_Bᵀ‖²``,
    ``bilinear = ‖ξ_A ξ_Bᵀ‖²``, ``total = ‖ξ_A Bᵀ + A ξ_Bᵀ + ξ_A ξ_Bᵀ‖²`` (numpy, one entry per draw).
    """

    first_order: np.ndarray
    bilinear: np.ndarray
    total: np.ndarray


def factor_space_noise_energy(
    A: Tensor, B: Tensor, noise_std: float, num_draws: int, generator: torch.Generator
) -> FactorNoiseEnergy:
    """Sample ``ξ_A, ξ_B`` i.i.d. ``N(0, τ²)`` (τ = ``noise_std`` per factor entry, step size included) and
    measure the induced intrinsic noise by r×r traces. Expectations (Eqs. 8-9): ``τ² S_t`` and ``mnr τ⁴``.
    Draw order: ξ_A (num_draws, m, r) then ξ_B (num_draws, n, r) from ``generator``. Unbatched A, B.
    """
    _check_factors(A, B)
    _require_positive("noise_std", noise_std, allow_zero=True)
    if A.ndim != 2 or num_draws < 1:
        raise UsageError("factor_space_noise_energy takes unbatched A (m, r), B (n, r) and num_draws >= 1")
    xi_A = noise_std * _standard_normal((num_draws, *A.shape), generator, A)
    xi_B = noise_std * _standard_normal((num_draws, *B.shape), generator, B)
    first = _intrinsic_sq_norm(TangentLift(xi_A, xi_B), A, B, A.mT @ A, B.mT @ B)
    gram_xi_A, gram_xi_B = xi_A.mT @ xi_A, xi_B.mT @ xi_B
    bilinear = (gram_xi_A * gram_xi_B).sum((-2, -1))  # tr(ξ_AᵀΞ_A ξ_Bᵀξ_B), both symmetric
    # <ξ_A Bᵀ + A ξ_Bᵀ, ξ_A ξ_Bᵀ> = tr(ξ_Aᵀξ_A ξ_BᵀB) + tr(Aᵀξ_A ξ_Bᵀξ_B)
    cross = (gram_xi_A * (xi_B.mT @ B).mT).sum((-2, -1)) + ((A.mT @ xi_A) * gram_xi_B).sum((-2, -1))
    to_numpy = lambda t: t.detach().cpu().double().numpy()  # noqa: E731
    return FactorNoiseEnergy(to_numpy(first), to_numpy(bilinear), to_numpy(first + bilinear + 2.0 * cross))


def prism_noise_energy(
    A: Tensor, B: Tensor, noise_std: float, num_draws: int, generator: torch.Generator
) -> np.ndarray:
    """Per-draw ``‖(σC/b)(Ξ_A Bᵀ + A Ξ_Bᵀ)‖_F²`` from the Eq. 19 sampler (numpy); mean → Thm 3.1's closed form."""
    _require_positive("noise_std", noise_std, allow_zero=True)
    if A.ndim != 2 or num_draws < 1:
        raise UsageError("prism_noise_energy takes unbatched A (m, r), B (n, r) and num_draws >= 1")
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
    if len(gauges) == 0 or not all(math.isfinite(c) and c > 0 for c in gauges):
        raise UsageError(f"gauges must be a non-empty sequence of positive numbers; got {list(gauges)}")
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
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or x.size < 3:
        raise UsageError(f"x and y must be 1-D of equal length >= 3; got shapes {x.shape} and {y.shape}")
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (slope * x + intercept)
    total = np.sum((y - y.mean()) ** 2)
    r_squared = 1.0 - np.sum(residual**2) / total if total > 0 else 1.0
    return float(slope), float(intercept), float(r_squared)


# --------------------------------------------------------------------------------------------------------------
# Engine-facing mechanism: PRISM as the update rule of K batched peft LoRA models
# --------------------------------------------------------------------------------------------------------------


@dataclass
class PrismTrainingState:
    """Per campaign chunk: one noise generator per model, the (lora_A, lora_B) tensor names of each LoRA module,
    and the adaptive moments of every module (None before the first step).
    """

    generators: list[torch.Generator]
    modules: tuple[tuple[str, str], ...]
    adaptive: tuple[PrismAdaptiveState, ...] | None = None


@dataclass(frozen=True)
class PrismMechanism:
    """[P] Alg. 1 as the update rule of the engine's peft LoRA models (SPEC §1.6).

    Starts every module from balanced full-rank factors ``A = √c Q_A``, ``B = √c Q_B`` (Haar Q, spectral norm
    c = ``init_scale``; [P] needs full column rank, peft's ``lora_B = 0`` is rank 0), drawn per model from its
    "noise" stream before any step noise. Each step is :func:`prism_step` on all modules at once: lift, global
    intrinsic clipping to C, tangent noise ``σC/b`` (b the expected Poisson batch size), the adaptive direction
    (``adaptive``; None: plain tangent SGD) and the retraction, with the schedule's learning rate as η on
    ``Z`` (``ΔW = s Z``, s = ``lora_scale``, :class:`PeftLoraAdapter`). The engine's momentum is not used:
    the adaptive rule keeps its own moments, and its steps are Adam-sized (≈ η per entry), so PRISM wants a
    smaller ``--lr`` than SGD (0.01 on digits). Conv LoRA tensors are flattened (SPEC §1.2 convention).
    Privacy: Poisson-subsampled Gaussian with multiplier σ per step ([P] Thm 3.4).
    """

    noise_multiplier: float
    clip_norm: float
    lora_scale: float = 1.0
    init_scale: float = 1e-2
    adaptive: PrismAdaptiveConfig | None = PrismAdaptiveConfig()
    name: str = "prism"
    parameterization: str = "lora"
    per_example: bool = True
    sampling: str = "poisson"

    def __post_init__(self):
        PrismPrivacyConfig(self.noise_multiplier, self.clip_norm, 1.0)  # validates σ and C
        PeftLoraAdapter(self.lora_scale)
        _require_positive("init_scale", self.init_scale)

    def setup(self, shapes, randomness) -> PrismTrainingState:
        modules = tuple((name, name.replace(".lora_A.", ".lora_B.")) for name in shapes if ".lora_A." in name)
        for a_name, b_name in modules:
            rank, n_out = shapes[a_name][0], shapes[b_name][0]
            if n_out < rank:
                raise UsageError(
                    f"--rank {rank} exceeds the {n_out} outputs of LoRA module {b_name!r}: PRISM needs "
                    f"both factors of full column rank r ([P] Thm 3.1); use --rank <= {n_out}"
                )
        return PrismTrainingState([model.torch("noise") for model in randomness], modules)

    def initialise(self, params: dict[str, Tensor], state: PrismTrainingState) -> None:
        adapter = PeftLoraAdapter(self.lora_scale)
        for a_name, b_name in state.modules:
            lora_A, lora_B = params[a_name], params[b_name]
            rank, m, n = lora_A.shape[1], lora_B.shape[1], lora_A[0].numel() // lora_A.shape[1]
            starts = [
                balanced_random_factors(m, n, rank, self.init_scale, generator, lora_A.dtype)
                for generator in state.generators
            ]
            start_A, start_B = adapter.to_peft(LoraFactors(*(torch.stack(f) for f in zip(*starts))))
            lora_A.copy_(start_A.reshape(lora_A.shape))
            lora_B.copy_(start_B.reshape(lora_B.shape))

    def update(self, params: dict[str, Tensor], step: Step, state: PrismTrainingState, learning_rate: float) -> None:
        """One :func:`prism_step` on the engine's per-example gradients, which are never materialised: the
        clipping norms come from :meth:`PerExampleGradients.transformed_squared_norms` and the clipped sums from
        :meth:`PerExampleGradients.weighted_sum` (peft's ``lora_B`` gradient is ``g_A``, ``lora_A``'s is ``g_Bᵀ``).
        """
        adapter = PeftLoraAdapter(self.lora_scale)
        examples = step.gradients
        factors = [adapter.to_prism(params[a].flatten(2), params[b].flatten(2)) for a, b in state.modules]
        geometries = [_geometry(module_factors) for module_factors in factors]

        def factor_sq_norm(a_name: str, b_name: str) -> FactorSqNorm:
            def norm(factor: str, left: Tensor | None, right: Tensor) -> Tensor:
                if factor == "A":
                    return examples.transformed_squared_norms(b_name, left, right)
                return examples.transformed_squared_norms(a_name, right.mT, None if left is None else left.mT)

            return norm

        norms = global_intrinsic_norm(
            [_tangent_sq_norms(factor_sq_norm(*names), *geometry) for names, geometry in zip(state.modules, geometries)]
        )
        alphas = clip_factors(norms, self.clip_norm)
        sums = examples.weighted_sum(alphas * step.weights)
        clipped_sums = [adapter.gradients_to_prism(sums[a].flatten(2), sums[b].flatten(2)) for a, b in state.modules]
        privacy = PrismPrivacyConfig(self.noise_multiplier, self.clip_norm, step.expected_batch_size)
        result = _step_from_clipped_sums(
            factors,
            geometries,
            clipped_sums,
            norms,
            alphas,
            PrismStepConfig(privacy, learning_rate, self.adaptive),
            state.generators,
            state.adaptive,
        )
        state.adaptive = result.states
        for (a, b), new in zip(state.modules, result.factors):
            lora_A, lora_B = adapter.to_peft(new)
            params[a].copy_(lora_A.reshape(params[a].shape))
            params[b].copy_(lora_B.reshape(params[b].shape))

    def transform(self, step: Step, state) -> dict[str, Tensor]:
        raise TypeError("PRISM owns its update (a retraction, [P] Eq. 22): the engine calls update()")

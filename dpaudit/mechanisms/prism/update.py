"""PRISM's update, [P] Alg. 1 (docs/theory.md §1.6): clipping, tangent noise, adaptive direction, retraction.

What one step needs, per LoRA module ℓ (the geometry is :mod:`dpaudit.mechanisms.prism.tangent`'s):

* the factors (A, B) of shape (..., m, r), (..., n, r), full column rank r (peft's ``lora_B = 0`` start is rank
  0: initialise both factors, e.g. :func:`~dpaudit.mechanisms.prism.tangent.balanced_random_factors`), and the
  per-example *factor* gradients ``g_A,i = G_i B`` (..., b, m, r) and ``g_B,i = G_iᵀ A`` (..., b, n, r) of
  ``G_i = ∇_Z ℓ_i``. These are exactly the per-sample gradients of ``lora_B.weight`` and of ``lora_A.weight``
  (transposed) that opacus / functorch give for a peft model
  (:meth:`dpaudit.mechanisms.prism.PeftLoraAdapter.gradients_to_prism`). They are sufficient: the lift (Eq. 14),
  the intrinsic norm (Eq. 15) and ``P(G_i)`` depend on ``G_i`` only through them, so the dense per-example
  ``G_i`` (for a Linear layer ``Σ_t δ_t x_tᵀ`` over positions t) is never needed. If only activations x_t and
  output gradients δ_t are at hand: ``g_A,i = Σ_t δ_t (Bᵀx_t)ᵀ`` and ``g_B,i = Σ_t x_t (Aᵀδ_t)ᵀ``, O(T(m+n)r)
  per example.
* Optional example weights (..., b) in [0, 1] (0 = padding of a Poisson batch to a common size).
* Randomness: one ``torch.Generator`` per model (a sequence, one per leading index); per step each model's
  generator draws, module by module in list order, ``Ω_A`` (m×r) then ``Ω_B`` (n×r). Results therefore do not
  depend on how models are batched. CPU generators are fine for CUDA tensors (draws are moved).
* State per model and module: :class:`PrismAdaptiveState` (m×r, n×r first moments, two r×r second moments).
* Cost per step and module: O(b (m+n) r²) for lifts and norms, O((m+n) r²) for noise, adaptive direction and
  retraction (QR of m×r, n×r; the 2r×2r core's truncated SVD and the r×r Procrustes rotation from float64
  eigendecompositions of their Gram matrices; the factors' own QR and SVD only at the first step: the retraction
  returns the next step's geometry).

Privacy: each step is a Poisson-subsampled Gaussian mechanism with multiplier σ on the concatenated
intrinsic update ``ΔZ_dp = ΔA_dp Bᵀ + A ΔB_dpᵀ``, sensitivity C/b (Thm 3.4). What follows Eq. 17 is
post-processing only if it reads ΔZ_dp alone, not the factor pair (ΔA_dp, ΔB_dp): the pair's col(A) block
``Q_Aᵀ ΔA_dp = ½ Q_Aᵀ Ḡ B N⁻¹ / b`` carries no noise (``Q_Aᵀ Ξ_A = 0``, Eq. 19), so [P] Eq. 24's moments, which
read the pair, release a noise-free function of the clipped sum. The default adaptive rule therefore reads the
canonical lift of ΔZ_dp (:func:`relift`; :attr:`PrismAdaptiveConfig.canonical_lift`); plain tangent SGD reads
ΔZ_dp through the retraction only. Measured in ``experiments/prism_leak.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from accountants import validation as check
from dpaudit.errors import UsageError
from dpaudit.mechanisms import catalogue
from dpaudit.mechanisms.prism.tangent import (
    FactorGradients,
    Generators,
    LoraFactors,
    TangentLift,
    _add_product,
    _as_pair,
    _batch_shape,
    _check_factors,
    _check_full_rank,
    _check_like,
    _ColumnGeometry,
    _draw_omegas,
    _geometry,
    _geometry_from_svd,
    _lift,
    _per_example_factor_sq_norm,
    _tangent_noise,
    _tangent_sq_norms,
    _times,
)

# --------------------------------------------------------------------------------------------------------------
# Clipping on the global intrinsic norm ([P] Eq. 16, Alg. 1 line 6)
# --------------------------------------------------------------------------------------------------------------


def global_intrinsic_norm(per_module_sq_norms: Sequence[Tensor]) -> Tensor:
    """``s_i = (Σ_ℓ ‖ΔZ_{i,ℓ}‖_F²)^{1/2}`` over LoRA modules ([P] Eq. 16); inputs (..., b) each."""
    if len(per_module_sq_norms) == 0:
        raise UsageError("per_module_sq_norms is empty: pass one (..., b) tensor per LoRA module")
    # Added module by module, element by element: a sum over a stacked axis associates its terms by the tensor's shape
    # (the chunk's models, the step's width), so a model's norms depended on its companions in the last bits.
    total = functools.reduce(operator.add, torch.broadcast_tensors(*per_module_sq_norms))
    # Eq. 15 is a difference of traces: round-off can make an exact 0 slightly negative.
    return total.clamp(min=0.0).sqrt()


def clip_factors(norms: Tensor, clip_norm: float) -> Tensor:
    """``α_i = min(1, C / s_i)`` ([P] Alg. 1 line 6); ``s_i = 0`` gives ``α_i = 1``."""
    check.positive("clip_norm", clip_norm)
    return (clip_norm / norms).clamp(max=1.0)


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
        check.non_negative("noise_multiplier", self.noise_multiplier)
        check.positive("clip_norm", self.clip_norm)
        check.positive("expected_batch_size", self.expected_batch_size)

    @property
    def noise_std(self) -> float:
        """``σC/b``: the std of the tangent noise added to the clipped mean (Eq. 17)."""
        return self.noise_multiplier * self.clip_norm / self.expected_batch_size


def _noisy_mean(clipped_mean: TangentLift, privacy: PrismPrivacyConfig, noise: TangentLift) -> TangentLift:
    """``(1/b) Σ_i α_i (ΔA_i, ΔB_i) + (σC/b)(Ξ_A, Ξ_B)`` from the clipped mean of lifts (Eq. 17)."""
    scale = privacy.noise_std
    return TangentLift(
        torch.add(clipped_mean.dA, noise.dA, alpha=scale), torch.add(clipped_mean.dB, noise.dB, alpha=scale)
    )


def draw_step_omegas(factors: Sequence[LoraFactors], generator: Generators) -> list[tuple[Tensor, Tensor]]:
    """One step's standard normals ``(Ω_A, Ω_B)`` per module (Eq. 19), each model's generator module by module.

    Only the factors' shapes, dtype and device are read, so the next step's draw can be made ahead (the factors
    keep their shapes): :class:`dpaudit.mechanisms.prism.PrismMechanism` draws it on the background thread.
    """
    return [_draw_omegas(A, B, generator, ()) for A, B in factors]


class _ModuleNoise(NamedTuple):
    """A module's unit tangent noise (Eq. 19) and, when the moments read the canonical lift, its relift."""

    noise: TangentLift
    relifted: TangentLift | None


def _step_noise(omegas: Sequence[tuple[Tensor, Tensor]], geometries, adaptive) -> list[_ModuleNoise]:
    """Per module, Eq. 19's unit noise from the step's normals and, if ``adaptive`` reads it, its relift.

    Reads the normals and the factors' geometry only, so the next step's noise can be made ahead:
    :class:`dpaudit.mechanisms.prism.PrismMechanism` makes it on the background thread.
    """
    relift = adaptive is not None and adaptive.canonical_lift
    noises = []
    for module_omegas, (geometry_A, geometry_B) in zip(omegas, geometries):
        noise = _tangent_noise(module_omegas, geometry_A, geometry_B)
        noises.append(_ModuleNoise(noise, _relifted_noise(noise, geometry_A, geometry_B) if relift else None))
    return noises


def _relifted_noise(noise: TangentLift, geometry_A: _ColumnGeometry, geometry_B: _ColumnGeometry) -> TangentLift:
    """:func:`relift` of Eq. 19's noise in closed form: ``(Ξ_A + ½ A (Ξ_Bᵀ B) N^{-1}, Ξ_B − ½ Π_B Ξ_B)``.

    From ``Q_Aᵀ Ξ_A = 0``: ``ΔZ B = Ξ_A N + A Ξ_Bᵀ B`` and ``ΔZᵀ A = Ξ_B M``, lifted by Eq. 14. Four m×r or n×r
    products instead of :func:`_relift`'s twelve; the same up to rounding. Since relift is linear and fixes the
    (canonical) lift of the clipped sum, the relift of Eq. 17's pair is ``_noisy_mean`` of this noise.
    """
    A, B = geometry_A.factor, geometry_B.factor
    return TangentLift(
        _add_product(noise.dA, A, (noise.dB.mT @ B) @ geometry_B.gram_inverse, 0.5),
        geometry_B.project_out(noise.dB, 0.5),
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
    example weights, 0 for padding); b in the divisor is the *expected* batch size (docs/theory.md §1.5). The induced
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
    coefficients = clip_weights / privacy.expected_batch_size
    mean = TangentLift(*(torch.einsum("...b,...bdr->...dr", coefficients, lifts) for lifts in per_example_lifts))
    geometries = _geometry(factors)
    return _noisy_mean(mean, privacy, _tangent_noise(_draw_omegas(*factors, generator, ()), *geometries))


# --------------------------------------------------------------------------------------------------------------
# DP-aware adaptive direction ([P] Eqs. 24-26)
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrismAdaptiveConfig:
    """Rank-space Adam of [P] Eqs. 24-26.

    ``floor_scale`` is c in ``λ_A = c (σC/b)² tr(N^{-1})/r`` (Eq. 26 fixes λ only up to a constant);
    ``eps`` is added to both floors so the preconditioner stays invertible when σ = 0. ``bias_correction``
    divides the moments by ``1 − β^t`` as Adam does (Eqs. 24-25 print the uncorrected EMA; the authors'
    code corrects). ``canonical_lift``: the moments read :func:`relift` of the noisy update, a function of
    ``ΔZ_dp`` alone, so the step is post-processing of [P] Thm 3.4's Gaussian mechanism (default); False reads the
    sampled pair (ΔA_dp, ΔB_dp) as Eq. 24 prints, whose noise-free col(A) block leaks beyond Thm 3.4
    (``experiments/prism_leak.py``).
    """

    beta1: float = catalogue.PRISM_BETA1
    beta2: float = 0.999
    floor_scale: float = 1.0
    eps: float = 1e-8
    bias_correction: bool = True
    canonical_lift: bool = True

    def __post_init__(self):
        check.real_in("beta1", self.beta1, 0.0, 1.0, high_open=True)
        check.real_in("beta2", self.beta2, 0.0, 1.0, high_open=True)
        check.non_negative("floor_scale", self.floor_scale)
        check.positive("eps", self.eps)
        check.boolean("bias_correction", self.bias_correction)
        check.boolean("canonical_lift", self.canonical_lift)


@dataclass(frozen=True)
class PrismAdaptiveState:
    """The adaptive rule's moments per model and module ([P] Eq. 24).

    First moments m_A (..., m, r), m_B (..., n, r); rank-space second moments V_A, V_B (..., r, r); ``steps``
    taken (for bias correction).
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
    check.non_negative("noise_std", noise_std)
    check.non_negative("floor_scale", floor_scale)
    return _floors(*_geometry(factors), noise_std, floor_scale)


def _relift(update: TangentLift, geometry_A: _ColumnGeometry, geometry_B: _ColumnGeometry) -> TangentLift:
    A, B = geometry_A.factor, geometry_B.factor
    dA, dB = update
    # ΔZ B = ΔA N + A (Bᵀ ΔB)ᵀ and ΔZᵀ A = B (Aᵀ ΔA)ᵀ + ΔB M, with ΔZ = ΔA Bᵀ + A ΔBᵀ never formed.
    intrinsic_gradients = FactorGradients(
        dA @ geometry_B.gram + A @ (B.mT @ dB).mT, B @ (A.mT @ dA).mT + dB @ geometry_A.gram
    )
    return _lift(intrinsic_gradients, geometry_A, geometry_B)


def relift(update: TangentLift, factors: LoraFactors) -> TangentLift:
    """The canonical lift (Eq. 14) of ``ΔZ = ΔA Bᵀ + A ΔBᵀ``: the representative of ΔZ that depends on ΔZ alone.

    A pair (ΔA, ΔB) determines ΔZ, but ΔZ determines the pair only up to the gauge directions ``(A S, −B Sᵀ)``
    (S r×r), which leave ΔZ unchanged. Eq. 17's noisy pair is such a non-canonical representative: its signal
    is the canonical lift of the clipped sum, its noise (Eq. 19) has ``Q_Aᵀ Ξ_A = 0``, so its gauge component
    ``Q_Aᵀ ΔA_dp`` is a noise-free function of the clipped sum. ``relift`` maps the pair to
    ``lift(g_A = ΔZ B, g_B = ΔZᵀ A)``, computed from r×r products in O((m+n) r²).

    Post-processing (proof). The output is a function of ΔZ and of the factors (A, B) only, and the factors are
    the step's input, fixed before the noise is drawn (functions of earlier releases). Hence any computation
    that reads the noisy update only through ``relift`` is a function of ``(ΔZ_dp, A, B)``, and by induction over
    steps (moments included) of the sequence of ΔZ_dp's: post-processing of [P] Thm 3.4's Gaussian mechanism
    on ΔZ_dp. Identities (tested): ``relift`` gives back the same ΔZ (ΔZ is tangent, ``P(ΔZ) = ΔZ``, [P] Lemma
    A.14), it fixes every canonical lift (``lift(P(G)) = lift(G)`` since ``P(G) B = G B`` and
    ``P(G)ᵀ A = Gᵀ A``), and two pairs with the same ΔZ give the same output.
    """
    update, factors = _as_pair(TangentLift, update, "update"), _as_pair(LoraFactors, factors, "factors")
    _check_factors(*factors)
    _check_like("update.dA", update.dA, "A", factors.A)
    _check_like("update.dB", update.dB, "B", factors.B)
    return _relift(update, *_geometry(factors))


def _inverse_sqrt_spd(matrix: Tensor, scale: float = 1.0) -> Tensor:
    """``scale · matrix^{-1/2}`` of symmetric positive definite matrices (..., r, r), from their eigendecomposition."""
    eigenvalues, eigenvectors = torch.linalg.eigh(matrix)
    return (eigenvectors * (scale * eigenvalues.rsqrt()).unsqueeze(-2)) @ eigenvectors.mT


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
        first_A=dA.lerp(state.first_A, config.beta1),  # β1 m_A + (1 − β1) ΔA in one pass
        first_B=dB.lerp(state.first_B, config.beta1),
        second_A=config.beta2 * state.second_A + (1 - config.beta2) * (dA.mT @ dA) / m,
        second_B=config.beta2 * state.second_B + (1 - config.beta2) * (dB.mT @ dB) / n,
        steps=state.steps + 1,
    )
    first_scale, second_scale = 1.0, 1.0
    if config.bias_correction:
        first_scale = 1.0 / (1.0 - config.beta1**new_state.steps)
        second_scale = 1.0 / (1.0 - config.beta2**new_state.steps)
    floors = torch.stack(torch.broadcast_tensors(*_floors(geometry_A, geometry_B, noise_std, config.floor_scale)))
    # Both sides' r×r matrices in one eigendecomposition call; the floors added to their diagonals in place.
    seconds = second_scale * torch.stack(torch.broadcast_tensors(new_state.second_A, new_state.second_B))
    torch.diagonal(seconds, dim1=-2, dim2=-1).add_((floors + config.eps).unsqueeze(-1))
    precondition_A, precondition_B = _inverse_sqrt_spd(seconds, first_scale)
    direction = TangentLift(_times(new_state.first_A, precondition_A), _times(new_state.first_B, precondition_B))
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
    check.non_negative("noise_std", noise_std)
    return _adaptive_direction(state, noisy_update, *_geometry(factors), noise_std, config)


# --------------------------------------------------------------------------------------------------------------
# Retraction ([P] Eq. 22) and gauge alignment ([P] App. A.24)
# --------------------------------------------------------------------------------------------------------------


class _Retraction(NamedTuple):
    """The truncated SVD of ``Z − η(U_A Bᵀ + A U_Bᵀ)`` in orthonormal bases of ``[A, U_A]``, ``[B, U_B]``.

    ``basis_*`` are the bases' two m×r / n×r blocks ``(Q, Q_2)`` (:func:`_extended_basis`), ``[Q, Q_2] @
    triangular_*`` is ``[A, U_A]`` / ``[B, U_B]``; the rank-r result is ``([Q, Q_2]_left left)
    diag(singular_values) ([Q, Q_2]_right right)ᵀ`` (:func:`_times_basis`).
    """

    basis_left: tuple[Tensor, Tensor]
    basis_right: tuple[Tensor, Tensor]
    triangular_left: Tensor
    triangular_right: Tensor
    left: Tensor
    singular_values: Tensor
    right: Tensor


def _times_basis(blocks: tuple[Tensor, Tensor], small: Tensor) -> Tensor:
    """``[Q, Q_2] @ small`` for an extended basis' blocks and ``small`` (..., 2r, k), the blocks never concatenated."""
    basis, outside_basis = blocks
    rank = basis.shape[-1]
    return _add_product(_times(outside_basis, small[..., rank:, :]), basis, small[..., :rank, :], 1.0)


def _top_singular_triplets(core: Tensor, rank: int) -> tuple[Tensor, Tensor, Tensor]:
    """The ``rank`` largest singular values of square ``core`` (descending) and their left and right vectors.

    From the float64 eigendecomposition ``core coreᵀ = U Λ Uᵀ``: ``S = Λ^{1/2}`` and ``V = coreᵀ U S^{-1}`` (0 for a
    zero singular value, whose balanced factor column is 0 either way). Half the time of ``torch.linalg.svd`` on
    PRISM's 2r×2r cores, where LAPACK's cost per small matrix dominates the step. The Gram squares the condition
    number: relative accuracy ~1e-16 (σ_1/σ_r)², far below float32 rounding for the cores training meets
    (σ_1/σ_r < 10 and σ_r/σ_{r+1} > 1.02 measured on digits).
    """
    wide = core.double()
    eigenvalues, eigenvectors = torch.linalg.eigh(wide @ wide.mT)  # ascending
    left = eigenvectors[..., -rank:].flip(-1)
    singular_values = eigenvalues[..., -rank:].flip(-1).clamp(min=0.0).sqrt()
    inverse = torch.where(singular_values > 0, singular_values.reciprocal(), 0.0)
    right = (wide.mT @ left) * inverse.unsqueeze(-2)
    return left.to(core.dtype), singular_values.to(core.dtype), right.to(core.dtype)


_ILL_CONDITIONED = 1e-12  # PᵀP's smallest/largest eigenvalue below which the polar factor comes from the SVD


def _procrustes_rotation(matrix: Tensor) -> Tensor:
    """``argmax_W tr(Wᵀ P)`` over orthogonal W for square P: its polar factor ``P (PᵀP)^{-1/2}`` when P is nonsingular.

    The same W as ``U Vᵀ`` from the SVD ``P = U Σ Vᵀ``; from the float64 eigendecomposition of ``PᵀP`` at half the
    cost of the SVD. Accuracy as :func:`_top_singular_triplets` (PRISM's P has condition number < 10 measured).
    A P whose condition number exceeds 10^6 (PᵀP's eigenvalues 10^12 apart) takes ``U Vᵀ`` from the SVD, which
    is a maximiser even for a singular P, where the inverse square root would be infinite.
    """
    wide = matrix.double()
    eigenvalues, eigenvectors = torch.linalg.eigh(wide.mT @ wide)  # ascending
    if bool((eigenvalues[..., 0] <= _ILL_CONDITIONED * eigenvalues[..., -1]).any()):
        left, _, right = torch.linalg.svd(wide)
        return (left @ right).to(matrix.dtype)
    return (wide @ ((eigenvectors * eigenvalues.rsqrt().unsqueeze(-2)) @ eigenvectors.mT)).to(matrix.dtype)


def _extended_basis(geometry: _ColumnGeometry, direction: Tensor) -> tuple[tuple[Tensor, Tensor], Tensor]:
    """``(Q, Q_2)``, ``[Q, Q_2]`` orthonormal (m×2r), and ``T`` (2r×2r) with ``[Q, Q_2] T = [X, U]``, from X's basis Q.

    Q_2 is the QR basis of U's part outside col(X), projected out twice (classical Gram-Schmidt loses
    orthogonality to Q in proportion to ‖U‖/‖(I − Π_X) U‖ once; twice is enough): a QR of m×r instead of m×2r.
    """
    basis = geometry.basis
    inside = basis.mT @ direction
    outside = _add_product(direction, basis, inside, -1.0)
    correction = basis.mT @ outside
    outside_basis, outside_triangular = torch.linalg.qr(_add_product(outside, basis, correction, -1.0))
    coordinates = torch.broadcast_to(geometry.coordinates, inside.shape)
    top = torch.cat([coordinates, inside + correction], -1)
    bottom = torch.cat([torch.zeros_like(outside_triangular), outside_triangular], -1)
    return (basis, outside_basis), torch.cat([top, bottom], -2)


def _retraction(
    geometry_A: _ColumnGeometry, geometry_B: _ColumnGeometry, direction: TangentLift, learning_rate: float
) -> _Retraction:
    rank = geometry_A.factor.shape[-1]
    basis_left, triangular_left = _extended_basis(geometry_A, direction.dA)
    basis_right, triangular_right = _extended_basis(geometry_B, direction.dB)
    # [A, U_A] K [B, U_B]ᵀ with K = [[I, −ηI], [−ηI, 0]]: scale the blocks instead of forming K.
    coupled_right = torch.cat(
        [
            triangular_right[..., :rank] - learning_rate * triangular_right[..., rank:],
            -learning_rate * triangular_right[..., :rank],
        ],
        -1,
    )
    left, singular_values, right = _top_singular_triplets(triangular_left @ coupled_right.mT, rank)
    return _Retraction(basis_left, basis_right, triangular_left, triangular_right, left, singular_values, right)


def retract(factors: LoraFactors, direction: TangentLift, learning_rate: float) -> LoraFactors:
    """Best rank-r approximation of ``Z − η(U_A Bᵀ + A U_Bᵀ)`` ([P] Eq. 22), balanced.

    Balanced: ``A = U S^{1/2}``, ``B = V S^{1/2}`` (so ``AᵀA = BᵀB = S``).

    ``Z − η(U_A Bᵀ + A U_Bᵀ) = [A, U_A] K [B, U_B]ᵀ`` with ``K = [[I, −ηI], [−ηI, 0]]``; orthonormal bases of the
    m×2r and n×2r blocks (:func:`_extended_basis`) give ``Q_1 (T_1 K T_2ᵀ) Q_2ᵀ`` and the SVD of the 2r×2r core
    gives the truncated SVD (Eckart-Young, [P] Lemma A.25). No ``η² U_A U_Bᵀ`` term: the step is additive in Z
    (Lemma A.26). The output has rank ≤ r (< r only if the update cancels directions of Z exactly).
    """
    factors = _as_pair(LoraFactors, factors, "factors")
    direction = _as_pair(TangentLift, direction, "direction")
    _check_factors(*factors)
    _check_like("U_A", direction.dA, "A", factors.A)
    _check_like("U_B", direction.dB, "B", factors.B)
    check.non_negative("learning_rate", learning_rate)
    retraction = _retraction(*_geometry(factors), direction, learning_rate)
    root = retraction.singular_values.sqrt().unsqueeze(-2)
    return LoraFactors(
        _times_basis(retraction.basis_left, retraction.left * root),
        _times_basis(retraction.basis_right, retraction.right * root),
    )


def _retract_aligned(
    geometry_A: _ColumnGeometry, geometry_B: _ColumnGeometry, direction: TangentLift, learning_rate: float
) -> tuple[_ColumnGeometry, _ColumnGeometry]:
    """``align_gauge(retract(factors, direction, η), factors)`` and the new factors' geometry, in r×r algebra.

    With ``A' = Q_1 L S^{1/2}`` and ``A = Q_1 T_1[:, :r]``, the Procrustes matrix ``A'ᵀA + B'ᵀB`` of
    :func:`align_gauge` is ``S^{1/2} (Lᵀ T_1[:, :r] + Rᵀ T_2[:, :r])``; with its polar factor W the aligned
    factor is ``(Q_1 L W) (Wᵀ S^{1/2} W)``: an orthonormal basis times a symmetric r×r matrix whose SVD is known,
    so the next step needs no QR or SVD of the factors (:class:`_ColumnGeometry`).
    """
    retraction = _retraction(geometry_A, geometry_B, direction, learning_rate)
    rank = geometry_A.factor.shape[-1]
    root = retraction.singular_values.sqrt()
    procrustes = root.unsqueeze(-1) * (
        retraction.left.mT @ retraction.triangular_left[..., :rank]
        + retraction.right.mT @ retraction.triangular_right[..., :rank]
    )
    rotation = _procrustes_rotation(procrustes)
    coordinates = (rotation.mT * root.unsqueeze(-2)) @ rotation
    basis_A = _times_basis(retraction.basis_left, retraction.left @ rotation)
    basis_B = _times_basis(retraction.basis_right, retraction.right @ rotation)
    geometry_A = _geometry_from_svd("A", _times(basis_A, coordinates), basis_A, coordinates, root, rotation.mT)
    # Balanced (A'ᵀA' = B'ᵀB'): B' has A''s coordinates and Gram matrices, its own basis.
    factor_B = _times(basis_B, coordinates)
    _check_full_rank("B", factor_B, root)
    return geometry_A, dataclasses.replace(geometry_A, factor=factor_B, basis=basis_B)


def align_gauge(factors: LoraFactors, reference: LoraFactors) -> LoraFactors:
    """Orthogonal Procrustes gauge alignment ``(A Q, B Q)`` ([P] App. A.24, Lemma A.28).

    ``Q = argmin ‖AQ − A_ref‖² + ‖BQ − B_ref‖²``: Z, the projectors and balance are unchanged; the factors stay
    close to the previous step's, so the factor-space moments of Eq. 24 keep referring to the same columns.
    """
    factors = _as_pair(LoraFactors, factors, "factors")
    reference = _as_pair(LoraFactors, reference, "reference")
    _check_factors(*factors)
    _check_factors(*reference)
    _check_like("reference.A", reference.A, "A", factors.A)
    _check_like("reference.B", reference.B, "B", factors.B)
    rotation = _procrustes_rotation(factors.A.mT @ reference.A + factors.B.mT @ reference.B)
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
        check.positive("learning_rate", self.learning_rate)


class PrismStepResult(NamedTuple):
    """What one PRISM step returns.

    New factors and states per module; Eq. 17's noisy pairs (ΔA_dp, ΔB_dp) per module (internal: their col(A)
    block is noise-free, so they are not a private release; ΔZ_dp is); the global per-example intrinsic norms
    s_i and clip factors α_i, both (..., b); per module the new factors' geometry (internal: the next step's,
    which then needs no QR or SVD of the factors).
    """

    factors: tuple[LoraFactors, ...]
    states: tuple[PrismAdaptiveState, ...] | None
    noisy_updates: tuple[TangentLift, ...]
    per_example_norms: Tensor
    clip_factors: Tensor
    geometries: tuple[tuple[_ColumnGeometry, _ColumnGeometry], ...]


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
       Eq. 14 is linear, so the clipped mean of gradients is lifted once), the adaptive direction (Eqs. 24-26, on
       :func:`relift` of the noisy pair unless ``canonical_lift`` is off) or ``U = ΔA_dp``, the retraction
       (Eq. 22) and a Procrustes gauge alignment to the input factors (App. A.24), both in r×r algebra
       (:func:`_retract_aligned`).

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
    coefficients = weights / config.privacy.expected_batch_size
    clipped_means = [
        FactorGradients(*(torch.einsum("...b,...bdr->...dr", coefficients, g) for g in gradients))
        for gradients in per_example_gradients
    ]
    noises = _step_noise(draw_step_omegas(factors, generator), geometries, config.adaptive)
    return _step_from_clipped_means(factors, geometries, clipped_means, norms, alphas, config, noises, states)


def _step_from_clipped_means(
    factors: Sequence[LoraFactors],
    geometries,
    clipped_means: Sequence[FactorGradients],
    norms: Tensor,
    alphas: Tensor,
    config: PrismStepConfig,
    noises: Sequence[_ModuleNoise],
    states: Sequence[PrismAdaptiveState] | None,
    noisy_updates_wanted: bool = True,
) -> PrismStepResult:
    """:func:`prism_step` after clipping, with the step's noise (:func:`_step_noise` for ``config.adaptive``).

    Per module, lift ``(1/b) Σ_i α_i w_i (g_A,i, g_B,i)`` (Eq. 14, linear, so this is the clipped mean of the
    per-example lifts), add the noise (Eq. 17), adaptive direction, retraction, alignment. Eq. 17's pairs, which
    the adaptive rule reading the canonical lift does not use, are formed only if ``noisy_updates_wanted`` (the
    engine does not read them: the result's ``noisy_updates`` is then empty).
    """
    if config.adaptive is not None and states is None:
        states = [initial_adaptive_state(module_factors) for module_factors in factors]
    new_geometries: list[tuple[_ColumnGeometry, _ColumnGeometry]] = []
    new_states: list[PrismAdaptiveState] = []
    noisy_updates: list[TangentLift] = []
    for index, (geometry_A, geometry_B) in enumerate(geometries):
        signal = _lift(clipped_means[index], geometry_A, geometry_B)
        noise, relifted = noises[index]
        # The moments (or plain tangent SGD) read Eq. 17's pair, or its canonical lift when there is one.
        direction = _noisy_mean(signal, config.privacy, noise if relifted is None else relifted)
        if noisy_updates_wanted:
            noisy_updates.append(direction if relifted is None else _noisy_mean(signal, config.privacy, noise))
        if config.adaptive is not None and states is not None:
            direction, state = _adaptive_direction(
                states[index], direction, geometry_A, geometry_B, config.privacy.noise_std, config.adaptive
            )
            new_states.append(state)
        new_geometries.append(_retract_aligned(geometry_A, geometry_B, direction, config.learning_rate))
    return PrismStepResult(
        tuple(LoraFactors(geometry_A.factor, geometry_B.factor) for geometry_A, geometry_B in new_geometries),
        tuple(new_states) if config.adaptive is not None else None,
        tuple(noisy_updates),
        norms,
        alphas,
        tuple(new_geometries),
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

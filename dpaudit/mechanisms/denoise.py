"""Spectral denoising of DP gradients ([D] Alg. 1, Secs. 2.3, 3.2, App. D-E; docs/theory.md §1.7).

Post-processing of one linear layer's noisy gradient ``g̃ = ḡ + Δ`` (..., n, m), ``Δ`` with i.i.d.
``N(0, σ_e²)`` entries. ``σ_e`` is the per-entry noise std *of the tensor passed in*: ``σC`` for the noisy sum,
``σC/b`` for the noisy average that DP-SGD divides by the (expected) batch size b ([D] Sec. 2.3, App. E.1).
Privacy is unchanged (post-processing, [D] Sec. 2.1.3). Every function is batched over leading dims; the
estimator is symmetric in the two matrix dimensions, so the layer's orientation does not matter.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from dpaudit.errors import UsageError

DEFAULT_THRESHOLD_MULTIPLIER = 1.02  # κ of [D] Sec. 3.2, tuned once on SST-2 and used for every model there


class DenoisedGradient(NamedTuple):
    """The denoised gradient (same shape as the input) and, per matrix (...), whether the shrinkage was applied."""

    gradient: Tensor
    applied: Tensor


def _noise_std_tensor(noise_std: float | Tensor, batch_shape: torch.Size, like: Tensor) -> Tensor:
    std = torch.as_tensor(noise_std, dtype=like.dtype, device=like.device)
    try:
        std = torch.broadcast_to(std, batch_shape)
    except RuntimeError:
        raise UsageError(
            f"noise_std must be a number or broadcast to the batch shape {tuple(batch_shape)}; "
            f"got shape {tuple(std.shape)}"
        ) from None
    if not bool((torch.isfinite(std) & (std > 0)).all()):
        raise UsageError(
            "noise_std must be finite and > 0 (per-entry DP noise std σC/b); without noise there is "
            "nothing to denoise: skip the call"
        )
    return std


def bulk_edge(noise_std: float | Tensor, rows: int, cols: int) -> float | Tensor:
    """``σ(√n + √m)``: the largest singular value of an n×m pure-noise matrix ([D] Eq. 3, App. E.2)."""
    return noise_std * (math.sqrt(rows) + math.sqrt(cols))


def optimal_shrinkage(singular_values: Tensor, noise_std: float | Tensor, rows: int, cols: int) -> Tensor:
    """Shabalin-Nobel (2013) optimal singular-value shrinker for Frobenius loss, in finite-size units ([D] Eq. 9).

    For an observed singular value ``y`` of an n×m matrix with per-entry noise std σ::

        η(y) = sqrt((y² − σ²(m+n))² − 4σ⁴mn) / y    if y > σ(√m + √n),   else 0.

    Derivation: [D] Eq. 9 writes ``η = λ̂ · c_u(λ̂) · c_v(λ̂)``, ``λ̂ = F^{-1}(y)``, with the singular-value map
    ``F(λ)² = (λ + σ²n/λ)(λ + σ²m/λ) = λ² + σ²(m+n) + σ⁴mn/λ²`` (Eq. 3) and the squared cosines
    ``c_u² = (λ⁴ − mnσ⁴)/(λ⁴ + mλ²σ²)``, ``c_v² = (λ⁴ − mnσ⁴)/(λ⁴ + nλ²σ²)`` (Eqs. 4-5). Then
    ``λ c_u c_v = (λ⁴ − mnσ⁴)/(λ² F(λ))`` and ``y² − σ²(m+n) = λ² + σ⁴mn/λ²`` give
    ``(y² − σ²(m+n))² − 4σ⁴mn = (λ² − σ⁴mn/λ²)²``, hence the closed form (Gavish-Donoho's
    ``η(y) = √((y² − β − 1)² − 4β)/y`` rescaled by ``σ√n``, β = m/n). No inversion of F is needed.
    ``noise_std`` broadcasts against ``singular_values[..., :1]``.
    """
    variance = torch.as_tensor(noise_std, dtype=singular_values.dtype, device=singular_values.device) ** 2
    excess = singular_values**2 - variance * (rows + cols)
    discriminant = (excess**2 - 4 * variance**2 * rows * cols).clamp(min=0.0)
    above_edge = singular_values > bulk_edge(variance.sqrt(), rows, cols)
    return torch.where(
        above_edge,
        discriminant.sqrt() / singular_values.clamp(min=torch.finfo(variance.dtype).tiny),
        torch.zeros_like(singular_values),
    )


def denoise_gradient(
    noisy_gradient: Tensor, noise_std: float | Tensor, threshold_multiplier: float = DEFAULT_THRESHOLD_MULTIPLIER
) -> DenoisedGradient:
    """[D] Eq. 10: optimal shrinkage, applied only above the threshold, rescaled to the input's norm.

    Per matrix ``g̃`` (n×m) with singular values ``λ̃_1 ≥ λ̃_2 ≥ …``:

    * if ``λ̃_1 > κ σ_e (√n + √m)`` (κ = ``threshold_multiplier``): ``ĝ = Σ_i η(λ̃_i) ũ_i ṽ_iᵀ``
      (:func:`optimal_shrinkage`; components inside the noise bulk get η = 0), returned as
      ``(‖g̃‖_F / ‖ĝ‖_F) ĝ`` so that per-layer cosine gains add up over layers ([D] Thm E.1);
    * otherwise ``g̃`` itself, unchanged (bit for bit).

    ``noisy_gradient`` (..., n, m); ``noise_std`` a number or a tensor broadcasting to the batch dims (...).
    Cost: one SVD per matrix (the dense gradient's, not a LoRA factor's).
    """
    if not isinstance(noisy_gradient, Tensor) or noisy_gradient.ndim < 2 or not noisy_gradient.dtype.is_floating_point:
        raise UsageError("noisy_gradient must be a real floating tensor of shape (..., n, m)")
    if not (math.isfinite(threshold_multiplier) and threshold_multiplier >= 1.0):
        raise UsageError(
            f"threshold_multiplier (κ) must be >= 1 (below 1 the estimator can return 0); got {threshold_multiplier}"
        )
    rows, cols = noisy_gradient.shape[-2:]
    std = _noise_std_tensor(noise_std, noisy_gradient.shape[:-2], noisy_gradient)
    left, singular_values, right_t = torch.linalg.svd(noisy_gradient, full_matrices=False)
    applied = singular_values[..., 0] > threshold_multiplier * bulk_edge(std, rows, cols)
    shrunk = optimal_shrinkage(singular_values, std.unsqueeze(-1), rows, cols)
    estimate = (left * shrunk.unsqueeze(-2)) @ right_t
    # ‖ĝ‖_F = ‖η‖_2; η_1 > 0 wherever applied (λ̃_1 > κ·edge ≥ edge), the 1 elsewhere only avoids 0/0.
    estimate_norm = torch.where(applied, shrunk.norm(dim=-1), torch.ones_like(shrunk[..., 0]))
    scale = torch.linalg.matrix_norm(noisy_gradient) / estimate_norm
    rescaled = estimate * scale[..., None, None]
    return DenoisedGradient(torch.where(applied[..., None, None], rescaled, noisy_gradient), applied)


def _cosine(a: Tensor, b: Tensor) -> Tensor:
    return (a * b).sum((-2, -1)) / (torch.linalg.matrix_norm(a) * torch.linalg.matrix_norm(b))


def cosine_improvement(denoised: Tensor, noisy: Tensor, clean: Tensor) -> Tensor:
    """``cos(Denoise(g̃), ḡ) − cos(g̃, ḡ)`` per matrix ([D] Sec. 3.1, App. E.1), shape (...).

    ``clean`` is the clipped noiseless sum ḡ (or its average: the cosine is scale free). Evaluation only: a
    mechanism must never read ḡ. For the whole-gradient improvement, concatenate layers into one matrix first.
    """
    for name, value in (("denoised", denoised), ("noisy", noisy), ("clean", clean)):
        if not isinstance(value, Tensor) or value.ndim < 2:
            raise UsageError(f"{name} must be a tensor of shape (..., n, m)")
    if not (denoised.shape == noisy.shape == clean.shape):
        raise UsageError(
            f"denoised, noisy and clean must have the same shape; got {tuple(denoised.shape)}, "
            f"{tuple(noisy.shape)}, {tuple(clean.shape)}"
        )
    if bool((torch.linalg.matrix_norm(clean) == 0).any()) or bool((torch.linalg.matrix_norm(noisy) == 0).any()):
        raise UsageError("cosine similarity is undefined for a zero matrix (clean or noisy)")
    return _cosine(denoised, clean) - _cosine(noisy, clean)

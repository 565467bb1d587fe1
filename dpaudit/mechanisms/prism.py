"""PRISM ([P] Alg. 1; docs/theory.md §1.6) as the update rule of the engine's peft LoRA models.

:class:`PeftLoraAdapter` maps peft's ``lora_A`` / ``lora_B`` tensors to [P]'s factors; :class:`PrismMechanism`
runs :func:`dpaudit.mechanisms.prism_update.prism_step`'s maths on the engine's per-example gradients. The tensor
maths live in :mod:`dpaudit.mechanisms.prism_tangent` (geometry) and :mod:`dpaudit.mechanisms.prism_update`
(Alg. 1's update); the noise-energy diagnostics in :mod:`dpaudit.mechanisms.prism_noise_energy`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from accountants import validation as check
from dpaudit.errors import UsageError
from dpaudit.mechanisms.base import Step
from dpaudit.mechanisms.prism_tangent import (
    FactorGradients,
    FactorSqNorm,
    LoraFactors,
    _as_pair,
    _geometry,
    _tangent_sq_norms,
    balanced_random_factors,
)
from dpaudit.mechanisms.prism_update import (
    PrismAdaptiveConfig,
    PrismAdaptiveState,
    PrismPrivacyConfig,
    PrismStepConfig,
    _step_from_clipped_sums,
    clip_factors,
    global_intrinsic_norm,
)


@dataclass(frozen=True)
class PeftLoraAdapter:
    """The map between peft's LoRA tensors and [P]'s factors (docs/theory.md §0).

    peft: ``ΔW = s · lora_B.weight @ lora_A.weight``, ``lora_A.weight`` (r × n_in), ``lora_B.weight``
    (n_out × r), ``s = lora_alpha / r``. [P]: ``A = lora_B.weight``, ``B = lora_A.weightᵀ``, ``Z = A Bᵀ``, so
    ``ΔW = s Z`` and ``∇_Z ℓ = s ∇_W ℓ``. peft's factor gradients already contain s: ``∂ℓ/∂lora_B = s ∇_Wℓ ·
    lora_Aᵀ = (∇_Z ℓ) B = g_A`` and ``(∂ℓ/∂lora_A)ᵀ = (∇_Z ℓ)ᵀ A = g_B``. All PRISM quantities (clip norm C,
    noise, learning rate) therefore act on Z, not on ΔW. Conv2d LoRA tensors must first be flattened to
    ``lora_A`` (..., r, c_in·kh·kw) and ``lora_B`` (..., c_out, r) (docs/theory.md §1.2 convention).
    """

    scale: float

    def __post_init__(self):
        check.positive("scale (peft's lora_alpha / r)", self.scale)

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


@dataclass
class PrismTrainingState:
    """PRISM's state for one campaign chunk.

    One noise generator per model, the (lora_A, lora_B) tensor names of each LoRA module, and the adaptive
    moments of every module (None before the first step).
    """

    generators: list[torch.Generator]
    modules: tuple[tuple[str, str], ...]
    adaptive: tuple[PrismAdaptiveState, ...] | None = None


@dataclass(frozen=True)
class PrismMechanism:
    """[P] Alg. 1 as the update rule of the engine's peft LoRA models (docs/theory.md §1.6).

    Starts every module from balanced full-rank factors ``A = √c Q_A``, ``B = √c Q_B`` (Haar Q, spectral norm
    c = ``init_scale``; [P] needs full column rank, peft's ``lora_B = 0`` is rank 0), drawn per model from its
    "noise" stream before any step noise. Each step is :func:`prism_step` on all modules at once: lift, global
    intrinsic clipping to C, tangent noise ``σC/b`` (b the expected Poisson batch size), the adaptive direction
    (``adaptive``; None: plain tangent SGD) and the retraction, with the schedule's learning rate as η on
    ``Z`` (``ΔW = s Z``, s = ``lora_scale``, :class:`PeftLoraAdapter`). The engine's momentum is not used:
    the adaptive rule keeps its own moments, and its steps are Adam-sized (≈ η per entry), so PRISM wants a
    smaller ``--lr`` than SGD (0.01 on digits). Conv LoRA tensors are flattened (docs/theory.md §1.2 convention).
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
        check.positive("init_scale", self.init_scale)

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

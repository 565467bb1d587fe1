"""PRISM ([P] Alg. 1; docs/theory.md §1.6) as the update rule of the engine's peft LoRA models.

:class:`PeftLoraAdapter` maps peft's ``lora_A`` / ``lora_B`` tensors to [P]'s factors; :class:`PrismMechanism`
runs :func:`dpaudit.mechanisms.prism.update.prism_step`'s maths on the engine's per-example gradients. The tensor
maths live in :mod:`dpaudit.mechanisms.prism.tangent` (geometry) and :mod:`dpaudit.mechanisms.prism.update`
(Alg. 1's update); the noise-energy diagnostics in :mod:`dpaudit.studies.prism_noise_energy`.
"""

from __future__ import annotations

import math
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
from torch import Tensor

from accountants import validation as check
from dpaudit import background
from dpaudit.mechanisms.base import Mechanism, Step
from dpaudit.mechanisms.prism.tangent import (
    FactorGradients,
    FactorSqNorm,
    LoraFactors,
    _as_pair,
    _geometry,
    _tangent_sq_norms,
    balanced_random_factors,
)
from dpaudit.mechanisms.prism.update import (
    PrismAdaptiveConfig,
    PrismAdaptiveState,
    PrismPrivacyConfig,
    PrismStepConfig,
    _step_from_clipped_means,
    _step_noise,
    clip_factors,
    draw_step_omegas,
    global_intrinsic_norm,
)
from dpaudit.mechanisms.privacy import ZERO_NOISE, PrivacyEvent, SubsampledGaussian, Training


def prism_rank(rank: int, d_out: int, d_in: int) -> int:
    """The rank PRISM adapts a d_out×d_in layer at: the LoRA rank r, capped at min(d_out, d_in).

    A rank-r factorisation needs r ≤ min(d_out, d_in) ([P] Thm 3.1: both factors of full column rank); at the cap
    the tangent space is the whole d_out×d_in space (:class:`PrismMechanism`).
    """
    return min(rank, d_out, d_in)


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

    One noise generator per model, the (lora_A, lora_B) tensor names of each LoRA module, the rank PRISM adapts
    each module at (:func:`prism_rank`), and the adaptive moments of every module (None before the
    first step).
    """

    generators: list[torch.Generator]
    modules: tuple[tuple[str, str], ...]
    ranks: tuple[int, ...]
    adaptive: tuple[PrismAdaptiveState, ...] | None = None
    geometries: tuple = ()  # the last step's new factors' geometry (PrismStepResult.geometries), reused if unchanged
    written: dict = field(default_factory=dict)  # name → (tensor, version) of each LoRA tensor after the last write
    noise_ahead: Future | None = None  # the next step's PrismMechanism._drawn_noise, made on the background thread


@dataclass(frozen=True)
class PrismMechanism(Mechanism):
    """[P] Alg. 1 as the update rule of the engine's peft LoRA models (docs/theory.md §1.6).

    Starts every module from balanced full-rank factors ``A = √c Q_A``, ``B = √c Q_B`` (Haar Q, spectral norm
    c = ``init_scale``; [P] needs full column rank, peft's ``lora_B = 0`` is rank 0), drawn per model from its
    "noise" stream before any step noise. Each step is :func:`prism_step` on all modules at once: lift, global
    intrinsic clipping to C, tangent noise ``σC/b`` (b the expected Poisson batch size), the adaptive direction
    (``adaptive``; None: plain tangent SGD) and the retraction, with the schedule's learning rate as η on
    ``Z`` (``ΔW = s Z``, s = ``lora_scale``, :class:`PeftLoraAdapter`). The engine's momentum is not used:
    the adaptive rule keeps its own moments, and its steps are Adam-sized (≈ η per entry), so PRISM wants a
    smaller ``--lr`` than SGD (0.01 on digits). Conv LoRA tensors are flattened (docs/theory.md §1.2 convention).
    Privacy: Poisson-subsampled Gaussian with multiplier σ per step on ΔZ_dp ([P] Thm 3.4); the adaptive rule
    reads ΔZ_dp's canonical lift (:attr:`PrismAdaptiveConfig.canonical_lift`), so the rest is post-processing.

    A layer with fewer outputs (or inputs) than the LoRA rank r, such as a 10-class head at r = 16, is adapted at
    rank ``r_ℓ = min(r, d_out, d_in)`` (:func:`prism_rank`): a rank-r factorisation of a d_out×d_in
    matrix needs r ≤ both, and at ``r_ℓ = min(d_out, d_in)`` the tangent space is every d_out×d_in matrix, so
    the layer gets the full, isotropic Gaussian noise. peft's other ``r − r_ℓ`` components stay exactly zero
    (zero rows of lora_A, zero columns of lora_B: no contribution to ΔW and zero gradients). Clipping and noise
    cover every adapted layer, so [P] Thm 3.4's accounting is unchanged.
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
    # peft's LoRA rank r, which only names the per-layer ranks in privacy()'s theorem (setup reads r from the
    # shapes): not a training parameter, so outside the repr (the campaign's mechanism fingerprint) and equality.
    rank: int | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        PrismPrivacyConfig(self.noise_multiplier, self.clip_norm, 1.0)  # validates σ and C
        PeftLoraAdapter(self.lora_scale)
        check.positive("init_scale", self.init_scale)

    @property
    def adapter(self) -> PeftLoraAdapter:
        """The map between peft's LoRA tensors and [P]'s factors at this scale (gradient canaries use it too)."""
        return PeftLoraAdapter(self.lora_scale)

    def setup(self, shapes, randomness) -> PrismTrainingState:
        modules = tuple((name, name.replace(".lora_A.", ".lora_B.")) for name in shapes if ".lora_A." in name)
        # lora_A (r, d_in...), lora_B (d_out, r...): peft's shapes without the model axis.
        ranks = tuple(
            prism_rank(shapes[a_name][0], shapes[b_name][0], math.prod(shapes[a_name][1:]))
            for a_name, b_name in modules
        )
        return PrismTrainingState([model.torch("noise") for model in randomness], modules, ranks)

    def initialise(self, params: dict[str, Tensor], state: PrismTrainingState) -> None:
        adapter = self.adapter
        for (a_name, b_name), rank in zip(state.modules, state.ranks):
            lora_A, lora_B = params[a_name].flatten(2), params[b_name].flatten(2)
            starts = [
                balanced_random_factors(
                    lora_B.shape[1], lora_A.shape[2], rank, self.init_scale, generator, lora_A.dtype
                )
                for generator in state.generators
            ]
            self._write(params, a_name, b_name, adapter.to_peft(LoraFactors(*(torch.stack(f) for f in zip(*starts)))))

    @staticmethod
    def _read(tensors: dict[str, Tensor], a_name: str, b_name: str, rank: int) -> tuple[Tensor, Tensor]:
        """(lora_A, lora_B) of a module, flattened to (K, r_ℓ, d_in), (K, d_out, r_ℓ): its first r_ℓ components."""
        return tensors[a_name].flatten(2)[:, :rank], tensors[b_name].flatten(2)[..., :rank]

    @staticmethod
    def _write(params: dict[str, Tensor], a_name: str, b_name: str, factors: tuple[Tensor, Tensor]) -> None:
        """Set a module's first r_ℓ components to ``factors`` (lora_A, lora_B) and the others to zero."""
        for name, value, rank_dim in ((a_name, factors[0], 1), (b_name, factors[1], 2)):
            flat = params[name].view(*params[name].shape[:2], -1)  # the engine's tensors are contiguous: in place
            rank = value.shape[rank_dim]
            flat.narrow(rank_dim, 0, rank).copy_(value)
            flat.narrow(rank_dim, rank, flat.shape[rank_dim] - rank).zero_()

    def update(self, params: dict[str, Tensor], step: Step, state: PrismTrainingState, learning_rate: float) -> None:
        """One :func:`~dpaudit.mechanisms.prism.update.prism_step` on the engine's per-example gradients.

        They are never materialised: the clipping norms come from
        :meth:`PerExampleGradients.transformed_squared_norms` and the clipped means from
        :meth:`PerExampleGradients.weighted_sum` (peft's ``lora_B`` gradient is ``g_A``, ``lora_A``'s is ``g_Bᵀ``).
        """
        examples = step.example_gradients()
        adapter = self.adapter
        modules = list(zip(state.modules, state.ranks))
        factors = [adapter.to_prism(*self._read(params, a, b, rank)) for (a, b), rank in modules]
        known = state.geometries or (None,) * len(factors)
        geometries = [
            cached if cached is not None and _unchanged(params, state.written, names) else _geometry(pair)
            for pair, cached, names in zip(factors, known, state.modules)
        ]

        def factor_sq_norm(a_name: str, b_name: str, rank: int) -> FactorSqNorm:
            # The engine's gradients have peft's r components; zero-padding the r_ℓ-sized side of the transforms
            # keeps only the first r_ℓ (the others are not PRISM's).
            unused = params[a_name].shape[1] - rank

            def norm(factor: str, left: Tensor | None, right: Tensor) -> Tensor:
                if factor == "A":  # right (K, r_ℓ, q) multiplies lora_B's gradient (K, b, d_out, r)
                    return examples.transformed_squared_norms(b_name, left, _zero_pad(right, unused, -2))
                # ‖left g_B right‖ = ‖rightᵀ lora_A.grad leftᵀ‖, lora_A's gradient (K, b, r, d_in)
                left_t = None if left is None else left.mT
                return examples.transformed_squared_norms(a_name, _zero_pad(right.mT, unused, -1), left_t)

            return norm

        norms = global_intrinsic_norm(
            [
                _tangent_sq_norms(factor_sq_norm(a, b, rank), *geometry)
                for ((a, b), rank), geometry in zip(modules, geometries)
            ]
        )
        alphas = clip_factors(norms, self.clip_norm)
        privacy = PrismPrivacyConfig(self.noise_multiplier, self.clip_norm, step.poisson_batch_size())
        means = examples.weighted_sum(alphas * step.weights / privacy.expected_batch_size)
        clipped_means = [adapter.gradients_to_prism(*self._read(means, a, b, rank)) for (a, b), rank in modules]
        result = _step_from_clipped_means(
            factors,
            geometries,
            clipped_means,
            norms,
            alphas,
            PrismStepConfig(privacy, learning_rate, self.adaptive),
            self._noise(factors, geometries, state),
            state.adaptive,
            noisy_updates_wanted=False,
        )
        state.adaptive, state.geometries = result.states, result.geometries
        for (a, b), new in zip(state.modules, result.factors):
            self._write(params, a, b, adapter.to_peft(new))
        state.written = {name: (params[name], params[name]._version) for pair in state.modules for name in pair}
        if step.followed:
            state.noise_ahead = background.thread().submit(
                self._drawn_noise, list(result.factors), result.geometries, state.generators
            )

    def _drawn_noise(self, factors: list[LoraFactors], geometries, generators: list[torch.Generator]):
        """A step's normals (:func:`draw_step_omegas`), the geometries they are lifted at, and the noise."""
        omegas = draw_step_omegas(factors, generators)
        return omegas, geometries, _step_noise(omegas, geometries, self.adaptive)

    def _noise(self, factors: list[LoraFactors], geometries: list, state: PrismTrainingState) -> list:
        """This step's tangent noise (:func:`_step_noise`), made ahead on the background thread by the last step.

        Only this stream uses the generators after :meth:`initialise`, in step order, so drawing ahead changes no
        number (as :class:`dpaudit.mechanisms.dpsgd.GaussianNoiseStream`); drawing and lifting, ~1/10 of a step on
        CPU, leave the critical path. Factors changed since the last step (not the geometry the noise was lifted
        at) get the same normals lifted again.
        """
        ahead, state.noise_ahead = state.noise_ahead, None
        if ahead is None:
            return self._drawn_noise(factors, geometries, state.generators)[2]
        omegas, lifted_at, noise = ahead.result()
        if all(made is current for made, current in zip(lifted_at, geometries)):
            return noise
        return _step_noise(omegas, geometries, self.adaptive)

    def transform(self, step: Step, state) -> dict[str, Tensor]:
        raise TypeError("PRISM owns its update (a retraction, [P] Eq. 22): the engine calls update()")

    def privacy(self, training: Training) -> PrivacyEvent:
        """[P] Thm 3.4: the Poisson-subsampled Gaussian (σ, q, T), clipping and tangent noise on every layer."""
        if self.noise_multiplier == 0:
            return ZERO_NOISE
        layers = ", ".join(
            f"{s.d_out}×{s.d_in}" + ("" if self.rank is None else f" at r={prism_rank(self.rank, s.d_out, s.d_in)}")
            for s in training.layers
        )
        theorem = f"[P] Thm 3.4, clipping and tangent noise on every adapted layer ({layers})"
        return SubsampledGaussian(self.noise_multiplier, training.sample_rate, training.steps, theorem)


def _unchanged(params: dict[str, Tensor], written: dict, names: tuple[str, str]) -> bool:
    """Whether the tensors ``names`` are those the last update wrote, not modified since (same tensor, same version).

    Then the factors are that update's new factors and their geometry, which it returned, is reused. Every in-place
    write bumps a tensor's version counter (views share it), so any other writer forces a fresh geometry.
    """

    def same(name: str) -> bool:
        tensor, version = written.get(name, (None, -1))
        return tensor is params[name] and version == tensor._version

    return all(same(name) for name in names)


def _zero_pad(matrix: Tensor, count: int, dim: int) -> Tensor:
    """``matrix`` with ``count`` rows (dim -2) or columns (dim -1) of zeros appended."""
    if count == 0:
        return matrix
    return torch.nn.functional.pad(matrix, (0, count) if dim == -1 else (0, 0, 0, count))

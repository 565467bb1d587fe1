"""Wishart projection of gradients ([W] Def. 1, Eq. 36; docs/theory.md §1.1-1.3).

Full-weight training where each layer's gradient is right-multiplied by ``M = s² AᵀA``, A with i.i.d.
N(0, 1/r) entries drawn per model and per layer ([W] App. F.1, Eq. 36; conv weights flattened to
d_out × (all other dims)). With the same A this is realisation (b) of noise-free LoRA-FA (docs/theory.md §1.2):
by linearity of momentum SGD, ``W_t = W_0 + s B_t A`` evolves identically.

The noisy projections M1 ``V ↦ M V + Ξ`` and M2 ``V ↦ M (V + Ξ)`` ([W] Def. 3) in training ([W] Alg. 3,
App. F.2; docs/theory.md §1.3): V is the sum of clipped per-example gradients of a Poisson batch, Ξ Gaussian noise, and
M either fixed for the run (the LoRA-FA view, [W] Table 2) or drawn afresh every step ([W] App. F.2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dpaudit.errors import UsageError
from dpaudit.mechanisms.base import Mechanism, Step
from dpaudit.mechanisms.catalogue import check_noise_and_clip
from dpaudit.mechanisms.dpsgd import GaussianNoiseStream, clip_coefficients, noise_std
from dpaudit.mechanisms.privacy import NOT_DP, ZERO_NOISE, NoisyProjectionM2, NotDp, PrivacyEvent, Training, Unknown
from dpaudit.models import draw_lora_a

PROJECTION_VARIANTS = ("m1", "m2")


def draw_factors(
    shapes: dict[str, torch.Size], rank: int, generators: list[torch.Generator]
) -> dict[str, torch.Tensor]:
    """Per weight: (K, r, d_in) factors with i.i.d. N(0, 1/r) entries.

    Model k draws from ``generators[k]``
    weight by weight in ``shapes``' order (the order of the LoRA-FA engine's ``lora_A`` draws).
    """
    factors: dict[str, list[torch.Tensor]] = {name: [] for name in shapes}
    for generator in generators:
        for name, shape in shapes.items():
            a = draw_lora_a((rank, *shape[1:]), rank, generator)
            factors[name].append(a.reshape(rank, -1))
    return {name: torch.stack(stack) for name, stack in factors.items()}


def project(
    gradients: dict[str, torch.Tensor], factors: dict[str, torch.Tensor], scale: float = 1.0
) -> dict[str, torch.Tensor]:
    """``G ← s² G AᵀA`` per (K, d_out, ...) weight ([W] Eq. 36), as ``(G Aᵀ) A``.

    Costs O(d_out·d_in·r), never
    forming the d_in × d_in matrix M.
    """
    projected = {}
    for name, gradient in gradients.items():
        a = factors[name].to(gradient.device, gradient.dtype)  # drawn in float32; the weights may be float64
        flat = gradient.reshape(gradient.shape[0], gradient.shape[1], -1)
        projected[name] = (scale**2 * (flat @ a.transpose(1, 2)) @ a).reshape(gradient.shape)
    return projected


@dataclass(frozen=True)
class WishartProjection(Mechanism):
    """Noise-free matrix projection mechanism on full weights, M fixed for the run ([W] Prop. 2: not DP)."""

    rank: int
    scale: float = 1.0
    name: str = "projection"
    parameterization: str = "full"
    per_example: bool = False

    def setup(self, shapes, randomness) -> dict[str, torch.Tensor]:
        """Per weight: (K, r, d_in) factors from each model's "init" stream, in layer order.

        Same stream and order as the LoRA-FA engine's ``lora_A`` draws, so both realisations share A.
        """
        return draw_factors(shapes, self.rank, [model.torch("init") for model in randomness])

    def transform(self, step: Step, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return project(step.mean_gradients(), state, self.scale)

    def privacy(self, training: Training) -> NotDp:
        return NotDp(f"the noise-free projection: {NOT_DP}")


@dataclass(frozen=True)
class NoisyProjection(Mechanism):
    """M1 / M2 of [W] Def. 3 as a training rule on full weights ([W] Alg. 3, App. F.2; docs/theory.md §1.3).

    Per step and weight (the gradient right-multiplied, as in Eq. 36, so M = AᵀA acts on the rows of ``Vᵀ``):

    * ``m2``: ``g̃ = (V + Ξ) M / b``;  ``m1``: ``g̃ = (V M + Ξ) / b``;

    ``V = Σ_{i∈B} clip_C(g_i)`` over a Poisson batch (clip over all weights jointly), ``Ξ`` i.i.d.
    ``N(0, σ²C²)`` (σ_G = σC in [W]'s notation), ``b`` the expected batch size, ``M = AᵀA`` with A i.i.d.
    N(0, 1/r) (r × d_in). ``resample=False``: A drawn once per model from its "init" stream (the same A as
    LoRA-FA's, [W] Table 2); ``resample=True``: a fresh A every step ([W] App. F.2). The engine's SGD with
    momentum applies g̃. σ = 0 and C = inf give the noise-free projection (:class:`WishartProjection`).

    Randomness per model, from its "noise" stream, each step: Ξ for every weight, then (resampled) A for every
    weight, in the engine's tensor order.
    """

    rank: int
    noise_multiplier: float
    clip_norm: float
    variant: str = "m2"
    resample: bool = False
    parameterization: str = "full"
    per_example: bool = True
    sampling: str = "poisson"
    name: str = field(init=False, repr=False)  # the variant's

    def __post_init__(self):
        if self.variant not in PROJECTION_VARIANTS:
            raise UsageError(f"variant must be one of {', '.join(PROJECTION_VARIANTS)}, got {self.variant!r}")
        check_noise_and_clip(self.noise_multiplier, self.clip_norm)
        object.__setattr__(self, "name", self.variant)

    def setup(self, shapes, randomness) -> tuple[GaussianNoiseStream, dict[str, torch.Tensor] | None]:
        fixed = None if self.resample else draw_factors(shapes, self.rank, [m.torch("init") for m in randomness])
        return GaussianNoiseStream([model.torch("noise") for model in randomness], ahead=not self.resample), fixed

    def transform(self, step: Step, state) -> dict[str, torch.Tensor]:
        stream, fixed = state
        examples, parameters = step.example_gradients(), step.trained_tensors()
        coefficients = clip_coefficients(examples, step.weights, self.clip_norm)
        noise = stream.draw(parameters, step, noise_std(self.noise_multiplier, self.clip_norm))
        factors = (
            fixed
            if fixed is not None
            else draw_factors({name: t.shape[1:] for name, t in parameters.items()}, self.rank, stream.generators)
        )
        if self.variant == "m2":
            examples.add_weighted_sum(noise, coefficients, 1.0)  # V + Ξ, the sum accumulated into Ξ
            projected = project(noise, factors)
        else:
            total = examples.weighted_sum(coefficients)
            projected = {name: g + noise[name] for name, g in project(total, factors).items()}
        return {name: g / step.poisson_batch_size() for name, g in projected.items()}

    def privacy(self, training: Training) -> PrivacyEvent:
        """M2 with M resampled every step (or for one step): [W] Thm 5 + App. F.2; no training bound otherwise."""
        if self.noise_multiplier == 0:
            return ZERO_NOISE
        if self.variant == "m1":
            return Unknown(
                "[W] Thm 3/4 bound one release M V + Ξ with unit-norm columns and a data-dependent "
                "alignment ρ_⊥; no multi-step accountant for M1 training exists"
            )
        if not self.resample and training.steps > 1:
            return Unknown(
                "[W] Thm 5 needs M independent of ΔV; with M fixed for T > 1 steps later gradients depend "
                "on M through the trajectory, and [W] App. F.2 composes only with M resampled every step "
                "(--resample-projection)"
            )
        return NoisyProjectionM2(
            self.noise_multiplier, self.rank, training.sample_rate, training.steps, training.layers
        )

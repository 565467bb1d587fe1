"""Wishart projection of gradients ([W] Def. 1, Eq. 36; SPEC §1.1-1.3).

Full-weight training where each layer's gradient is right-multiplied by ``M = s² AᵀA``, A with i.i.d.
N(0, 1/r) entries drawn per model and per layer ([W] App. F.1, Eq. 36; conv weights flattened to
d_out × (all other dims)). With the same A this is the second realisation of noise-free LoRA-FA (SPEC §1.2 (b)):
by linearity of momentum SGD, ``W_t = W_0 + s B_t A`` evolves identically.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dpaudit.mechanisms.base import Step
from dpaudit.models import draw_lora_a


@dataclass(frozen=True)
class WishartProjection:
    """Noise-free matrix projection mechanism on full weights, M fixed for the run ([W] Prop. 2: not DP)."""

    rank: int
    scale: float = 1.0
    name: str = "projection"
    parameterization: str = "full"
    per_example: bool = False

    def setup(self, shapes, randomness) -> dict[str, torch.Tensor]:
        """Per weight: (K, r, d_in) factors, drawn from each model's "init" stream in layer order.

        Same stream and order as the LoRA-FA engine's ``lora_A`` draws, so both realisations share A.
        """
        generators = [model.torch("init") for model in randomness]
        factors: dict[str, list[torch.Tensor]] = {name: [] for name in shapes}
        for generator in generators:
            for name, shape in shapes.items():
                a = draw_lora_a((self.rank, *shape[1:]), self.rank, generator)
                factors[name].append(a.reshape(self.rank, -1))
        return {name: torch.stack(stack) for name, stack in factors.items()}

    def transform(self, step: Step, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        projected = {}
        for name, gradient in step.gradients.items():
            a = state[name].to(gradient.device)
            flat = gradient.reshape(gradient.shape[0], gradient.shape[1], -1)
            # (G Aᵀ) A costs O(d_out·d_in·r), never forming the d_in × d_in matrix M.
            projected[name] = (self.scale ** 2 * (flat @ a.transpose(1, 2)) @ a).reshape(gradient.shape)
        return projected

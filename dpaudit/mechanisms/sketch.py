"""Gaussian sketch / noisy LoRA-FA ([S] Eq. 1, Eqs. 13-14; docs/theory.md §1.4).

LoRA-FA with frozen ``A ∼ N(0, 1/r)^{r×m}`` and ``B_0 = 0`` trained by SGD ends at
``W_T = W_0 - η (Σ_t ∇_W L^t Aᵀ) A`` ([S] Eq. 13): a Gaussian sketch ``Q Aᵀ`` of the cumulative gradient
``Q = G(D) = Σ_t ∇_W L^t``. Adding ``Z ∼ N(0, σ_g²)^{n×r}`` to B's cumulative gradient releases
``W̃_T = W_0 - η (G(D) Aᵀ + Z) A`` ([S] Eq. 14), the noisy sketch of [S] Eq. 1 followed by post-processing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from accountants import validation as check
from dpaudit.mechanisms.base import Mechanism, Step
from dpaudit.mechanisms.dpsgd import gaussian_noise
from dpaudit.mechanisms.privacy import ZERO_NOISE, GaussianSketch, PrivacyEvent, Training


@dataclass(frozen=True)
class NoisyLoraFa(Mechanism):
    """Noisy LoRA-FA: train ``lora_B`` as noise-free LoRA-FA, then ``B̃_T = B_T - η Z`` ([S] Eq. 14).

    ``noise_std`` is σ_g, the per-entry std of Z (absolute: there is no clipping), drawn once per model from its
    "noise" stream, lora_B by lora_B in the engine's tensor order; η is the base learning rate. With plain SGD
    at a constant rate (momentum 0, ``schedule="constant"``) the released adapters are exactly [S] Eq. 14's;
    with momentum or a schedule the sketch is of the optimiser's weighted gradient sum instead, and Z is still
    added once, scaled by the base rate. σ_g = 0 is noise-free LoRA-FA.
    """

    noise_std: float
    name: str = "sketch"
    parameterization: str = "lora-fa"
    per_example: bool = False

    def __post_init__(self):
        check.non_negative("--noise (σ_g)", self.noise_std)

    def setup(self, shapes, randomness) -> list[torch.Generator]:
        return [model.torch("noise") for model in randomness]

    def transform(self, step: Step, generators) -> dict[str, torch.Tensor]:
        return step.mean_gradients()

    def finish(self, params: dict[str, torch.Tensor], generators: list[torch.Generator], learning_rate: float) -> None:
        """``B ← B - η Z``, Z i.i.d. N(0, σ_g²) shaped like each (K, n, r) lora_B ([S] Eq. 14)."""
        for name, noise in gaussian_noise(params, generators, self.noise_std).items():
            params[name].sub_(learning_rate * noise)

    def privacy(self, training: Training) -> PrivacyEvent:
        return GaussianSketch(self.noise_std) if self.noise_std > 0 else ZERO_NOISE

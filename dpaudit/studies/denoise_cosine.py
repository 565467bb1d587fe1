"""[D] Fig. 2's diagnostic: how much denoising turns each DP-SGD step towards the clean clipped sum.

Study code for ``experiments/denoise_cosine.py``: a mechanism wrapper that records, besides training as the wrapped
DP-SGD does, the cosine improvement of every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dpaudit.mechanisms.base import Mechanism, Step
from dpaudit.mechanisms.denoise import cosine_improvement
from dpaudit.mechanisms.dpsgd import DpSgd, GaussianNoiseStream, clip_coefficients, denoise_update
from dpaudit.mechanisms.privacy import PrivacyEvent, Training


@dataclass
class DenoiseCosineRecorder(Mechanism):
    """[D] Fig. 2's diagnostic: the per-step, per-model cosine improvement that denoising gives.

    ``mechanism`` trains as usual and every step records, per model, the whole-gradient
    cosine improvement ``cos(Denoise(g̃), ḡ) - cos(g̃, ḡ)`` (all trained tensors flattened into one vector;
    ḡ the clipped noiseless sum, read for evaluation only). ``improvements``: one (K,) tensor per step.
    """

    mechanism: DpSgd
    improvements: list[torch.Tensor] = field(default_factory=list)
    per_example: bool = field(default=True, init=False)
    sampling: str = field(default="poisson", init=False)
    name: str = field(init=False, repr=False)  # the wrapped mechanism's
    parameterization: str = field(init=False, repr=False)

    def __post_init__(self):
        self.name, self.parameterization = self.mechanism.name, self.mechanism.parameterization

    def setup(self, shapes, randomness) -> GaussianNoiseStream:
        return self.mechanism.setup(shapes, randomness)

    def transform(self, step: Step, noise: GaussianNoiseStream) -> dict[str, torch.Tensor]:
        coefficients = clip_coefficients(step.example_gradients(), step.weights, self.mechanism.clip_norm)
        clean = step.example_gradients().weighted_sum(coefficients)  # [D]'s reference ḡ, the clipped sum
        noisy = self.mechanism.privatise(step, noise, coefficients)
        denoised = denoise_update(noisy, self.mechanism.entry_noise_std(step))

        def whole(update: dict[str, torch.Tensor]) -> torch.Tensor:
            # (K, 1, P), tensors in one order for all three (the sums' dicts need not list them alike)
            return torch.cat([update[name].flatten(1) for name in step.trained_tensors()], dim=1).unsqueeze(1)

        self.improvements.append(cosine_improvement(whole(denoised), whole(noisy), whole(clean)))
        return denoised if self.mechanism.denoise else noisy

    def privacy(self, training: Training) -> PrivacyEvent:
        return self.mechanism.privacy(training)

"""Mechanisms with no noise: plain fine-tuning and noise-free LoRA-FA ([W] Sec. 2, App. E, App. F.1)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dpaudit.mechanisms.base import Mechanism, Step
from dpaudit.mechanisms.privacy import NOT_DP, NotDp, Training


@dataclass(frozen=True)
class NonPrivate(Mechanism):
    """SGD on the chosen parameters with the batch-mean gradient unchanged.

    ``parameterization="lora-fa"`` is noise-free LoRA-FA: ``lora_A`` frozen with i.i.d. N(0, 1/r) entries drawn
    per model, ``lora_B`` trained from 0, so every step moves W by ``-η s² G AᵀA`` — the gradient right-multiplied
    by a rank-r Wishart matrix, the matrix-valued projection mechanism that is not DP at any ε ([W] Prop. 2).
    """

    name: str = "none"
    parameterization: str = "full"
    per_example: bool = False

    def transform(self, step: Step, state) -> dict[str, torch.Tensor]:
        return step.mean_gradients()

    def privacy(self, training: Training) -> NotDp:
        return NotDp(f"noise-free {self.name}: {NOT_DP}")


def lora_fa() -> NonPrivate:
    """Noise-free LoRA-FA, realised as a peft model with frozen ``lora_A`` (docs/theory.md §1.2 (a))."""
    return NonPrivate(name="lora-fa", parameterization="lora-fa")

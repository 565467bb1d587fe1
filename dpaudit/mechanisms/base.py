"""The :class:`Mechanism` protocol between the batched engine and every mechanism of SPEC §1."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch

from dpaudit.seeding import ModelRandomness


@dataclass(frozen=True)
class Step:
    """What the engine hands a mechanism at one optimisation step, for K models at once.

    ``gradients`` maps each trained tensor's name to a (K, ...) batch-mean gradient, or, for a mechanism with
    ``per_example = True``, to (K, b, ...) per-example gradients whose example weights are ``weights`` (K, b)
    (0 marks padding: models' batches are padded to a common size b).
    """

    gradients: dict[str, torch.Tensor]
    weights: torch.Tensor
    index: int


class Mechanism(Protocol):
    """A gradient transform / update rule for K shadow models trained together (ARCHITECTURE.md)."""

    name: str
    parameterization: str  # "full" | "lora" | "lora-fa" (dpaudit.models.PARAMETERIZATIONS)
    per_example: bool  # whether ``transform`` needs per-example gradients (clipping)

    def setup(self, shapes: dict[str, torch.Size], randomness: Sequence[ModelRandomness]) -> Any:
        """Draw the mechanism's per-model state (projections, noise generators) for models with these streams."""

    def transform(self, step: Step, state: Any) -> dict[str, torch.Tensor]:
        """The (K, ...) update direction the optimiser applies for this step."""

"""Per-model randomness derived from (campaign seed, model index, purpose) only.

A shadow model's draws never depend on which chunk, worker or device trains it, so results do not change with
chunking, worker count or order (docs/architecture.md §4, "Seams worth keeping"). No code path uses global RNG state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Stable ids: changing one changes every campaign's numbers.
# "gradient-canary": when a shadow model's batches hold its gradient canaries (dpaudit.training.canaries); "membership":
# the one-run design's draw of which canaries each model is IN for; "trainer": the seed a user's training function
# gets in a trial of a training-code audit; "neighbour": the rows replace-one canaries replace.
_PURPOSES = {
    "init": 0,
    "data": 1,
    "noise": 2,
    "canary": 3,
    "gradient-canary": 4,
    "membership": 5,
    "exposure": 6,
    "trainer": 7,
    "neighbour": 8,
}
_ROLES = {"shadow": 0, "reference": 1, "campaign": 2}


@dataclass(frozen=True)
class ModelRandomness:
    """The random streams of model ``index`` (role ``shadow``, or the attacker's ``reference`` model)."""

    seed: int
    index: int
    role: str = "shadow"

    def _state(self, purpose: str) -> np.ndarray:
        sequence = np.random.SeedSequence([self.seed, _ROLES[self.role], self.index, _PURPOSES[purpose]])
        return sequence.generate_state(2, dtype=np.uint64)

    def numpy(self, purpose: str) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(self._state(purpose)))

    def torch(self, purpose: str) -> torch.Generator:
        """A CPU generator: draws are moved to the device, so CPU and CUDA runs see the same numbers."""
        return torch.Generator().manual_seed(int(self._state(purpose)[0] >> np.uint64(1)))


def shadow_randomness(seed: int, indices) -> list[ModelRandomness]:
    return [ModelRandomness(seed, int(i)) for i in indices]


def campaign_rng(seed: int, purpose: str) -> np.random.Generator:
    """Campaign-level draws (the canary input), not tied to any model."""
    sequence = np.random.SeedSequence([seed, _ROLES["campaign"], 0, _PURPOSES[purpose]])
    return np.random.Generator(np.random.PCG64(sequence))


def trial_seed(seed: int, trial: int) -> int:
    """The seed a user's training function gets in trial ``trial`` of an audit with seed ``seed`` (< 2^31)."""
    sequence = np.random.SeedSequence([seed, _ROLES["shadow"], trial, _PURPOSES["trainer"]])
    return int(sequence.generate_state(1)[0] >> 1)

"""The planted bugs of :data:`dpaudit.mechanisms.catalogue.MUTANTS`, trained: DP-SGD with one implementation bug.

:func:`mutate` wraps a correct :class:`dpaudit.mechanisms.dpsgd.DpSgd` in :class:`MutatedDpSgd`, which trains with
the bug while its privacy event stays the one the correct mechanism claims (the analysis never looks at the
mutant): a sound audit of a mutated run should find the claim violated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dpaudit.mechanisms.base import Mechanism
from dpaudit.mechanisms.catalogue import Mutant

if TYPE_CHECKING:
    import torch

    from dpaudit.mechanisms.base import Step
    from dpaudit.mechanisms.dpsgd import DpSgd, GaussianNoiseStream
    from dpaudit.mechanisms.privacy import PrivacyEvent, Training
    from dpaudit.seeding import ModelRandomness


class MutatedNoise:
    """The noise of a mutated DP-SGD: the correct :class:`GaussianNoiseStream`'s draws, scaled, dropped or reused.

    The stream is always asked for the same std (it draws the next step ahead for that request); the mutant
    changes what it returns.
    """

    def __init__(self, stream: GaussianNoiseStream, mutant: Mutant):
        self.stream, self.mutant = stream, mutant
        self._first: dict[str, torch.Tensor] | None = None

    def draw(self, like: dict[str, torch.Tensor] | None, step: Step, std: float) -> dict[str, torch.Tensor]:
        """This step's noise as the mutant makes it; a fresh tensor each step (the mechanism adds into it)."""
        if self.mutant.reuse_noise and self._first is not None:
            return {name: tensor.clone() for name, tensor in self._first.items()}
        drawn = self.stream.draw(like, step, std * self.mutant.noise_scale)
        if self.mutant.reuse_noise:
            self._first = {name: tensor.clone() for name, tensor in drawn.items()}
        every = self.mutant.noiseless_every
        if every is not None and step.index % every == 0:
            for tensor in drawn.values():
                tensor.zero_()
        return drawn


@dataclass(frozen=True)
class MutatedDpSgd(Mechanism):
    """``mechanism`` trained with the bug ``mutant``; ``batch_size`` b divides the clipped sum of shuffled batches.

    Everything else (parameterization, the noise's claimed std σC/b, the update) is the correct mechanism's own
    code: the noise bugs wrap its noise stream (:class:`MutatedNoise`), ``no-clipping`` hands its
    :meth:`~dpaudit.mechanisms.dpsgd.DpSgd.privatise` the example weights as clipping coefficients, and
    ``shuffle-as-poisson`` asks the engine for shuffled batches and gives each step the Poisson divisor b.
    Its :meth:`privacy` is the correct mechanism's: the claim a sound audit should find violated.
    """

    mechanism: DpSgd
    mutant: Mutant
    batch_size: int
    # The correct mechanism's (sampling: the mutant's), so out of the repr: it shows mechanism, mutant, batch_size.
    name: str = field(init=False, repr=False)
    parameterization: str = field(init=False, repr=False)
    per_example: bool = field(init=False, repr=False)
    sampling: str = field(init=False, repr=False)

    def __post_init__(self):
        sampling = "shuffle" if self.mutant.shuffle else self.mechanism.sampling
        for attribute, value in (
            ("name", self.mechanism.name),
            ("parameterization", self.mechanism.parameterization),
            ("per_example", self.mechanism.per_example),
            ("sampling", sampling),
        ):
            object.__setattr__(self, attribute, value)

    def setup(self, shapes: dict[str, torch.Size], randomness: Sequence[ModelRandomness]) -> MutatedNoise:
        return MutatedNoise(self.mechanism.setup(shapes, randomness), self.mutant)

    def transform(self, step: Step, noise: MutatedNoise) -> dict[str, torch.Tensor]:
        if self.mutant.shuffle:
            step = dataclasses.replace(step, expected_batch_size=float(self.batch_size))
        if not self.mutant.clip:
            return self.mechanism.privatise(step, noise, step.weights)  # type: ignore[arg-type]  # duck-typed
        return self.mechanism.transform(step, noise)  # type: ignore[arg-type]

    def privacy(self, training: Training) -> PrivacyEvent:
        """The correct mechanism's event, which the campaign claims (:mod:`dpaudit.bounds` never sees the bug)."""
        return self.mechanism.privacy(training)

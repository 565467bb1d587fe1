"""Planted DP bugs ("mutants") of the DP-SGD family, for tests and benchmarks to show that the audit catches them.

A mutant is a frozen description of one implementation bug (:class:`Mutant`); :func:`mutate` wraps a correct
:class:`dpaudit.mechanisms.dpsgd.DpSgd` in :class:`MutatedDpSgd`, which trains with the bug while the campaign's
analytic ε stays the one the correct mechanism claims (:mod:`dpaudit.bounds` never looks at the mutant): a sound
audit of a mutated run should find the claim violated. ``CampaignConfig.mutant`` names the mutant; it is part of
the config, so campaign.json records it and its hash covers it (a mutated run can neither be resumed as a correct
one nor relabelled as one), and every report of a mutated run says so in its first line (:func:`planted_bug`).
Neither the command line nor a TOML file can set it (:func:`dpaudit.config.load_toml` refuses the key).

=====================  ============================================================================================
mutant                 what the bug does
=====================  ============================================================================================
half-noise             the noise is drawn with std σC/2 instead of σC
skip-noise-every-10    no noise on steps t = 0, 10, 20, … (1 step in 10; the first step always)
no-clipping            per-example gradients are not clipped (the noise std stays σC)
reused-noise           each model draws its noise once, at the first step, and adds that same draw at every step
shuffle-as-poisson     shuffled batches (every member once per epoch) while the accountant assumes Poisson
                       sampling at q = b/N; the clipped sum is still divided by b
=====================  ============================================================================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dpaudit.mechanisms import registry
from dpaudit.mechanisms.base import Mechanism

if TYPE_CHECKING:
    import torch

    from dpaudit.config import CampaignConfig
    from dpaudit.mechanisms.base import Step
    from dpaudit.mechanisms.dpsgd import DpSgd, GaussianNoiseStream
    from dpaudit.mechanisms.privacy import PrivacyEvent, Training
    from dpaudit.seeding import ModelRandomness

# The mechanisms a mutant can be planted in: DP-SGD on any parameterization, without denoising (whose shrinkage
# would hide what the bug does to the released update).
MUTATED_MECHANISMS = registry.applying("mutant")


@dataclass(frozen=True)
class Mutant:
    """One planted bug of DP-SGD (module table): how the mutated mechanism departs from the correct one.

    ``noise_scale`` multiplies the noise std; ``noiseless_every`` k drops the noise on steps t with t % k == 0;
    ``reuse_noise`` adds the first step's draw at every step; ``clip=False`` skips clipping; ``shuffle`` trains on
    shuffled batches in place of Poisson samples.
    """

    name: str
    bug: str  # what the implementation does wrong, in words, for reports
    noise_scale: float = 1.0
    noiseless_every: int | None = None
    reuse_noise: bool = False
    clip: bool = True
    shuffle: bool = False


MUTANTS = {
    mutant.name: mutant
    for mutant in (
        Mutant("half-noise", "the noise is drawn with std σC/2 instead of σC", noise_scale=0.5),
        Mutant("skip-noise-every-10", "no noise on every 10th step (t = 0, 10, 20, …)", noiseless_every=10),
        Mutant("no-clipping", "per-example gradients are not clipped", clip=False),
        Mutant("reused-noise", "one noise draw per model is added at every step", reuse_noise=True),
        Mutant(
            "shuffle-as-poisson",
            "shuffled batches (every member once per epoch) are accounted as Poisson sampling at q = b/N",
            shuffle=True,
        ),
    )
}


def planted_bug(config: CampaignConfig) -> str | None:
    """The first line of every report of a run with a planted bug; None for a correct run."""
    if config.mutant is None:
        return None
    return (
        f"PLANTED BUG, on purpose: mutant {config.mutant!r} ({MUTANTS[config.mutant].bug}); this run tests the"
        f" audit, not {config.mechanism}, and its analytic ε is the correct mechanism's claim"
    )


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


def mutate(mechanism: DpSgd, config: CampaignConfig) -> MutatedDpSgd:
    """``mechanism`` with ``config.mutant`` planted (``config`` checked that it applies)."""
    assert config.mutant is not None, "mutate needs a config with a mutant"
    return MutatedDpSgd(mechanism, MUTANTS[config.mutant], config.batch_size)

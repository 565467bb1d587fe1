"""How shadow models see their data: batch layouts, shuffled and Poisson-sampled batches, SGD settings.

Torch-free (numpy only), so that :mod:`dpaudit.config` (which reads :data:`SCHEDULES`) and the campaign's privacy
facts (q = b/N and T from :class:`PoissonLayout`) need no torch. Every draw comes from each model's own "data"
stream (:mod:`dpaudit.seeding`), so a model's batches do not depend on the other models it is trained with.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dpaudit.errors import UsageError

if TYPE_CHECKING:
    from dpaudit.seeding import ModelRandomness

SCHEDULES = ("cosine", "constant")  # the learning-rate schedule of the engine's optimiser (TrainingConfig)
# The engine's optimiser: SGD with momentum, or AdamW (Loshchilov & Hutter 2019; β1 = momentum, β2 = 0.999).
OPTIMIZERS = ("sgd", "adamw")
ADAMW_WEIGHT_DECAY = 0.01  # torch's (and Hugging Face's Trainer's) default for AdamW


@dataclass(frozen=True)
class TrainingConfig:
    """SGD with momentum or AdamW (β1 = ``momentum``); ``cosine`` anneals to ``min_lr`` over all steps ([W] App. F.1).

    ``weight_decay`` is AdamW's decoupled weight decay (SGD: 0). A DP mechanism privatises each step's gradient
    before the optimiser sees it, so the optimiser is post-processing and changes no claimed ε (docs/theory.md §2.10).
    """

    epochs: int = 30
    batch_size: int = 32
    lr: float = 0.1
    momentum: float = 0.9
    schedule: str = "cosine"
    min_lr: float = 1e-4
    optimizer: str = "sgd"
    weight_decay: float = 0.0

    def __post_init__(self):
        if self.epochs < 1:
            raise UsageError(f"--epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise UsageError(f"--batch-size must be >= 1, got {self.batch_size}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise UsageError(f"--lr must be a positive number, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise UsageError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.schedule not in SCHEDULES:
            raise UsageError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.optimizer not in OPTIMIZERS:
            raise UsageError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if not 0 <= self.weight_decay < 1 or (self.optimizer == "sgd" and self.weight_decay != 0):
            raise UsageError(f"weight decay must be in [0, 1), and 0 for SGD, got {self.weight_decay}")


@dataclass(frozen=True)
class BatchLayout:
    """Steps per epoch and padded batch width, fixed by the largest member count of the whole campaign.

    Every model's epoch is ``steps`` batches of its own members, spread evenly (sizes differ by at most one) and
    padded with weight-0 slots to ``width``. Deriving both from the campaign (not from the models trained
    together) keeps each model's arithmetic independent of chunking. ``members`` (that largest count) also
    fixes the Poisson sampling rate of DP mechanisms (:class:`PoissonLayout`).
    """

    steps: int
    width: int
    members: int | None = None

    @classmethod
    def for_members(cls, max_members: int, batch_size: int) -> BatchLayout:
        steps = math.ceil(max_members / batch_size)
        return cls(steps, math.ceil(max_members / steps), max_members)


# Per model and step, the chance that a Poisson batch does not fit the first block (the chunk then adds blocks).
_FIRST_BLOCK_OVERFLOW = 1e-3


@dataclass(frozen=True)
class PoissonLayout:
    """Poisson sampling of DP mechanisms (docs/theory.md §1.5), fixed by the campaign, never by the models in a chunk.

    ``N`` = the campaign's largest member count (:attr:`BatchLayout.members`) and ``b`` = the expected batch
    size: rate ``q = b / N``, ``steps = ⌈N / b⌉`` per epoch (as many as shuffled batches, so that an epoch visits
    each member once in expectation), and the clipped sum is divided by ``b = q N``.

    A step is computed in blocks of fixed widths, so that every GEMM a model takes part in has the same shape
    whatever its chunk (a GEMM's rounding can depend on its row count: torch's bmm, e.g., switches kernels with
    size): a first block of ``width`` slots (the Binomial(N, q) quantile exceeded with probability 1e-3 per model
    and step), then, while the chunk's largest batch does not fit, blocks of ``overflow_width`` (about one
    standard deviation). Padding slots have weight 0, so a block of padding only adds exact zeros. This keeps
    chunk independence at ~1.6x the mean batch of arithmetic, where one worst-case width (1e-9) cost ~2.2x. Where
    one model's step is large enough to compute alone (10 MFLOP an example or more, on CPU), the engine computes
    only each model's sampled examples and the blocks are its steps' layout, not its arithmetic
    (:func:`dpaudit.training.engine.train`'s ``exact_batches``).
    """

    sample_rate: float
    steps: int
    expected_batch_size: int
    width: int
    overflow_width: int

    @classmethod
    def for_members(cls, max_members: int, expected_batch_size: int) -> PoissonLayout:
        from scipy.stats import binom

        if expected_batch_size > max_members:
            raise UsageError(
                f"--batch-size {expected_batch_size} exceeds the {max_members} training examples of a shadow model:"
                f" a mechanism that samples Poisson batches (the DP ones) needs the rate q = batch size / examples"
                f" <= 1; use --batch-size <= {max_members}"
            )
        rate = expected_batch_size / max_members
        width = max(1, int(binom.isf(_FIRST_BLOCK_OVERFLOW, max_members, rate)))  # P(batch > width) <= 1e-3
        overflow_width = max(1, math.ceil(math.sqrt(max_members * rate * (1 - rate))))
        return cls(rate, math.ceil(max_members / expected_batch_size), expected_batch_size, width, overflow_width)

    def blocks(self, largest_batch: int) -> list[slice]:
        """The slots of each block of a step whose largest batch has ``largest_batch`` examples."""
        extra = math.ceil(max(0, largest_batch - self.width) / self.overflow_width)
        return [slice(0, self.width)] + [
            slice(self.width + j * self.overflow_width, self.width + (j + 1) * self.overflow_width)
            for j in range(extra)
        ]

    @classmethod
    def for_batch_layout(cls, layout: BatchLayout, expected_batch_size: int) -> PoissonLayout:
        if layout.members is None:
            raise ValueError(
                "Poisson sampling needs the campaign's member count: build the layout with BatchLayout.for_members"
            )
        return cls.for_members(layout.members, expected_batch_size)


def shuffled_batches(
    membership: np.ndarray, randomness: Sequence[ModelRandomness], layout: BatchLayout, epochs: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per step: pool indices (K, width) and example weights (K, width), each model in its own shuffled order.

    Model k visits each of its members (``membership[k]``) once per epoch, in an order from its "data" stream.
    """
    members = [np.flatnonzero(row) for row in membership]
    if any(len(m) == 0 for m in members):
        raise UsageError("a shadow model has no training examples: check the membership plan")
    if max(map(len, members)) > layout.steps * layout.width:
        raise ValueError("batch layout too small for the membership plan")
    rngs = [model.numpy("data") for model in randomness]
    for _ in range(epochs):
        index = np.zeros((len(members), layout.steps, layout.width), dtype=np.int64)
        weight = np.zeros((len(members), layout.steps, layout.width), dtype=np.float32)
        for k, (rows, rng) in enumerate(zip(members, rngs)):
            for s, batch in enumerate(np.array_split(rng.permutation(rows), layout.steps)):
                index[k, s, : len(batch)] = batch
                weight[k, s, : len(batch)] = 1.0
        for s in range(layout.steps):
            yield index[:, s], weight[:, s]


def poisson_batches(
    membership: np.ndarray, randomness: Sequence[ModelRandomness], layout: PoissonLayout, epochs: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per step: pool indices (K, w) and example weights (K, w) of Poisson-sampled batches (docs/theory.md §1.5).

    Each member of model k is included independently with probability ``layout.sample_rate``, drawn from k's
    "data" stream (one uniform per member and step), so a model's batches do not depend on its chunk. Each step
    is padded with weight-0 slots to the end of the last block it needs (:meth:`PoissonLayout.blocks`).
    """
    members = [np.flatnonzero(row) for row in membership]
    if any(len(m) == 0 for m in members):
        raise UsageError("a shadow model has no training examples: check the membership plan")
    rngs = [model.numpy("data") for model in randomness]
    for _ in range(epochs * layout.steps):
        batches = [rows[rng.random(len(rows)) < layout.sample_rate] for rows, rng in zip(members, rngs)]
        sizes = np.array([len(batch) for batch in batches])
        sampled = np.arange(layout.blocks(sizes.max())[-1].stop) < sizes[:, None]
        index = np.zeros(sampled.shape, dtype=np.int64)
        index[sampled] = np.concatenate(batches)
        yield index, sampled.astype(np.float32)

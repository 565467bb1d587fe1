"""DP-SGD in plain torch, as a training FUNCTION for dpaudit, with planted bugs for the audit to find.

    trainer = DpSgdTrainer(noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=64, epochs=2, lr=0.1)
    trained = trainer(model, x, y, seed=0)     # trains a deep copy; model itself is left alone
    trained = trainer(model, x, y, seed=0, on_step=record)  # record(model) after every step
    sigma, q, steps = trainer.claim(len(x))    # (σ, b / n, epochs * ceil(n / b))

Each step: Poisson-sample a batch (every example independently with probability q = b / n), compute per-example
gradients (``vmap(grad(...))`` over ``functional_call``), clip each to L2 norm C over all parameters, sum, add
N(0, σ²C²) noise, divide by the expected batch size b (not the realised one: that would leak the batch size),
and take an SGD step.

``bug`` plants one mistake while the claim stays the same:

- "half-noise": the noise multiplier is halved;
- "no-clipping": per-example gradients are not clipped;
- "reused-noise": one noise draw is added at every step;
- "shuffle-as-poisson": fixed shuffled batches of size b, each example exactly once per epoch;
- "realised-batch-size": the noisy sum is divided by the realised batch size instead of b.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F

BUGS = ("half-noise", "no-clipping", "reused-noise", "shuffle-as-poisson", "realised-batch-size")


def seeded_generators(seed: int) -> tuple[torch.Generator, torch.Generator]:
    """Two independent generators (batch sampling, noise) from one seed; the examples' trainers all draw so."""
    # SeedSequence rather than seed and seed + 1, so that trial s's noise is not trial s + 1's sampling.
    states = np.random.SeedSequence(seed).generate_state(2, dtype=np.uint64)
    return tuple(torch.Generator().manual_seed(int(s)) for s in states)  # type: ignore[return-value]


def _example_loss(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # One example at a time (vmap maps it over the batch), so that its gradient is that example's alone.
    logits = functional_call(model, params, (x.unsqueeze(0),))
    return F.cross_entropy(logits, y.unsqueeze(0))


@dataclass(frozen=True)
class DpSgdTrainer:
    """Hand-written DP-SGD (SGD, cross-entropy, flat clipping, Poisson sampling); frozen and picklable."""

    noise_multiplier: float
    clip_norm: float
    expected_batch_size: int
    epochs: int
    lr: float
    bug: str | None = None

    def __post_init__(self) -> None:
        if self.bug is not None and self.bug not in BUGS:
            raise ValueError(f"bug must be None or one of {', '.join(BUGS)}; got {self.bug!r}")

    def claim(self, n: int) -> tuple[float, float, int]:
        """The (σ, q, T) this trainer claims on ``n`` examples: (σ, b / n, epochs * ceil(n / b)), bug or not."""
        if not 1 <= self.expected_batch_size <= n:
            raise ValueError(f"expected batch size must be in [1, n = {n}]; got {self.expected_batch_size}")
        return (
            self.noise_multiplier,
            self.expected_batch_size / n,
            self.epochs * math.ceil(n / self.expected_batch_size),
        )

    def batches(self, n: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
        """The index batches of the whole run, one per step (``claim(n)[2]`` of them)."""
        _, q, steps = self.claim(n)
        if self.bug == "shuffle-as-poisson":
            for _ in range(self.epochs):
                yield from torch.randperm(n, generator=generator).split(self.expected_batch_size)
        else:
            for _ in range(steps):
                yield torch.nonzero(torch.rand(n, generator=generator) < q).flatten()

    def __call__(
        self,
        model: nn.Module,
        x: np.ndarray,
        y: np.ndarray,
        seed: int,
        on_step: Callable[[nn.Module], None] | None = None,
    ) -> nn.Module:
        """Train a copy of ``model`` on ``(x, y)``; all randomness comes from ``seed``.

        ``on_step(model)`` is called after every step: the intermediate models DP-SGD's accounting releases.
        """
        sampling, noise_generator = seeded_generators(seed)
        model = copy.deepcopy(model)
        inputs = torch.as_tensor(x, dtype=torch.float32)
        labels = torch.as_tensor(y, dtype=torch.int64)
        params = dict(model.named_parameters())
        optimizer = torch.optim.SGD(params.values(), lr=self.lr)
        per_example_grads = vmap(grad(partial(_example_loss, model)), in_dims=(None, 0, 0))
        sigma = self.noise_multiplier / 2 if self.bug == "half-noise" else self.noise_multiplier
        std = sigma * self.clip_norm  # noise on the sum of clipped gradients, whose sensitivity is C
        noise: dict[str, torch.Tensor] | None = None
        for batch in self.batches(len(inputs), sampling):
            grads = per_example_grads({k: p.detach() for k, p in params.items()}, inputs[batch], labels[batch])
            norms = torch.sqrt(sum(g.flatten(1).square().sum(1) for g in grads.values()))  # one norm per example
            clip = self.clip_norm / norms.clamp(min=self.clip_norm)  # min(1, C / norm)
            if self.bug == "no-clipping":
                clip = torch.ones_like(norms)
            if noise is None or self.bug != "reused-noise":  # the bug draws once and adds that at every step
                noise = {k: torch.normal(0.0, std, p.shape, generator=noise_generator) for k, p in params.items()}
            # An empty Poisson batch still takes a (pure-noise) step; the realised-size bug divides by at least 1.
            divisor = max(len(batch), 1) if self.bug == "realised-batch-size" else self.expected_batch_size
            for k, p in params.items():
                p.grad = (torch.einsum("i,i...->...", clip, grads[k]) + noise[k]) / divisor
            optimizer.step()
            if on_step is not None:
                on_step(model)
        return model

"""DP-SGD with opacus, as a training FUNCTION for dpaudit: ``trainer(model, x, y, seed) -> trained copy of model``.

    trainer = make_trainer(noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=64, epochs=2, lr=0.1)
    trained = trainer(model, x, y, seed=0)     # trains a deep copy; model itself is left alone
    sigma, q, steps = trainer.claim(len(x))    # the subsampled Gaussian opacus accounts for

What opacus claims for n examples, expected batch size b and E epochs is not q = b/n, T = E * ceil(n / b):

- its Poisson loader samples at rate 1 / k, with k = ceil(n / b) = len(DataLoader(data, batch_size=b)), and makes
  int(1 / (1 / k)) steps per epoch: k, except where 1 / (1 / k) rounds to just below k in floating point
  (k = 93, 99, 105, ...), which makes k - 1;
- ``make_private`` then takes q = 1 / len(Poisson loader) = 1 / steps per epoch for the accountant (so 1 / (k - 1),
  above the rate actually sampled, in those cases), and the accountant counts every optimizer step: T = E * steps;
- the noisy sum of clipped gradients is divided by int(n * q), whatever the realised batch size; that is below b
  when b does not divide n (n = 5, b = 2: 1) and can even be 0 (n = 49, b = 1), which this trainer refuses.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from opacus import PrivacyEngine
from opacus.accountants import IAccountant, create_accountant
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from examples.dpsgd_handwritten import seeded_generators


@dataclass(frozen=True)
class OpacusSchedule:
    """The numbers opacus derives from (n, b) for one epoch."""

    sampled_rate: float  # each example's probability of being in a batch (the Poisson loader's sample_rate)
    accounted_rate: float  # the q the accountant records
    steps_per_epoch: int
    expected_batch_size: int  # what the noisy gradient sum is divided by


def opacus_schedule(n: int, expected_batch_size: int) -> OpacusSchedule:
    """Opacus's own arithmetic (``make_private``, ``DPDataLoader``, its Poisson sampler), float for float."""
    sampled = 1 / math.ceil(n / expected_batch_size)  # 1 / len(DataLoader(data, batch_size=b)), drop_last=False
    steps = int(1 / sampled)  # the sampler's length
    accounted = 1 / steps  # make_private: 1 / len(Poisson loader)
    return OpacusSchedule(sampled, accounted, steps, int(n * accounted))


@dataclass(frozen=True)
class OpacusTrainer:
    """DP-SGD (SGD, cross-entropy, flat clipping, Poisson sampling) through ``opacus.PrivacyEngine.make_private``.

    Frozen and picklable, so worker processes can run it.
    """

    noise_multiplier: float
    max_grad_norm: float
    expected_batch_size: int
    epochs: int
    lr: float

    def claim(self, n: int) -> tuple[float, float, int]:
        """The (σ, q, T) opacus's accountant records when training on ``n`` examples."""
        schedule = opacus_schedule(n, self.expected_batch_size)
        return self.noise_multiplier, schedule.accounted_rate, self.epochs * schedule.steps_per_epoch

    def opacus_epsilon(self, n: int, delta: float, accountant: str = "prv") -> float:
        """Opacus's own ε at ``delta`` for the history it records on ``n`` examples ("prv" or "rdp" accountant)."""
        tracker = create_accountant(mechanism=accountant)
        tracker.history = [self.claim(n)]  # opacus's history entries are (noise_multiplier, sample_rate, steps)
        return float(tracker.get_epsilon(delta))

    def __call__(
        self,
        model: nn.Module,
        x: np.ndarray,
        y: np.ndarray,
        seed: int,
        on_step: Callable[[nn.Module], None] | None = None,
    ) -> nn.Module:
        """Train a copy of ``model`` on ``(x, y)``; all randomness comes from ``seed``.

        ``on_step(model)`` is called after every step, if given.
        """
        return self.train(model, x, y, seed, on_step)[0]

    def train(
        self,
        model: nn.Module,
        x: np.ndarray,
        y: np.ndarray,
        seed: int,
        on_step: Callable[[nn.Module], None] | None = None,
    ) -> tuple[nn.Module, IAccountant]:
        """As ``__call__``, and also return opacus's accountant (its history is what opacus claims)."""
        if opacus_schedule(len(x), self.expected_batch_size).expected_batch_size < 1:
            # int(n * q) rounds to 0 for some (n, b), e.g. n = 49, b = 1; opacus would then divide by zero.
            raise ValueError(f"opacus normalises by int(n * q) = 0 for n = {len(x)}, b = {self.expected_batch_size}")
        sampling, noise = seeded_generators(seed)
        net = copy.deepcopy(model).train()  # opacus makes private only a module in training mode
        data = TensorDataset(torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.int64))
        # Opacus replaces this loader by a Poisson one that keeps its generator (secure_mode off).
        loader = DataLoader(data, batch_size=self.expected_batch_size, generator=sampling)
        engine = PrivacyEngine(secure_mode=False)
        module, optimizer, loader = engine.make_private(
            module=net,
            optimizer=torch.optim.SGD(net.parameters(), lr=self.lr),
            data_loader=loader,
            noise_multiplier=self.noise_multiplier,
            max_grad_norm=self.max_grad_norm,
            poisson_sampling=True,
            noise_generator=noise,
        )
        loss = nn.CrossEntropyLoss()
        module.train()
        for _ in range(self.epochs):
            for xb, yb in loader:  # Poisson batches, possibly empty: the step still adds noise, as accounted
                optimizer.zero_grad()
                loss(module(xb), yb).backward()
                optimizer.step()
                if on_step is not None:
                    on_step(module)  # the GradSampleModule: dpaudit reads the model it wraps
        # A fresh copy of the caller's architecture, without opacus's hooks and per-sample gradient attributes.
        trained = copy.deepcopy(model)
        trained.load_state_dict(module._module.state_dict())
        return trained, engine.accountant


def make_trainer(
    noise_multiplier: float, max_grad_norm: float, expected_batch_size: int, epochs: int, lr: float
) -> OpacusTrainer:
    """A training FUNCTION ``(model, x, y, seed) -> nn.Module`` running opacus's DP-SGD."""
    return OpacusTrainer(noise_multiplier, max_grad_norm, expected_batch_size, epochs, lr)

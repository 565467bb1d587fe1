"""Training functions of the training-code audit's tests: correct ones, and one per way a trainer can break."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn


def mlp(input_shape, num_classes):
    """The starting model: a fixed small MLP (weights from a fixed seed, so every call returns the same model)."""
    generator = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(int(np.prod(input_shape)), 16), nn.ReLU(), nn.Linear(16, num_classes))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return model


def full_batch_sgd(model, x, y, seed):
    """Noise-free full-batch gradient descent: every example, the canary too, moves the weights."""
    model = copy.deepcopy(model)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.5)
    inputs, labels = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(20):
        optimiser.zero_grad()
        nn.functional.cross_entropy(model(inputs), labels).backward()
        optimiser.step()
    return model


def one_noisy_step(model, x, y, seed):
    """One SGD step plus seeded noise: cheap, deterministic in its seed."""
    model = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    inputs, labels = torch.from_numpy(x), torch.from_numpy(y)
    nn.functional.cross_entropy(model(inputs), labels).backward()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.sub_(0.1 * parameter.grad + 0.01 * torch.randn(parameter.shape, generator=generator))
            parameter.grad = None
    return model


def raises(model, x, y, seed):
    raise RuntimeError("out of memory (on purpose)")


def returns_none(model, x, y, seed):
    return None


def changes_architecture(model, x, y, seed):
    return nn.Sequential(nn.Linear(x.shape[1], 3))


def returns_nan(model, x, y, seed):
    model = copy.deepcopy(model)
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    return model


def not_deterministic(model, x, y, seed):
    model = copy.deepcopy(model)
    with torch.no_grad():
        next(model.parameters()).add_(torch.randn(()))  # the global generator: not from the seed
    return model


def slow_noisy_step(model, x, y, seed):
    """``one_noisy_step`` that takes a while, so that a test can kill the audit between trials."""
    import time

    time.sleep(0.05)
    return one_noisy_step(model, x, y, seed)


def fails_with_the_canary(model, x, y, seed):
    """Raises on the larger (IN, add-remove) dataset only: a trial in the middle of the audit fails."""
    if len(x) > 40:
        raise ValueError("batch of 41 does not fit")
    return one_noisy_step(model, x, y, seed)


def reports_another_model(model, x, y, seed, on_step=None):
    """Calls ``on_step`` with a model that is not the one it trains."""
    if on_step is not None:
        on_step(nn.Linear(3, 2))
    return copy.deepcopy(model)


def never_reports_a_step(model, x, y, seed, on_step=None):
    """Takes ``on_step`` and never calls it."""
    return one_noisy_step(model, x, y, seed)


def bigram(input_shape, num_classes):
    """A next-token starting model: a bigram table, logits (n, L, V) = table[x] for token windows x (n, L)."""
    generator = torch.Generator().manual_seed(0)
    model = nn.Embedding(num_classes, num_classes)
    with torch.no_grad():
        model.weight.copy_(torch.randn(model.weight.shape, generator=generator))
    return model


def next_token_step(model, x, y, seed):
    """One gradient step on the windows' mean token cross-entropy plus seeded noise: a cheap next-token trainer."""
    model = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    logits = model(torch.from_numpy(x))
    nn.functional.cross_entropy(logits.flatten(0, 1), torch.from_numpy(y).flatten()).backward()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.sub_(parameter.grad + 0.01 * torch.randn(parameter.shape, generator=generator))
            parameter.grad = None
    return model

"""A tiny model factory with dpaudit's contract ``FACTORY(input_shape, num_classes) -> torch.nn.Module``."""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn


def mlp(input_shape: Sequence[int], num_classes: int, hidden: int = 32) -> nn.Module:
    """A one-hidden-layer perceptron over the flattened input.

    No batch norm or dropout: per-example gradients (DP-SGD) need every example to be processed independently.
    The initial weights come from torch's global generator, which the caller seeds before building the base model.

    Args:
        input_shape: Shape of one example, e.g. ``(20,)`` or ``(1, 28, 28)``.
        num_classes: Number of output logits.
        hidden: Width of the hidden layer.

    Returns:
        ``Flatten -> Linear -> ReLU -> Linear``.
    """
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(input_shape), hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )

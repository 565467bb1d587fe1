"""Static-poison canary of [W] App. F.1 (after Nasr et al. 2021).

The adversary draws the canary input x_q ∼ N(0, I) with the shape of a real input (3 × 32 × 32
for CIFAR-10), trains one reference model f = A(D) with the mechanism under audit, and labels
the canary with the class f finds least likely, y_q = argmin_y f(x_q)_y. IN models then train on
D ∪ {(x_q, y_q)}, OUT models on D. An out-of-distribution input with its least likely label is
an example the model can only fit by memorising it, which makes its loss a sharp membership
signal. Training the reference model is the engine's job; this module only draws and labels.
"""

from __future__ import annotations

import numbers

import numpy as np

from accountants import validation as check
from accountants.validation import InvalidArgument


def draw_canary_input(shape, rng: np.random.Generator) -> np.ndarray:
    """x_q ∼ N(0, I) of the given input shape, from `rng` ([W] App. F.1, "Canary construction").

    Args:
      shape: input shape, e.g. (3, 32, 32); positive integers.
      rng: the generator to draw from (derive it from the campaign seed and a purpose tag).

    Returns:
      float64 array of `shape` with i.i.d. standard normal entries.
    """
    if isinstance(shape, numbers.Integral):
        shape = (shape,)
    shape = tuple(shape)
    if not shape or any(isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1 for d in shape):
        raise InvalidArgument(f"shape must be a non-empty tuple of positive integers; got {shape!r}.")
    if not isinstance(rng, np.random.Generator):
        raise InvalidArgument(
            f"rng must be a numpy.random.Generator, e.g. numpy.random.default_rng(seed); got {type(rng).__name__}."
        )
    return rng.standard_normal(shape)


def least_likely_label(logits) -> int:
    """y_q = argmin_y f(x_q)_y from the reference model's logits for the canary ([W] App. F.1).

    Args:
      logits: (classes,) logits of the reference model on x_q, finite, ≥ 2 classes.

    Returns:
      The class with the smallest logit; on a tie the smallest such class index.
    """
    logits = check.finite_array("logits", logits, ndim=1)
    if logits.size < 2:
        raise InvalidArgument(f"logits need at least 2 classes; got {logits.size}.")
    return int(np.argmin(logits))

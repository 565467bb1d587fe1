"""Argument checks shared by the attacks modules.

Every public function of ``attacks`` validates its inputs here, so that a bad argument fails
early with a ValueError that names the argument and says how to fix it, instead of surfacing
later as a NaN or a numpy broadcasting error.
"""

from __future__ import annotations

import numbers

import numpy as np


def _describe_non_finite(values: np.ndarray) -> str:
    positions = [tuple(int(i) for i in p) for p in np.argwhere(~np.isfinite(values))]
    shown = ", ".join(str(p[0]) if len(p) == 1 else str(p) for p in positions[:5])
    more = "" if len(positions) <= 5 else f" and {len(positions) - 5} more"
    return f"{len(positions)} non-finite value(s) (NaN or ±inf) at index {shown}{more}"


def as_finite_array(values, name: str, *, ndim: int) -> np.ndarray:
    """Returns `values` as a float64 array with `ndim` dimensions and only finite entries."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name} must be numeric; got {type(values).__name__} ({error}).") from None
    if array.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-D array; got shape {array.shape}.")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains {_describe_non_finite(array)}; remove or repair those entries.")
    return array


def as_score_vector(values, name: str) -> np.ndarray:
    """Returns a non-empty, finite, 1-D float64 score vector."""
    array = as_finite_array(values, name, ndim=1)
    if array.size == 0:
        raise ValueError(f"{name} is empty: the statistics need at least one score from each class (IN and OUT).")
    return array


def as_membership(membership, name: str, *, shape: tuple[int, ...]) -> np.ndarray:
    """Returns `membership` as a bool array of the given shape (True = IN).

    Accepts a bool array or an integer array holding only 0 and 1.
    """
    array = np.asarray(membership)
    if array.shape != shape:
        raise ValueError(f"{name} must have shape {shape} (one entry per model and example); got {array.shape}.")
    if array.dtype == np.bool_:
        return array
    if np.issubdtype(array.dtype, np.integer) and np.all((array == 0) | (array == 1)):
        return array.astype(np.bool_)
    raise ValueError(
        f"{name} must be boolean (True = the example was in the model's training set); "
        f"got dtype {array.dtype} with values other than 0/1."
    )


def check_open_probability(value, name: str) -> float:
    """Returns `value` (a confidence level or a failure probability) as a float in (0, 1)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be in the open interval (0, 1); got {value!r}.")
    return float(value)


def check_delta(delta, name: str = "delta") -> float:
    """Returns `delta` as a float in [0, 1)."""
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 <= delta < 1.0:
        raise ValueError(f"{name} must be in [0, 1), e.g. 1e-5; got {delta!r}.")
    return float(delta)


def check_seed(seed, name: str = "seed") -> int:
    """Returns `seed` as a non-negative Python int."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"{name} must be a non-negative integer; got {seed!r}.")
    return int(seed)


def check_positive_int(value, name: str) -> int:
    """Returns `value` as a positive Python int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}.")
    return int(value)


def read_only(array: np.ndarray) -> np.ndarray:
    """Marks `array` read-only, so that the frozen result dataclasses holding it stay immutable."""
    array.setflags(write=False)
    return array

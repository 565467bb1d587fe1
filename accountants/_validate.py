"""Input checks shared by every bound: impossible inputs raise ValueError naming the parameter."""

from __future__ import annotations

import math
import numbers


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} must be a number, got NaN")
    return value


def positive(name: str, value) -> float:
    """A finite value > 0 (noise scales, sensitivities, norms)."""
    value = _real(name, value)
    if not 0.0 < value < math.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def non_negative(name: str, value) -> float:
    value = _real(name, value)
    if not 0.0 <= value < math.inf:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return value


def open_unit(name: str, value) -> float:
    """A probability strictly inside (0, 1): delta, delta', alpha of [W] Thm 5, ..."""
    value = _real(name, value)
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {value}")
    return value


def sample_rate(name: str, value) -> float:
    value = _real(name, value)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{name} must be in (0, 1] (Poisson sampling probability), got {value}")
    return value


def alignment(name: str, value) -> float:
    """An inner product of unit vectors, in (-1, 1] ([W] Eq. 2; -1 means v' = -v)."""
    value = _real(name, value)
    if not -1.0 < value <= 1.0:
        raise ValueError(f"{name} must be in (-1, 1] (inner product of unit vectors), got {value}")
    return value


def count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return value


def rank(r, d) -> tuple[int, int]:
    """Projection rank r and ambient dimension d with 1 <= r <= d."""
    d = count("d", d)
    r = count("r", r)
    if r > d:
        raise ValueError(f"r must be <= d (the rank of a d x d projection), got r={r} > d={d}")
    return r, d

"""The one set of argument checks for every package (accountants, attacks, dpaudit).

Each check takes ``(name, value, ...)``, returns the value in its canonical type, and raises
:class:`InvalidArgument` naming the parameter and the accepted range, so that a bad argument fails at the
boundary instead of surfacing later as a NaN, an overflow or a numpy broadcasting error. It lives in
``accountants`` because that is the package every other one may import (numpy only, no torch).

``InvalidArgument`` is the *usage* error: the command line prints it as one line and exits with status 2. Any
other exception is a bug and surfaces as one.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import TypeVar

import numpy as np

_Choice = TypeVar("_Choice")  # one_of returns the choice's own type (e.g. a Literal)


class InvalidArgument(ValueError):
    """Bad input a caller can fix: the message names the argument, what it must be, and what it got."""


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgument(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if math.isnan(value):
        raise InvalidArgument(f"{name} must be a number, got NaN")
    return value


def positive(name: str, value) -> float:
    """A finite value > 0 (noise scales, sensitivities, norms)."""
    value = _real(name, value)
    if not 0.0 < value < math.inf:
        raise InvalidArgument(f"{name} must be a finite number > 0, got {value}")
    return value


# A scale of a sampled release (a noise std, a norm, a sensitivity) enters the release's law squared, and the
# likelihood and covariance code multiplies two squared scales (sigma_A^2 |Q|_F^2 in [S]'s sketch covariance,
# sigma^2 against |v|^2 in the Gaussian log-likelihood ratio). Those fourth powers must be finite, normal float64
# numbers (about 2.2e-308 to 1.8e308): scales in [1e-75, 1e75] keep them inside [1e-300, 1e300].
SCALE_RANGE = (1e-75, 1e75)


def scale(name: str, value, *, zero: bool = False) -> float:
    """A scale of a sampled release in :data:`SCALE_RANGE` (``0`` too with ``zero=True``), so its squares stay finite.

    The release laws are scale invariant (scaling the data and the noise together leaves every likelihood ratio
    unchanged), so a value outside the range is a choice of units: the message says to rescale.
    """
    value = _real(name, value)
    low, high = SCALE_RANGE
    if not (low <= value <= high or (zero and value == 0.0)):
        interval = f"{'0 or ' if zero else ''}[{low:g}, {high:g}]"
        raise InvalidArgument(
            f"{name} must be in {interval} (a scale of the release: products of its square with another must stay "
            f"finite in float64; rescale the data and noise together), got {value}"
        )
    return value


def non_negative(name: str, value) -> float:
    value = _real(name, value)
    if not 0.0 <= value < math.inf:
        raise InvalidArgument(f"{name} must be a finite number >= 0, got {value}")
    return value


# The smallest normal float64. A probability below it (a subnormal δ or sampling rate) breaks the accountants'
# arithmetic (1/q overflows, log-domain sums meet inf - inf, an ε solved for δ becomes inf) while meaning nothing a
# float64 can tell from 0.
SMALLEST_PROBABILITY = float(np.finfo(np.float64).tiny)


def _normal_probability(name: str, value: float) -> float:
    if value < SMALLEST_PROBABILITY:
        raise InvalidArgument(
            f"{name} = {value:g} is below {SMALLEST_PROBABILITY:.4g}, the smallest normal float64, where the"
            " accountants' arithmetic ends: give at least that"
        )
    return value


def open_unit(name: str, value) -> float:
    """A probability strictly inside (0, 1): delta, delta', alpha of [W] Thm 5, ...; not subnormal."""
    value = _real(name, value)
    if not 0.0 < value < 1.0:
        raise InvalidArgument(f"{name} must be in (0, 1), got {value}")
    return _normal_probability(name, value)


def sample_rate(name: str, value) -> float:
    """A Poisson sampling probability in (0, 1], not subnormal."""
    value = _real(name, value)
    if not 0.0 < value <= 1.0:
        raise InvalidArgument(f"{name} must be in (0, 1] (Poisson sampling probability), got {value}")
    return _normal_probability(name, value)


def alignment(name: str, value) -> float:
    """An inner product of unit vectors, in (-1, 1] ([W] Eq. 2; -1 means v' = -v)."""
    value = _real(name, value)
    if not -1.0 < value <= 1.0:
        raise InvalidArgument(f"{name} must be in (-1, 1] (inner product of unit vectors), got {value}")
    return value


def count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and float(value).is_integer() and not isinstance(value, bool):
            value = int(float(value))
        else:
            raise InvalidArgument(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise InvalidArgument(f"{name} must be an integer >= {minimum}, got {value}")
    return value


def rank(r, d) -> tuple[int, int]:
    """Projection rank r and ambient dimension d with 1 <= r <= d."""
    d = count("d", d)
    r = count("r", r)
    if r > d:
        raise InvalidArgument(f"r must be <= d (the rank of a d x d projection), got r={r} > d={d}")
    return r, d


def integer(name: str, value, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer in [minimum, maximum] (either side optional); a float that is a whole number is accepted."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        whole = isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer()
        if whole and not isinstance(value, bool):  # True is a Real equal to 1, but not a count
            value = int(value)
        else:
            raise InvalidArgument(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        low = "-inf" if minimum is None else minimum
        high = "inf" if maximum is None else maximum
        raise InvalidArgument(f"{name} must be an integer in [{low}, {high}], got {value}")
    return value


def seed(name: str, value) -> int:
    """A seed for numpy/torch generators: an integer in [0, 2**63 - 1] (torch's seeds are signed 64-bit)."""
    return integer(name, value, 0, 2**63 - 1)


def one_of(name: str, value, choices: Sequence[_Choice]) -> _Choice:
    if value not in choices:
        raise InvalidArgument(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")
    return value


def real_in(name: str, value, low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> float:
    """A real number in the interval [low, high], each end open when asked ((low, high], [low, high), ...)."""
    value = _real(name, value)
    if (value < low or (low_open and value == low)) or (value > high or (high_open and value == high)):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise InvalidArgument(f"{name} must be in {interval}, got {value}")
    return value


def boolean(name: str, value) -> bool:
    """A real bool: TOML's ``"yes"`` or ``1`` is refused rather than read as truthy."""
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be true or false, got {value!r}")
    return value


def string(name: str, value) -> str:
    """A str: TOML's ``5`` or ``[...]`` is refused rather than turned into text."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a string, got {value!r}")
    return value


# What numpy's dtype kinds other than real numbers hold, in words: converting them to float64 either fails or
# gives a number that means something else (a date's seconds since 1970, "1.5" parsed, a complex number's real part).
_NOT_REAL = {
    "U": "text",
    "S": "bytes",
    "M": "dates",
    "m": "time spans",
    "c": "complex numbers",
    "V": "records or raw bytes",
}


def finite_array(name: str, values, *, ndim: int) -> np.ndarray:
    """``values`` as a float64 array with ``ndim`` dimensions and only finite entries.

    Only real numbers (booleans, integers, floats; Python objects that are each a real number) are accepted: text,
    dates, time spans, complex numbers and records are refused by their dtype, whatever they would convert to.
    """
    try:
        given = np.asarray(values)
    except (TypeError, ValueError) as error:  # e.g. ragged nested lists
        raise InvalidArgument(f"{name} must be numeric; got {type(values).__name__} ({error})") from None
    kind = given.dtype.kind
    if kind in _NOT_REAL or (kind == "O" and not all(isinstance(v, numbers.Real) for v in given.flat)):
        held = _NOT_REAL.get(kind, "Python objects that are not all real numbers")
        raise InvalidArgument(
            f"{name} must hold real numbers; got dtype {given.dtype} ({held}): convert it to floats (e.g. seconds"
            " for times, the real and imaginary parts as two features for complex values) or drop it"
        )
    array = given.astype(np.float64)
    if array.ndim != ndim:
        raise InvalidArgument(f"{name} must be a {ndim}-D array; got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        positions = [tuple(int(i) for i in p) for p in np.argwhere(~np.isfinite(array))]
        shown = ", ".join(str(p[0]) if len(p) == 1 else str(p) for p in positions[:5])
        more = "" if len(positions) <= 5 else f" and {len(positions) - 5} more"
        raise InvalidArgument(
            f"{name} contains {len(positions)} non-finite value(s) (NaN or ±inf) at index {shown}{more}; "
            "remove or repair those entries"
        )
    return array


def class_labels(name: str, values) -> np.ndarray:
    """``values`` as a 1-D int64 array of class labels: whole numbers only (``3.0`` is accepted, ``"cat"`` is not).

    A float label must be at most 2^53 in magnitude, an integer one fit int64: beyond, a float no longer tells
    neighbouring whole numbers apart (2^53 + 1 reads as 2^53) and int64 holds none, so distinct classes would merge.
    """
    array = np.asarray(values)
    if array.ndim != 1:
        raise InvalidArgument(f"{name} must be a 1-D array of class labels (one per example); got shape {array.shape}")
    floating = np.issubdtype(array.dtype, np.floating)
    if array.dtype == np.bool_ or not (floating or np.issubdtype(array.dtype, np.integer)):
        raise InvalidArgument(
            f"{name} must hold integer class labels; got dtype {array.dtype}: encode the classes as 0..C-1"
        )
    largest, written = (2**53, "2^53") if floating else (np.iinfo(np.int64).max, "2^63 - 1")
    bad = np.flatnonzero(~(np.abs(array) <= largest) | (array != np.round(array)))
    if bad.size:
        raise InvalidArgument(
            f"{name} must hold integer class labels; got {array[bad[0]]} at index {int(bad[0])}"
            f"{f' and {bad.size - 1} more' if bad.size > 1 else ''}: encode the classes as 0..C-1 (whole numbers of"
            f" magnitude at most {written})"
        )
    return array.astype(np.int64)


def score_vector(name: str, values) -> np.ndarray:
    """A non-empty, finite, 1-D float64 vector of attack scores."""
    array = finite_array(name, values, ndim=1)
    if array.size == 0:
        raise InvalidArgument(f"{name} is empty: the statistics need at least one score from each class (IN and OUT)")
    return array


def membership(name: str, value, *, shape: tuple[int, ...]) -> np.ndarray:
    """A bool array of ``shape`` (True = IN), from a bool array or an integer array of 0 and 1 only."""
    array = np.asarray(value)
    if array.shape != shape:
        raise InvalidArgument(f"{name} must have shape {shape} (one entry per model and example); got {array.shape}")
    if array.dtype == np.bool_:
        return array
    if np.issubdtype(array.dtype, np.integer) and np.all((array == 0) | (array == 1)):
        return array.astype(np.bool_)
    raise InvalidArgument(
        f"{name} must be boolean (True = the example was in the model's training set); "
        f"got dtype {array.dtype} with values other than 0/1"
    )


# What one request (a bound, an audit) may allocate: a larger one is refused with its size rather than dying of
# MemoryError halfway (or thrashing the machine it shares).
MEMORY_LIMIT = 8 * 2**30


def allocation(what: str, nbytes: float, fix: str) -> None:
    """Refuse ``what`` if it needs more than :data:`MEMORY_LIMIT` bytes; ``fix`` says which option to lower."""
    if not nbytes <= MEMORY_LIMIT:
        raise InvalidArgument(
            f"{what} needs {nbytes / 2**30:.3g} GiB, more than the {MEMORY_LIMIT / 2**30:g} GiB allowed; {fix}"
        )

"""Root finding and 1-D minimisation used by several bounds."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.optimize import brentq, minimize_scalar

_MAX_DOUBLINGS = 200


def solve_decreasing(log_f: Callable[[float], float], log_target: float, lo: float, hi: float) -> float:
    """The x in [lo, inf) where a non-increasing ``log_f`` crosses ``log_target``.

    Returns ``lo`` if ``log_f(lo) <= log_target``. ``hi`` is a first guess for the upper end of the
    bracket; it is doubled until ``log_f(hi) < log_target``.
    """
    if log_f(lo) <= log_target:
        return lo
    for _ in range(_MAX_DOUBLINGS):
        if log_f(hi) < log_target:
            break
        lo, hi = hi, 2.0 * hi + 1.0
    else:
        return math.inf
    return brentq(lambda x: log_f(x) - log_target, lo, hi, xtol=1e-13, rtol=1e-12, maxiter=500)


def minimize_on_grid(f: Callable[[float], float], grid: np.ndarray, xatol: float = 1e-10) -> tuple[float, float]:
    """Minimise ``f`` over [grid[0], grid[-1]]: scan the grid, then Brent between the best point's neighbours.

    Returns ``(x_min, f(x_min))``; ``xatol`` is Brent's absolute tolerance in x. Scanning first makes
    the result robust to flat or infinite regions (e.g. orders beyond a bound's range, where f is inf).
    """
    values = np.array([f(x) for x in grid])
    best = int(np.argmin(values))
    if not np.isfinite(values[best]):
        return float(grid[best]), math.inf
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    result = minimize_scalar(f, bounds=(lo, hi), method="bounded", options={"xatol": xatol})
    if result.fun < values[best]:
        return float(result.x), float(result.fun)
    return float(grid[best]), float(values[best])

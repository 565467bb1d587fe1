"""How numbers and JSON are written for people and files: the one number formatter and strict-JSON writer.

Torch-free (the foundations stage; it imports only :mod:`accountants.jsondata`), so that every stage, the reports
and the command line spell them alike.
"""

from __future__ import annotations

import json
import math
from typing import Any

from accountants.jsondata import json_safe


def number(value: float | None, digits: int = 3, *, significant: bool = False, infinity: str = "∞") -> str:
    """``value`` for a table or report line.

    Args:
        value: the number; None where there is none.
        digits: decimals (``f`` format), or significant digits with ``significant``.
        significant: ``g`` format (``1.235``, ``1e-05``) instead of fixed decimals.
        infinity: how +inf is written (-inf and nan as the format writes them: "-inf", "nan").

    Returns:
        "n/a" for None, ``infinity`` for +inf, else the formatted number.
    """
    if value is None:
        return "n/a"
    if value == math.inf:
        return infinity
    return f"{value:.{digits}{'g' if significant else 'f'}}"


def short_number(value: float) -> str:
    """4 significant digits, +inf as "inf": the ε and δ of ``dpaudit bounds`` and ``dpaudit audit-mechanism``."""
    return number(value, 4, significant=True, infinity="inf")


def json_text(value: Any) -> str:
    """Strict JSON for every JSON file and ``--json`` output: indented by 2, with a final newline.

    No NaN or Infinity tokens: non-finite floats are strings (:func:`accountants.jsondata.json_safe`).
    """
    return json.dumps(json_safe(value), indent=2, allow_nan=False) + "\n"

"""Values as strict JSON data: the one conversion every package's JSON output goes through.

It sits in ``accountants`` because every package may import it (``accountants.result.Bound.to_dict`` needs it
here; ``dpaudit.formatting.json_text`` writes its result as text).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON data, every non-finite float spelled as a string ("inf", "-inf", "nan").

    JSON has no Infinity or NaN. Objects with a ``to_dict`` method become what it returns, other dataclass
    instances the dict of their fields, mappings dicts (same keys), tuples and lists lists, and numpy (or torch)
    scalars Python numbers (``item()``); anything else is returned as it is.
    """
    if hasattr(value, "to_dict") and not isinstance(value, type):
        return json_safe(value.to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: json_safe(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return repr(float(value))
    return value

"""The one number formatter and the one strict-JSON conversion (dpaudit.formatting, accountants.jsondata)."""

from __future__ import annotations

import dataclasses
import json
import math
from types import MappingProxyType

import numpy as np
import pytest

from accountants.jsondata import json_safe
from accountants.result import Bound
from dpaudit.formatting import json_text, number, short_number


@pytest.mark.parametrize(
    "value, kwargs, text",
    [
        (None, {}, "n/a"),
        (math.inf, {}, "∞"),
        (-math.inf, {}, "-inf"),
        (1.23456, {}, "1.235"),
        (1.23456, {"digits": 2}, "1.23"),
        (1.23456e-5, {"digits": 4, "significant": True}, "1.235e-05"),
        (math.inf, {"digits": 4, "significant": True, "infinity": "inf"}, "inf"),
    ],
)
def test_number(value, kwargs, text):
    assert number(value, **kwargs) == text


def test_short_number_is_four_significant_digits_and_inf():
    assert [short_number(v) for v in (0.000123456, 12345.6, math.inf)] == ["0.0001235", "1.235e+04", "inf"]


@dataclasses.dataclass(frozen=True)
class _Pair:
    low: float
    high: float


def test_json_safe_spells_non_finite_floats_and_converts_containers():
    value = {
        "floats": (1.5, math.inf, -math.inf, math.nan, np.float64(-math.inf)),
        "numpy": [np.int64(3), np.bool_(True)],
        "mapping": MappingProxyType({"k": np.float32(0.5)}),
        "pair": _Pair(0.0, math.inf),
        "bound": Bound(1.0, 1e-5, "replace-one", "test"),
    }
    safe = json_safe(value)
    assert safe["floats"] == [1.5, "inf", "-inf", "nan", "-inf"]
    assert safe["numpy"] == [3, True] and type(safe["numpy"][0]) is int
    assert safe["mapping"] == {"k": 0.5}
    assert safe["pair"] == {"low": 0.0, "high": "inf"}
    assert safe["bound"] == Bound(1.0, 1e-5, "replace-one", "test").to_dict()
    assert json.loads(json_text(value)) == safe


def test_json_text_is_strict_indented_and_ends_with_a_newline():
    text = json_text({"a": [math.nan]})
    assert text == '{\n  "a": [\n    "nan"\n  ]\n}\n'


def test_bound_to_dict_is_strict_json():
    bound = Bound(math.inf, 1e-5, "replace-one", "x", inputs={"n": math.nan, "m": -math.inf}, valid=False, reason="r")
    assert bound.to_dict()["inputs"] == {"n": "nan", "m": "-inf"}
    json.dumps(bound.to_dict(), allow_nan=False)

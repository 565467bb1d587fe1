"""The Bound result type: its invariants (docs/theory.md §0) are enforced at construction."""

import json
import math

import pytest

from accountants.result import ADD_REMOVE, REPLACE_ONE, Bound, inapplicable


def test_valid_bound_round_trips_to_json():
    bound = Bound(
        epsilon=1.5,
        delta=1e-5,
        neighbouring=REPLACE_ONE,
        source="test",
        inputs={"sigma": 2.0},
        epsilon_interval=(1.4, 1.6),
        confidence=0.99,
    )
    data = json.loads(json.dumps(bound.to_dict()))
    assert data["epsilon"] == 1.5 and data["epsilon_interval"] == [1.4, 1.6] and data["inputs"] == {"sigma": 2.0}


def test_inapplicable_bound_has_infinite_epsilon_and_reason():
    bound = inapplicable("[W] Thm 1", ADD_REMOVE, "rho <= K", delta=0.01)
    assert math.isinf(bound.epsilon) and not bound.valid and bound.reason == "rho <= K"
    assert json.loads(json.dumps(bound.to_dict()))["epsilon"] == "inf"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(epsilon=math.nan, delta=0.1), "epsilon"),
        (dict(epsilon=-1.0, delta=0.1), "epsilon"),
        (dict(epsilon=1.0, delta=math.nan), "delta"),
        (dict(epsilon=1.0, delta=1.5), "delta"),
        (dict(epsilon=math.inf, delta=0.1), "valid"),
        (dict(epsilon=1.0, delta=0.1, valid=False, reason="x"), "valid"),
        (dict(epsilon=math.inf, delta=0.1, valid=False), "reason"),
        (dict(epsilon=1.0, delta=0.1, neighbouring="swap"), "neighbouring"),
    ],
)
def test_construction_rejects_broken_bounds(kwargs, message):
    kwargs = dict(dict(neighbouring=REPLACE_ONE, source="test"), **kwargs)
    with pytest.raises(ValueError, match=message):
        Bound(**kwargs)


def test_bound_is_immutable_including_its_mappings():
    bound = Bound(epsilon=1.0, delta=0.1, neighbouring=REPLACE_ONE, source="test", inputs={"a": 1})
    with pytest.raises(AttributeError):
        bound.epsilon = 2.0
    with pytest.raises(TypeError):
        bound.inputs["a"] = 2

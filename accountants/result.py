"""The result type every bound in ``accountants`` returns (docs/theory.md §0, §2).

A :class:`Bound` states "the mechanism is (epsilon, delta)-DP under ``neighbouring``", together with
what the statement rests on: the inputs, the data-dependent assumptions (``conditional_on``) and,
for Monte-Carlo estimates, a confidence interval.

Conventions (docs/theory.md §0):

* ``valid`` is True exactly when ``epsilon`` is finite. A bound whose theorem does not apply (a
  condition fails, or the requested delta is out of its reach) has ``epsilon = inf``,
  ``valid = False`` and a ``reason``. When the query was "delta for this epsilon", such a bound
  reports ``delta = 1`` (nothing is guaranteed); when it was "epsilon for this delta" it keeps the
  requested delta. The queried value is always in ``inputs``.
* Never NaN: construction fails loudly if a computation produced one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from accountants.jsondata import json_safe

Neighbouring = Literal["replace-one", "add/remove"]
REPLACE_ONE: Neighbouring = "replace-one"
ADD_REMOVE: Neighbouring = "add/remove"
_NEIGHBOURING = (REPLACE_ONE, ADD_REMOVE)


@dataclass(frozen=True)
class Bound:
    """An (epsilon, delta) privacy statement and what it rests on.

    Attributes:
        epsilon: privacy loss bound (``inf`` when the bound does not apply).
        delta: failure probability, in [0, 1].
        neighbouring: ``"replace-one"`` ([W], [S]) or ``"add/remove"`` (DP-SGD accountants).
        source: where the statement comes from, e.g. ``"[W] Thm 5"``.
        inputs: the parameters the bound was computed from (including the queried delta or epsilon).
        conditional_on: data-dependent assumptions the statement needs (empty if none).
        valid: False when the theorem's conditions fail; then ``epsilon`` is inf.
        reason: why the bound is invalid (empty when valid).
        details: derived quantities worth reporting (optimal alpha, Gamma, the delta split, ...).
        epsilon_interval, delta_interval: Monte-Carlo confidence intervals (``None`` for
            closed-form or numerical-quadrature bounds), at level ``confidence``.
    """

    epsilon: float
    delta: float
    neighbouring: Neighbouring
    source: str
    inputs: Mapping[str, Any] = field(default_factory=dict)
    conditional_on: tuple[str, ...] = ()
    valid: bool = True
    reason: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    epsilon_interval: tuple[float, float] | None = None
    delta_interval: tuple[float, float] | None = None
    confidence: float | None = None

    def __post_init__(self):
        # Frozen all the way down: mappings are exposed read-only.
        object.__setattr__(self, "inputs", MappingProxyType(dict(self.inputs)))
        object.__setattr__(self, "details", MappingProxyType(dict(self.details)))
        object.__setattr__(self, "conditional_on", tuple(self.conditional_on))
        object.__setattr__(self, "epsilon", float(self.epsilon))
        object.__setattr__(self, "delta", float(self.delta))
        self._check()

    def _check(self):
        if self.neighbouring not in _NEIGHBOURING:
            raise ValueError(f"neighbouring must be one of {_NEIGHBOURING}, got {self.neighbouring!r}")
        if math.isnan(self.epsilon) or self.epsilon < 0:
            raise ValueError(f"{self.source}: epsilon must be >= 0 or inf, got {self.epsilon}")
        if math.isnan(self.delta) or not 0.0 <= self.delta <= 1.0:
            raise ValueError(f"{self.source}: delta must be in [0, 1], got {self.delta}")
        if self.valid != math.isfinite(self.epsilon):
            raise ValueError(f"{self.source}: valid={self.valid} but epsilon={self.epsilon}")
        if not self.valid and not self.reason:
            raise ValueError(f"{self.source}: an invalid bound needs a reason")

    @property
    def is_conditional(self) -> bool:
        return bool(self.conditional_on)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (inf and nan written as strings: :func:`accountants.jsondata.json_safe`)."""
        return {
            "source": self.source,
            "epsilon": json_safe(self.epsilon),
            "delta": self.delta,
            "neighbouring": self.neighbouring,
            "valid": self.valid,
            "reason": self.reason,
            "conditional_on": list(self.conditional_on),
            "inputs": json_safe(dict(self.inputs)),
            "details": json_safe(dict(self.details)),
            "epsilon_interval": json_safe(self.epsilon_interval),
            "delta_interval": json_safe(self.delta_interval),
            "confidence": self.confidence,
        }


def inapplicable(
    source: str,
    neighbouring: Neighbouring,
    reason: str,
    *,
    delta: float = 1.0,
    inputs: Mapping[str, Any] | None = None,
    conditional_on: tuple[str, ...] = (),
) -> Bound:
    """A bound whose theorem does not apply: epsilon = inf with the reason (docs/theory.md §0)."""
    return Bound(
        epsilon=math.inf,
        delta=delta,
        neighbouring=neighbouring,
        source=source,
        inputs=inputs or {},
        conditional_on=conditional_on,
        valid=False,
        reason=reason,
    )

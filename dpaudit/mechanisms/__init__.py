"""Mechanisms: how shadow-model gradients are turned into updates (SPEC §1), one module per family.

A mechanism names the tensors it trains (its ``parameterization``, see :mod:`dpaudit.models`), draws its
per-model randomness in :meth:`Mechanism.setup`, and maps each step's gradients to the update the optimiser
applies in :meth:`Mechanism.transform`. The engine knows nothing about privacy.
"""

from dpaudit.mechanisms.base import Mechanism, Step

__all__ = ["Mechanism", "Step"]

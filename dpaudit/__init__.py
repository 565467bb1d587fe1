"""dpaudit: does a fine-tuning mechanism leak as much as its paper's bound allows, or more?

Importing this package is cheap (no torch): the training stack lives in submodules that
import torch themselves, so ``dpaudit bounds`` starts fast.
"""

from dpaudit.version import __version__

__all__ = ["__version__", "audit", "audit_training"]


def __getattr__(name: str):
    """``dpaudit.audit`` and ``dpaudit.audit_training`` (:mod:`dpaudit.api`), imported on first use: they need torch."""
    if name in ("audit", "audit_training"):
        from dpaudit import api

        return getattr(api, name)
    raise AttributeError(f"module 'dpaudit' has no attribute {name!r}")

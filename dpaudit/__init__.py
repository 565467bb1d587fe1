"""dpaudit: does a fine-tuning mechanism leak as much as its paper's bound allows, or more?

Importing this package is cheap (no torch): the training stack lives in submodules that
import torch themselves, so ``dpaudit bounds`` starts fast.
"""

from dpaudit.version import __version__

__all__ = ["__version__", "audit"]


def __getattr__(name: str):
    """``dpaudit.audit`` (:func:`dpaudit.api.audit`), imported on first use: it needs torch."""
    if name == "audit":
        from dpaudit.api import audit

        return audit
    raise AttributeError(f"module 'dpaudit' has no attribute {name!r}")

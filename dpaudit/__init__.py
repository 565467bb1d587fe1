"""dpaudit: does a fine-tuning mechanism leak as much as its paper's bound allows, or more?

Importing this package is cheap (no torch): the training stack lives in submodules that
import torch themselves, so ``dpaudit bounds`` starts fast.
"""

__version__ = "0.1.0"

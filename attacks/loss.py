"""Loss-threshold attack (Yeom et al. 2018, "Privacy risk in machine learning"; [W] App. F.1).

The score is the negated loss, -ℓ(x; θ): members tend to have lower loss, and every statistic
in `attacks` reads higher scores as "member". A threshold on this score is the [W] F.1 attack.
"""

from __future__ import annotations

import numpy as np

from accountants import validation as check


def loss_scores(losses) -> np.ndarray:
    """Membership scores -ℓ for per-model, per-example losses.

    Args:
      losses: (models, examples) losses, e.g. `scores.cross_entropy_loss(logits, labels)`.

    Returns:
      (models, examples) scores, higher = more likely a member.
    """
    return -check.finite_array("losses", losses, ndim=2)

"""Reference-model calibrated attack of [S] Eq. 16 (Malekmohammadi & Farnadi).

[S] predicts "member" when L(x; θ) - L(x; θ_ref) < γ, where θ_ref is a reference model trained
on auxiliary data (the calibration of Sablayrolles et al. 2019, Carlini et al. 2022,
Mireshghallah et al. 2022 and Ye et al. 2022, which [S] cites): subtracting the reference loss
removes how hard x is in general, leaving how much better θ fits x than a model that never saw
it. The score is the negated difference
L(x; θ_ref) - L(x; θ), so that "score ≥ -γ" is [S]'s rule and higher = member.
"""

from __future__ import annotations

import numpy as np

from accountants import validation as check
from accountants.validation import InvalidArgument


def reference_calibrated_scores(target_losses, reference_losses) -> np.ndarray:
    """Scores L(x; θ_ref) - L(x; θ) of [S] Eq. 16 (negated, so higher = member).

    Args:
      target_losses: (models, examples) losses L(x; θ) of the audited models.
      reference_losses: (examples,) losses of one reference model, shared by all audited
        models as in [S], or (models, examples) with one reference model per audited model.

    Returns:
      (models, examples) scores.
    """
    target_losses = check.finite_array("target_losses", target_losses, ndim=2)
    reference_losses = np.asarray(reference_losses, dtype=np.float64)
    if reference_losses.shape not in (target_losses.shape[1:], target_losses.shape):
        raise InvalidArgument(
            f"reference_losses must have shape {target_losses.shape[1:]} (one reference model) or "
            f"{target_losses.shape} (one per audited model); got {reference_losses.shape}."
        )
    reference_losses = check.finite_array("reference_losses", reference_losses, ndim=reference_losses.ndim)
    return reference_losses - target_losses

"""What the audit observes of a trained model: one number per statistic, larger when the canary was trained on.

Black-box statistics read the model's outputs on the canary; white-box ones its parameters:

=====================  ==========================================================================================
statistic              score (higher: the canary more likely a member)
=====================  ==========================================================================================
canary-loss            -ℓ(θ; x_c, y_c), the cross-entropy of the canary's label
logit-margin           f(x_c)_{y_c} - max_{j ≠ y_c} f(x_c)_j
gradient-alignment     -⟨θ - θ_0, u⟩ / ‖u‖, u = ∇_θ ℓ(θ_0; x_c, y_c): a gradient step on the canary moves θ along -u
update-norm            ‖θ - θ_0‖: sees what one direction cannot, e.g. a noise scale that depends on the data
negative-update-norm   -‖θ - θ_0‖: the same where the canary makes the update smaller (a larger normaliser)
=====================  ==========================================================================================

Next-token data (a canary is a window x_c (L,) with next tokens y_c (L,), the model's logits (L, V)): ℓ is the
window's mean token cross-entropy, the sequence loss, in canary-loss and in u; logit-margin is the mean over the L
positions of the target token's logit minus the largest other one.

A user's statistic ``STATISTIC(start, trained, x_c, y_c) -> float`` is one more column. Parameters are every
floating-point tensor of the model's state; the frozen ones do not move, so they add nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

STATISTICS = ("canary-loss", "logit-margin", "gradient-alignment", "update-norm", "negative-update-norm")
PER_CANARY = STATISTICS[:3]  # the one-run design scores each of its canaries by these
BLACK_BOX = ("canary-loss", "logit-margin")
Statistic = Callable[[nn.Module, nn.Module, np.ndarray, np.ndarray], float]


def logits_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A classifier's logits; a Hugging Face model's output is read through ``.logits``."""
    output = model(x)
    return getattr(output, "logits", output)


def canary_losses(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(M,) ℓ of each canary: the cross-entropy of its label, or of its window the mean over positions.

    Classification: logits (M, C), y (M,). Next-token: logits (M, L, V), y (M, L), the mean over the L positions of
    the next token's cross-entropy.
    """
    losses = nn.functional.cross_entropy(logits.flatten(0, -2), y.flatten(), reduction="none").view(y.shape)
    return losses if y.ndim == 1 else losses.mean(-1)


def logit_margins(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(M,) each canary's label logit minus its largest other logit; a window's: the mean of that over positions."""
    own = logits.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    margins = own - logits.scatter(-1, y.unsqueeze(-1), -torch.inf).max(-1).values
    return margins if y.ndim == 1 else margins.mean(-1)


def _floating_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every floating-point tensor of the model's state (parameters and buffers), by name, in state order."""
    return {name: tensor for name, tensor in model.state_dict(keep_vars=True).items() if tensor.is_floating_point()}


def _flat(tensors) -> torch.Tensor:
    return torch.cat([tensor.detach().double().flatten() for tensor in tensors])


class Observer:
    """The statistics of models trained from ``start``, for canaries ``x_c`` (M, ...) with labels ``y_c`` (M,).

    Next-token canaries: windows ``x_c`` (M, L) with their next tokens ``y_c`` (M, L) (module docstring).

    The many-run design has one canary; the one-run design M, each scored on its own (the per-canary statistics:
    ``PER_CANARY``). The update norm is the model's, not a canary's, so it is observed with one canary only.
    """

    def __init__(self, start: nn.Module, x_c: np.ndarray, y_c: np.ndarray, user: dict[str, Statistic] | None = None):
        self.start, self.user = copy.deepcopy(start).eval(), dict(user or {})
        labels = np.asarray(y_c, dtype=np.int64)
        self.x_c, self.y_c = x_c, labels if labels.ndim == 2 else labels.reshape(-1)  # 2-D: next-token windows
        self._x, self._y = torch.from_numpy(x_c), torch.from_numpy(self.y_c)
        self._theta0 = _flat(_floating_state(start).values())
        self._directions = torch.stack([self._unit_canary_gradient(i) for i in range(len(self.y_c))])

    def _unit_canary_gradient(self, index: int) -> torch.Tensor:
        """u/‖u‖, u = ∇_θ ℓ(θ_0; x_c, y_c) of canary ``index`` over the floating state (0 for buffers, unused)."""
        duplicate = copy.deepcopy(self.start)
        for parameter in duplicate.parameters():
            parameter.requires_grad_(True)
        state = _floating_state(duplicate)
        parameters = {name: tensor for name, tensor in state.items() if isinstance(tensor, nn.Parameter)}
        with torch.enable_grad():
            logits = logits_of(duplicate, self._x[index : index + 1])
            loss = canary_losses(logits, self._y[index : index + 1]).sum()
            found = torch.autograd.grad(loss, list(parameters.values()), allow_unused=True)
        gradients = dict(zip(parameters, found))
        direction = _flat(
            torch.zeros_like(tensor) if gradients.get(name) is None else gradients[name]
            for name, tensor in state.items()
        )
        norm = direction.norm()
        return direction / norm if norm > 0 else direction

    @property
    def names(self) -> tuple[str, ...]:
        return (*(STATISTICS if len(self.y_c) == 1 else PER_CANARY), *self.user)

    @torch.no_grad()
    def observe(self, trained: nn.Module) -> dict[str, list[float]]:
        """Every statistic of ``trained`` (a model of ``start``'s architecture), one value per canary."""
        logits = logits_of(trained, self._x).double()
        change = _flat(_floating_state(trained).values()) - self._theta0
        found = {
            "canary-loss": (-canary_losses(logits, self._y)).tolist(),
            "logit-margin": logit_margins(logits, self._y).tolist(),
            "gradient-alignment": (-(self._directions @ change)).tolist(),
        }
        if len(self.y_c) == 1:
            found |= {"update-norm": [float(change.norm())], "negative-update-norm": [-float(change.norm())]}
        for name, statistic in self.user.items():
            found[name] = [
                float(statistic(self.start, trained, self.x_c[i : i + 1], self.y_c[i : i + 1]))
                for i in range(len(self.y_c))
            ]
        return found

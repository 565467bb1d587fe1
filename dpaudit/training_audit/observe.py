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

A training function that reports its steps (it takes an ``on_step`` argument and calls ``on_step(model)`` after
every update) is observed at every step, as DP-SGD's accountant assumes every intermediate model is released
(Nasr et al. 2023's white-box "all steps" adversary). Step t's update Δ_t = θ_t - θ_{t-1} is read in two numbers:
its projection a_t = -⟨Δ_t, u_t⟩ on the canary's unit gradient u_t at θ_{t-1} (the direction a step on the canary
takes, followed as the model moves), and its noise scale s_t, the normal-consistent median absolute value of the
coordinates Δ_t changed (1.4826 · median |Δ_t,i|; the noise dominates the coordinates of a noisy update). With
z_t = a_t / s_t, the canary's step in units of the noise:

=====================  ==========================================================================================
step-alignment         Σ_t z_t / √T: every step's pull toward the canary (Nasr et al. 2023's sum over steps)
step-likelihood        Σ_t log(1 - q + q·exp(z_t/σ - 1/(2σ²))): the log likelihood ratio of the claimed
                       Poisson-subsampled Gaussian (σ, q), where the claim is one; the most powerful test of it
step-noise-scale       -min_t log s_t: the least noisy step; where the noise is divided by a count that includes
                       the canary, a batch larger than any without it has less noise than any step without it
step-difference        mean_t (d_t / s_t)², d_t = -⟨Δ_t - Δ_{t-1}, ū_t⟩: consecutive updates differ by their
                       noises and their gradients; where every step adds the same noise, only by the gradients
=====================  ==========================================================================================

The one-run design's M canaries each get their own step-alignment and step-likelihood (Steinke et al. 2023's
white-box one-run audit, which observes every step); step-noise-scale and step-difference are the model's, read
with one canary only. Following M canaries costs a per-example gradient of each at every step (``vmap``).

ū_t is u_t restricted to the parameters no example of the data moves (coordinates where the data's gradient at θ_0
is exactly 0, e.g. a first layer's weights of a feature the data leaves at 0; the canary's input, drawn in the
data's spread with scale 1 where the data has none, reaches them), normalised; u_t where the canary's gradient
has no weight there. There the update difference is the canary's alone, so without the canary it vanishes when
the noise repeats.

Next-token data (a canary is a window x_c (L,) with next tokens y_c (L,), the model's logits (L, V)): ℓ is the
window's mean token cross-entropy, the sequence loss, in canary-loss and in u; logit-margin is the mean over the L
positions of the target token's logit minus the largest other one.

A user's statistic ``STATISTIC(start, trained, x_c, y_c) -> float`` is one more column. Parameters are every
floating-point tensor of the model's state; u is the canary's gradient over the parameters the starting model
trains (requires_grad), 0 on buffers and frozen parameters (a LoRA model's base), which no update moves.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from dpaudit import models
from dpaudit.errors import UsageError

STATISTICS = ("canary-loss", "logit-margin", "gradient-alignment", "update-norm", "negative-update-norm")
BLACK_BOX = ("canary-loss", "logit-margin")
STEP_STATISTICS = ("step-alignment", "step-likelihood", "step-noise-scale", "step-difference")
_NORMAL_MAD = 1.4826  # σ of a normal sample per unit of its median absolute value
Statistic = Callable[[nn.Module, nn.Module, np.ndarray, np.ndarray], float]


def logits_of(model: Callable[[torch.Tensor], Any], x: torch.Tensor) -> torch.Tensor:
    """A classifier's logits, read from what it returns (:func:`dpaudit.models.output_logits`)."""
    return models.output_logits(model(x))


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


def _layout(floating: dict[str, torch.Tensor], holds: dict[str, str | None]) -> tuple[tuple[slice, str], ...]:
    """Where each trained parameter sits in the flat floating state: (its coordinates, its parameter's name).

    ``holds``: for each name of the floating state, the trained parameter it holds (a tied weight is under two
    names, so at two places), or None (a buffer, a frozen parameter).
    """
    layout, offset = [], 0
    for name, tensor in floating.items():
        held = holds[name]
        if held is not None:
            layout.append((slice(offset, offset + tensor.numel()), held))
        offset += tensor.numel()
    return tuple(layout)


@dataclass(frozen=True)
class CanaryGradients:
    """M canaries' gradients at one model state, kept by trained parameter as (M, numel) float32 blocks.

    Projections and norms are taken block by block: a flat (M, P) float64 matrix would cost more, at M = 1000
    canaries and every step, than the gradients themselves. Coordinates outside the blocks (buffers, frozen
    parameters) are 0.
    """

    blocks: tuple[tuple[slice, torch.Tensor], ...]  # the flat floating state's coordinates of a parameter, (M, numel)
    norms: torch.Tensor  # (M,) ‖∇_θ ℓ‖, float64
    size: int  # P, the flat floating state's length

    @staticmethod
    def of(gradients: dict[str, torch.Tensor], layout: tuple[tuple[slice, str], ...], size: int) -> CanaryGradients:
        """From (M, *shape) gradients by parameter name, laid out as ``layout`` (:func:`_layout`) in ``size``."""
        blocks = tuple((where, gradients[name].detach().float().flatten(1)) for where, name in layout)
        squares = sum(torch.linalg.vector_norm(block, dim=1).double().square() for _, block in blocks)
        return CanaryGradients(blocks, torch.as_tensor(squares, dtype=torch.float64).sqrt(), size)

    def alignments(self, change: torch.Tensor) -> np.ndarray:
        """(M,) -⟨change, u⟩ of the flat state change ``change`` on each canary's unit gradient u (0 where ∇ = 0)."""
        dots = sum((block @ change[where].float()).double() for where, block in self.blocks)
        found = -torch.as_tensor(dots, dtype=torch.float64) / torch.where(self.norms > 0, self.norms, 1.0)
        return found.numpy()

    def unit(self, index: int) -> torch.Tensor:
        """Canary ``index``'s unit gradient over the flat floating state, float64 (the size of ``change``)."""
        flat = torch.zeros(self.size, dtype=torch.float64)
        for where, block in self.blocks:
            flat[where] = block[index].double()
        norm = self.norms[index]
        return flat / norm if norm > 0 else flat


class Observer:
    """The statistics of models trained from ``start``, for canaries ``x_c`` (M, ...) with labels ``y_c`` (M,).

    Next-token canaries: windows ``x_c`` (M, L) with their next tokens ``y_c`` (M, L) (module docstring).

    The many-run design has one canary; the one-run design M, each scored on its own (canary-loss, logit-margin,
    gradient-alignment, and step-alignment and step-likelihood where steps are reported). The update norm,
    ``step-noise-scale`` and ``step-difference`` are the model's, not a canary's, so they are observed with one
    canary only. ``claim``: (σ, q) of a claimed Poisson-subsampled Gaussian, for ``step-likelihood``;
    ``data``: the training set without the canary, whose gradients decide ū_t (module docstring).
    """

    def __init__(
        self,
        start: nn.Module,
        x_c: np.ndarray,
        y_c: np.ndarray,
        user: dict[str, Statistic] | None = None,
        claim: tuple[float, float] | None = None,
        data: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        self.start, self.user, self.claim = copy.deepcopy(start).eval(), dict(user or {}), claim
        labels = np.asarray(y_c, dtype=np.int64)
        self.x_c, self.y_c = x_c, labels if labels.ndim == 2 else labels.reshape(-1)  # 2-D: next-token windows
        self._x, self._y = torch.from_numpy(x_c), torch.from_numpy(self.y_c)
        self._theta0 = _flat(_floating_state(start).values())
        self._probe = copy.deepcopy(start).eval()  # where canary gradients are taken, at any parameters
        # The parameters the starting model trains, by name, and for each name of the floating state the trained
        # parameter it holds (a tied weight is under two names), or None: a frozen one (a LoRA model's base) never
        # moves, canary or not.
        trains = {name: parameter.requires_grad for name, parameter in start.named_parameters()}
        self._trained = [name for name, parameter in self._probe.named_parameters() if trains[name]]
        names = {id(parameter): name for name, parameter in self._probe.named_parameters() if trains[name]}
        holds = {name: names.get(id(tensor)) for name, tensor in _floating_state(self._probe).items()}
        self._layout = _layout(_floating_state(self._probe), holds)
        self._directions = self.canary_gradients(start.state_dict())
        free = None if data is None or len(self.y_c) > 1 else self._untouched_by(*data)
        self.free = None if free is None or not self._directions.unit(0)[free].any() else free

    def _loss(self, parameters: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Σ_i ℓ(θ; x_i, y_i) with the trained parameters ``parameters`` and the probe's other state."""
        logits = logits_of(lambda inputs: functional_call(self._probe, parameters, (inputs,)), x)
        return canary_losses(logits, y).sum()

    def _parameters(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The trained parameters at the model state ``state`` (a state dict of ``start``'s architecture)."""
        self._probe.load_state_dict(state)
        found = dict(self._probe.named_parameters())
        return {name: found[name].detach() for name in self._trained}

    def _untouched_by(self, x: np.ndarray, y: np.ndarray) -> torch.Tensor:
        """The trained parameters' coordinates where the gradient of every example of (x, y) at θ_0 is 0.

        The sum of the examples' gradients is 0 exactly there (a sum of nonzero gradients cancelling exactly is a
        coincidence of measure 0); buffers and frozen parameters are never in it.
        """
        parameters = self._parameters(self.start.state_dict())
        total = {name: torch.zeros_like(parameter, dtype=torch.float64) for name, parameter in parameters.items()}
        for i in range(0, len(x), 256):
            found = grad(self._loss)(
                parameters, torch.from_numpy(x[i : i + 256]), torch.from_numpy(np.asarray(y[i : i + 256]))
            )
            total = {name: total[name] + found[name].double() for name in total}
        free = torch.zeros(self._theta0.numel(), dtype=torch.bool)  # buffers and frozen parameters: never
        for where, name in self._layout:
            free[where] = total[name].flatten() == 0
        return free

    def canary_gradients(self, state: dict[str, torch.Tensor]) -> CanaryGradients:
        """Every canary's gradient ∇_θ ℓ(θ; x_c, y_c) at the model state ``state`` (a state dict of ``start``'s).

        Over the trained parameters, by ``vmap`` in chunks of at most 2^24 numbers; canary by canary where the model
        does not support ``vmap`` (the same numbers, slower).
        """
        parameters = self._parameters(state)
        per_canary = grad(lambda p, x, y: self._loss(p, x.unsqueeze(0), y.unsqueeze(0)))
        chunk = max(1, 2**24 // max(sum(parameter.numel() for parameter in parameters.values()), 1))
        try:  # chunk_size None: one batch, without the chunks' concatenation
            found = vmap(per_canary, in_dims=(None, 0, 0), chunk_size=chunk if chunk < len(self.y_c) else None)(
                parameters, self._x, self._y
            )
        except RuntimeError:  # an operation vmap has no batching rule for: the user's model is any module
            each = [per_canary(parameters, x, y) for x, y in zip(self._x, self._y)]
            found = {name: torch.stack([gradients[name] for gradients in each]) for name in parameters}
        return CanaryGradients.of(found, self._layout, self._theta0.numel())

    def steps(self) -> StepRecorder:
        """A fresh recorder of one training run's steps."""
        return StepRecorder(self)

    @torch.no_grad()
    def observe(self, trained: nn.Module, steps: StepRecorder | None = None) -> dict[str, list[float]]:
        """Every statistic of ``trained`` (a model of ``start``'s architecture), one value per canary.

        With the step statistics of ``steps``, the recorder a training function that takes ``on_step`` was given.
        """
        logits = logits_of(trained, self._x).double()
        change = _flat(_floating_state(trained).values()) - self._theta0
        found = {
            "canary-loss": (-canary_losses(logits, self._y)).tolist(),
            "logit-margin": logit_margins(logits, self._y).tolist(),
            "gradient-alignment": self._directions.alignments(change).tolist(),
        }
        if len(self.y_c) == 1:
            found |= {"update-norm": [float(change.norm())], "negative-update-norm": [-float(change.norm())]}
        if steps is not None:
            if not steps.alignments:
                raise UsageError(
                    "the training function takes on_step but called it after no update: call on_step(model) after"
                    " every optimizer step, or drop the argument"
                )
            found |= steps.statistics(self.claim)
        for name, statistic in self.user.items():
            found[name] = [
                float(statistic(self.start, trained, self.x_c[i : i + 1], self.y_c[i : i + 1]))
                for i in range(len(self.y_c))
            ]
        return found


class StepRecorder:
    """``on_step(model)`` for a training function that reports its steps.

    Each call reads the update since the previous one (module docstring: a_t and s_t) and follows every canary's
    gradient to the new parameters. With one canary (many-run) it also reads the update difference d_t.
    """

    def __init__(self, observer: Observer):
        self._observer = observer
        self._previous = observer._theta0
        self._directions = observer._directions
        self._change: torch.Tensor | None = None  # the previous step's update
        self.alignments: list[np.ndarray] = []  # a_t, (M,) each
        self.scales: list[float] = []
        self.differences: list[float] = []  # d_t, from the second step on (one canary only)

    @torch.no_grad()
    def __call__(self, model: nn.Module) -> None:
        # opacus's GradSampleModule holds the model as ._module: its state's names carry that prefix.
        model = getattr(model, "_module", model)
        theta = _flat(_floating_state(model).values())
        if theta.shape != self._previous.shape:
            raise UsageError(
                f"on_step got a model of {theta.numel()} floating-point numbers, the starting model has"
                f" {self._previous.numel()}: call on_step(model) with the model being trained"
            )
        change = theta - self._previous
        moved = change[change != 0].abs()
        if len(moved) == 0:  # nothing changed since the last call (e.g. called twice for one step)
            return
        self.alignments.append(self._directions.alignments(change))
        self.scales.append(_NORMAL_MAD * float(np.median(moved.numpy())))  # torch.median takes the lower middle
        if self._change is not None and len(self._observer.y_c) == 1:
            free = self._observer.free
            unit = self._directions.unit(0)
            restricted = unit if free is None else unit * free
            norm = float(restricted.norm())  # 0 where the canary's gradient has left the data-free coordinates
            self.differences.append(float(-((change - self._change) @ restricted)) / norm if norm > 0 else 0.0)
        self._previous, self._change = theta, change
        self._directions = self._observer.canary_gradients(model.state_dict())

    def statistics(self, claim: tuple[float, float] | None) -> dict[str, list[float]]:
        """The step statistics (module docstring), a value per canary; ``step-likelihood`` where ``claim`` gives (σ, q).

        ``step-noise-scale`` and ``step-difference`` are the model's, read with one canary only.
        """
        scales = np.array(self.scales)
        z = np.array(self.alignments) / scales[:, None]  # (T, M)
        found = {"step-alignment": z.sum(axis=0) / np.sqrt(len(z))}
        if claim is not None:
            sigma, q = claim
            # log(1 - q + q·e^x), x = z/σ - 1/(2σ²), without overflow at large z: logaddexp of the two terms.
            found["step-likelihood"] = np.logaddexp(np.log1p(-q), np.log(q) + z / sigma - 0.5 / sigma**2).sum(axis=0)
        if z.shape[1] == 1:
            found["step-noise-scale"] = np.array([-np.log(scales).min()])
            differences = np.array(self.differences) / scales[1:]
            found["step-difference"] = np.array([np.mean(differences**2) if len(z) > 1 else 0.0])
        return {name: values.tolist() for name, values in found.items()}

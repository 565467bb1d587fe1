"""The :class:`Mechanism` protocol between the batched engine and every mechanism of docs/theory.md §1."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from dpaudit.seeding import ModelRandomness


class PerExampleGradients(Protocol):
    """Per-example gradients of K models on a padded batch of width b, in whatever form the engine computed them.

    The engine picks the representation (materialised ``vmap(grad)`` tensors, or a Linear layer's input
    activations and output gradients, from which ``g_i = Σ_t δ_{i,t} x_{i,t}ᵀ`` is exact: one term for a vector
    per example, one per position t for a sequence, e.g. the transformer's); mechanisms use only these
    operations, so clipping is exact per example either way (docs/theory.md §1.5).
    """

    def squared_norms(self) -> torch.Tensor:
        """(K, b): ``‖g_i‖²`` summed over every trained tensor (the L2 norm over all trained parameters)."""

    def weighted_sum(self, coefficients: torch.Tensor) -> dict[str, torch.Tensor]:
        """``Σ_i c_i g_i`` per trained tensor, (K, ...), for coefficients (K, b)."""

    def add_weighted_sum(self, totals: dict[str, torch.Tensor], coefficients: torch.Tensor, scale: float) -> None:
        """``totals[name] += scale · Σ_i c_i g_i`` in place for every trained tensor.

        E.g. into the drawn DP noise:
        one pass over the weights fewer than summing, then adding.
        """

    def transformed_squared_norms(
        self, name: str, left: torch.Tensor | None, right: torch.Tensor | None
    ) -> torch.Tensor:
        """(K, b): ``‖L g_i R‖_F²`` for tensor ``name`` seen as a (d_out, rest) matrix.

        ``left`` L (K, p, d_out)
        and ``right`` R (K, rest, q) per model (None = identity); PRISM's intrinsic norms need them.
        """

    def materialise(self) -> dict[str, torch.Tensor]:
        """Every ``g_i``: (K, b, ...) per trained tensor."""


@dataclass(frozen=True)
class Step:
    """What the engine hands a mechanism at one optimisation step, for K models at once.

    ``gradients``: for a mechanism with ``per_example = False``, each trained tensor's name → its (K, ...)
    batch-mean gradient; with ``per_example = True``, a :class:`PerExampleGradients` whose example weights are
    ``weights`` (K, b) (0 marks padding: models' batches are padded to a common width b).
    ``expected_batch_size``: under Poisson sampling, ``q · N`` (docs/theory.md §1.5: the divisor of the clipped sum);
    None under shuffled batches. ``steps``: how many steps the run has (set by the engine), so that a mechanism
    knows whether another step follows (e.g. to draw its noise ahead); None when unknown. ``parameters``: the K
    models' trained tensors (K, ...) before this step, to read (shapes, dtype, device), never to change.
    """

    gradients: dict[str, torch.Tensor] | PerExampleGradients
    weights: torch.Tensor
    index: int
    expected_batch_size: float | None = None
    steps: int | None = None
    parameters: dict[str, torch.Tensor] | None = None

    @property
    def followed(self) -> bool:
        """Whether another step of the same run follows this one."""
        return self.steps is not None and self.index + 1 < self.steps

    def example_gradients(self) -> PerExampleGradients:
        """``gradients`` of a mechanism with ``per_example = True``; TypeError for batch-mean gradients."""
        if isinstance(self.gradients, dict):
            raise TypeError("this step holds batch-mean gradients: a clipping mechanism needs per_example = True")
        return self.gradients

    def mean_gradients(self) -> dict[str, torch.Tensor]:
        """``gradients`` of a mechanism with ``per_example = False``; TypeError for per-example gradients."""
        if not isinstance(self.gradients, dict):
            raise TypeError("this step holds per-example gradients: the mechanism has per_example = True")
        return self.gradients

    def poisson_batch_size(self) -> float:
        """``expected_batch_size`` of a Poisson step (q·N); TypeError under shuffled batches."""
        if self.expected_batch_size is None:
            raise TypeError("this step is not Poisson-sampled: the mechanism needs sampling = 'poisson'")
        return self.expected_batch_size

    def trained_tensors(self) -> dict[str, torch.Tensor]:
        """``parameters``, the trained tensors before this step; TypeError where the engine did not pass them."""
        if self.parameters is None:
            raise TypeError("this step carries no parameters (the engine sets Step.parameters)")
        return self.parameters


class Mechanism(Protocol):
    """A gradient transform / update rule for K shadow models trained together (docs/architecture.md §4).

    Required: ``name``, ``parameterization``, ``per_example``, :meth:`setup`, :meth:`transform`.

    Optional members (the engine reads them with ``getattr`` and these defaults, so a plain gradient transform
    needs none of them):

    * ``sampling = "shuffle"``: how batches are drawn. ``"shuffle"``: every member once per epoch in the model's
      own order (:func:`dpaudit.engine.shuffled_batches`); ``"poisson"``: each member independently with rate
      q per step (:func:`dpaudit.engine.poisson_batches`, docs/theory.md §1.5), and ``Step.expected_batch_size`` is set.
    * ``initialise(params, state) -> None``: overwrite the starting values of the trained (K, ...) tensors in
      place, once, before the first step (PRISM needs full-rank factors, [P] Thm 3.1).
    * ``update(params, step, state, learning_rate) -> None``: apply the step to the trained tensors in place
      instead of the engine's SGD optimiser (a mechanism that owns its update: PRISM's retraction, [P] Eq. 22).
      ``learning_rate`` is the schedule's current value; ``transform`` is then not called.
    * ``finish(params, state, learning_rate) -> None``: post-process the trained tensors in place once after the
      last step (the sketch's noise on the cumulative gradient, [S] Eq. 14); ``learning_rate`` is the base rate.
    """

    # Read-only properties: mechanisms are frozen dataclasses, and the engine only reads these.
    @property
    def name(self) -> str: ...

    @property
    def parameterization(self) -> str:
        """``"full"`` | ``"lora"`` | ``"lora-fa"`` (:data:`dpaudit.models.PARAMETERIZATIONS`)."""
        ...

    @property
    def per_example(self) -> bool:
        """Whether ``transform`` needs per-example gradients (clipping)."""
        ...

    def setup(self, shapes: dict[str, torch.Size], randomness: Sequence[ModelRandomness]) -> Any:
        """Draw the mechanism's per-model state (projections, noise generators) for models with these streams."""

    def transform(self, step: Step, state: Any) -> dict[str, torch.Tensor]:
        """The (K, ...) update direction the optimiser applies for this step."""

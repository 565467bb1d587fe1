"""The :class:`Mechanism` base class between the batched engine and every mechanism of docs/theory.md §1."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from dpaudit.mechanisms.privacy import PrivacyEvent, Training, Unknown

if (
    TYPE_CHECKING
):  # annotations only: the module loads without torch, as dpaudit.mechanisms.catalogue (imported by config) needs
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


class Mechanism:
    """A gradient transform / update rule for K shadow models trained together (docs/architecture.md §4).

    Subclass it (a frozen dataclass is the usual form) and give:

    * ``name``, ``parameterization`` (``"full"`` | ``"lora"`` | ``"lora-fa"``,
      :data:`dpaudit.models.PARAMETERIZATIONS`) and ``per_example`` (whether :meth:`transform` needs per-example
      gradients, e.g. to clip them) as attributes;
    * :meth:`setup` and :meth:`transform`;
    * :meth:`privacy`, the guarantee it claims in a run, from which :mod:`dpaudit.mechanisms.bounds` picks the
      accountant.

    The other members have defaults that leave the engine's plain SGD in charge; override those the mechanism
    needs:

    * ``sampling = "shuffle"``: how batches are drawn. ``"shuffle"``: every member once per epoch in the model's
      own order (:func:`dpaudit.training.sampling.shuffled_batches`); ``"poisson"``: each member independently with rate
      q per step (:func:`.sampling.poisson_batches`, docs/theory.md §1.5), and ``Step.expected_batch_size``
      is set (Poisson steps need ``per_example = True``).
    * :meth:`initialise`: overwrite the starting values of the trained tensors once, before the first step.
    * ``update = None``: the engine's SGD applies :meth:`transform`'s direction. A mechanism that owns its update
      (PRISM's retraction, [P] Eq. 22) defines the method ``update(params, step, state, learning_rate) -> None``,
      which changes the trained (K, ...) tensors in place with the schedule's current ``learning_rate``;
      :meth:`transform` is then not called.
    * :meth:`finish`: post-process the trained tensors once after the last step.
    """

    name: str
    parameterization: str
    per_example: bool
    sampling: str = "shuffle"
    update: Callable[[dict[str, torch.Tensor], Step, Any, float], None] | None = None

    def setup(self, shapes: dict[str, torch.Size], randomness: Sequence[ModelRandomness]) -> Any:
        """Draw the mechanism's per-model state (projections, noise generators) for models with these streams.

        Called once per training run, before :meth:`initialise`.

        Args:
            shapes: each trained tensor's name → its shape without the model axis.
            randomness: one :class:`~dpaudit.seeding.ModelRandomness` per model (K in all), the only source of the
                state's randomness, so that a model's draws do not depend on its chunk.

        Returns:
            The state, any object; the engine passes it back to every other hook unchanged. The default has none
            (None).
        """
        return None

    def transform(self, step: Step, state: Any) -> dict[str, torch.Tensor]:
        """The update direction the engine's optimiser applies for this step (not called when ``update`` is set).

        Args:
            step: the step's gradients of the K models (per-example or batch-mean, as ``per_example`` asks), their
                example weights (K, b), the step index and, under Poisson sampling, the expected batch size.
            state: what :meth:`setup` returned.

        Returns:
            Each trained tensor's name → its (K, ...) direction, set as the tensor's gradient for torch's SGD
            (which subtracts ``learning_rate`` times it, with momentum).
        """
        raise NotImplementedError(f"mechanism {self.name!r} defines neither transform() nor update()")

    def initialise(self, params: dict[str, torch.Tensor], state: Any) -> None:
        """Overwrite the trained tensors in place before the first step; the default keeps them.

        PRISM needs full-rank factors ([P] Thm 3.1). Runs under ``torch.no_grad()``.

        Args:
            params: each trained tensor's name → the K models' (K, ...) tensor, changed in place.
            state: what :meth:`setup` returned.
        """

    def finish(self, params: dict[str, torch.Tensor], state: Any, learning_rate: float) -> None:
        """Post-process the trained tensors in place after the last step; the default keeps them.

        The sketch adds its noise on the cumulative gradient here ([S] Eq. 14). Runs under ``torch.no_grad()``.

        Args:
            params: each trained tensor's name → the K models' (K, ...) tensor, changed in place.
            state: what :meth:`setup` returned.
            learning_rate: the base learning rate (``TrainingConfig.lr``), not the schedule's last one.
        """

    def privacy(self, training: Training) -> PrivacyEvent:
        """The guarantee this mechanism claims when it trains as ``training`` says (docs/theory.md §2.10).

        Called by the campaign's plan before any model trains; the event is written to privacy.json and
        :mod:`dpaudit.mechanisms.bounds` turns it into the analytic bound.

        Args:
            training: the run's facts: sample rate q and step count T of the engine's Poisson layout, and the
                adapted layers' shapes.

        Returns:
            A frozen privacy event of :mod:`dpaudit.mechanisms.privacy` (``SubsampledGaussian``,
            ``NoisyProjectionM2``, ``GaussianSketch``, ``NotDp`` or ``Unknown`` with the reason). The default claims
            none: :class:`~dpaudit.mechanisms.privacy.Unknown`.
        """
        return Unknown(f"mechanism {self.name!r} describes no privacy guarantee (Mechanism.privacy)")

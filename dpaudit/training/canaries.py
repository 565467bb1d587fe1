"""Gradient canaries (Nasr et al. 2023, arXiv 2302.07956): crafted per-example gradients the engine inserts.

A gradient canary is a gradient ``g_c = ‖g_c‖ u`` along a unit direction u of the trained tensors (all of them
together, as one vector). Whenever the canary is sampled into an IN model's batch, the engine appends ``g_c`` to
the step's per-example gradients as one more example (docs/theory.md §3.9): the mechanism clips it, sums it,
projects it, sketches it or lifts it like any real example's gradient, so its own transform acts on it and the
mechanism stays unaware of canaries. A mechanism that takes the batch-mean gradient (``per_example = False``)
gets it as one more example of the mean.

Sampling: under Poisson sampling a member canary is in each step's batch independently with rate q, under
shuffled batches once per epoch at a uniformly drawn step; both from the model's "gradient-canary" stream
(:mod:`dpaudit.seeding`), so a model's canary steps do not depend on its chunk.

Directions (``--canary-direction``):

* ``dirac`` (Nasr et al.): one coordinate of one trained tensor, chosen where real examples' gradients are as
  small as possible: the coordinates with the smallest mean squared per-example gradient on the public split,
  measured at the reference model's starting point (:func:`dirac_coordinates`). For digits' MLP these are the
  weights of the input pixels that are zero in every public image (their gradients are exactly 0, and those
  pixels are 0 in nearly all private images). M canaries take M distinct coordinates, so they are orthogonal.
* ``random``: one unit direction drawn from the campaign's "canary" stream, over all trained tensors.
* ``tangent`` (PRISM only, :class:`TangentCanary`): one rank-1 intrinsic gradient ``u vᵀ`` of the module that
  holds the Dirac rule's quietest coordinate, in the block ``col(A) × col(B)`` of the tangent space at each model's
  own start (PRISM draws every model's start factors from its own stream), the block where PRISM's adaptive rule
  gives a canary the largest per-step μ (docs/theory.md §3.9). Within the block, u and v are the directions of
  col(A) and col(B) where the real examples' weight gradients on the public split at the start have the least
  output-side (``Σ G Gᵀ``) and input-side (``Σ Gᵀ G``) energy. A Dirac's projection on the tangent space has
  norm ≈ (r/d)^{1/2}: PRISM never releases the rest.

Norm (``CampaignConfig.canary_norm``, no CLI flag): by default the clip norm C for clipping mechanisms, so
clipping leaves the canary whole, and 1 otherwise (the norm of a clipped example at the default C).

PRISM (docs/theory.md §3.9): its clip norm is the lifted intrinsic norm only for factor gradients of one
dense gradient G of the adapted weight, which a fixed factor-space canary is not. Its canaries are therefore
intrinsic gradients ``norm · u`` of a module's ``Z = lora_B lora_A`` (u a Dirac at a coordinate of the adapted
weight W, ranked by the real gradients ``∂ℓ/∂W``, or a random direction over the adapted weights), turned at every
step into the factor gradients a real example with that G has at the current factors
(:class:`AdaptedWeightCanaries`), or the ``tangent`` direction; they are observed through ``⟨Z, u⟩`` instead of
``⟨θ, u⟩``.

What the auditor sees (``--observe``): ``weights``, the projection ``⟨θ_T - θ_0, u⟩`` of the total change of the
trained tensors; ``steps``, every step's projection ``⟨g̃_t, u⟩`` of the released update direction (the
mechanism's ``transform`` output; for a mechanism that owns its update, ``⟨θ_t - θ_{t+1}, u⟩ / η_t``). Scores from
them: :mod:`attacks.white_box`.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dpaudit.errors import UsageError
from dpaudit.seeding import ModelRandomness
from dpaudit.training import engine
from dpaudit.training import gradients as example_gradients

# Public examples per block when measuring per-example gradients (bounds the materialised (1, b, ...) tensors).
_MEASURE_BLOCK = 256


@dataclass(frozen=True)
class DiracExampleGradients:
    """Per-example gradients of M Dirac canaries for K models: canary m is ``norm · e`` at one coordinate.

    ``tensors`` and ``indices`` (M,) say where canary m sits (a trained tensor's name and a flat index into it);
    ``shapes`` are every trained tensor's (K, ...) shape, in the engine's order. Every operation of
    :class:`dpaudit.mechanisms.base.PerExampleGradients` is exact without forming a dense gradient: sums are
    ``index_add`` of ``c_m · norm`` at each canary's coordinate, elementwise per model (so chunk-independent).
    """

    tensors: tuple[str, ...]
    indices: torch.Tensor  # (M,) int64 flat index into the canary's tensor
    norm: float
    shapes: dict[str, torch.Size]  # name → (K, ...)
    device: torch.device
    dtype: torch.dtype

    def _groups(self) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
        """(tensor name, canary ids, flat indices) for every trained tensor that holds canaries."""
        names = np.array(self.tensors)
        for name in self.shapes:
            ids = np.flatnonzero(names == name)
            if len(ids):
                ids_t = torch.from_numpy(ids).to(self.device)
                yield name, ids_t, self.indices[ids_t]

    def squared_norms(self) -> torch.Tensor:
        k = next(iter(self.shapes.values()))[0]
        return torch.full((k, len(self.tensors)), self.norm**2, device=self.device, dtype=self.dtype)

    def weighted_sum(self, coefficients: torch.Tensor) -> dict[str, torch.Tensor]:
        totals = {name: torch.zeros(shape, device=self.device, dtype=self.dtype) for name, shape in self.shapes.items()}
        self.add_weighted_sum(totals, coefficients, 1.0)
        return totals

    def add_weighted_sum(self, totals, coefficients, scale) -> None:
        for name, ids, flat in self._groups():
            total = totals[name]
            total.view(total.shape[0], -1).index_add_(1, flat, coefficients[:, ids] * self.norm, alpha=scale)

    def transformed_squared_norms(self, name, left, right) -> torch.Tensor:
        """``‖L (norm e_i e_jᵀ) R‖² = norm² ‖L e_i‖² ‖Rᵀ e_j‖²`` for a canary at (i, j) of ``name``, 0 elsewhere."""
        shape = self.shapes[name]
        rest = math.prod(shape[2:])
        result = torch.zeros(shape[0], len(self.tensors), device=self.device, dtype=self.dtype)
        for group, ids, flat in self._groups():
            if group != name:
                continue
            rows, columns = flat // rest, flat % rest
            value = torch.full((shape[0], len(ids)), self.norm**2, device=self.device, dtype=self.dtype)
            if left is not None:
                value = value * left[:, :, rows].square().sum(1)
            if right is not None:
                value = value * right[:, columns, :].square().sum(-1)
            result[:, ids] = value
        return result

    def materialise(self) -> dict[str, torch.Tensor]:
        m = len(self.tensors)
        dense = {}
        for name, shape in self.shapes.items():
            tensor = torch.zeros(shape[0], m, math.prod(shape[1:]), device=self.device, dtype=self.dtype)
            dense[name] = tensor
        for name, ids, flat in self._groups():
            dense[name][:, ids, flat] = self.norm
        return {name: dense[name].view(shape[0], m, *shape[1:]) for name, shape in self.shapes.items()}

    def project(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """(K, M): ``⟨tensors, e_m⟩``, the coordinate of each canary, for (K, ...) tensors."""
        k = next(iter(self.shapes.values()))[0]
        result = torch.zeros(k, len(self.tensors), device=self.device, dtype=self.dtype)
        for name, ids, flat in self._groups():
            result[:, ids] = tensors[name].reshape(k, -1)[:, flat].to(self.dtype)
        return result


@dataclass(frozen=True)
class DirectionExampleGradients(example_gradients.DenseExampleGradients):
    """One canary ``norm · u`` along a dense unit direction u, as (K, 1, ...) gradients (a stride-0 view over K)."""

    norm: float = 1.0

    def project(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """(K, 1): ``⟨tensors, u⟩`` for (K, ...) tensors."""
        total = functools.reduce(
            operator.add,
            (
                (tensors[name].double().flatten(1) * rows[:, 0].double().flatten(1)).sum(1)
                for name, rows in self.tensors.items()
            ),
        )
        return (total / self.norm).unsqueeze(1)


@dataclass(frozen=True)
class AdaptedWeightCanaries:
    """M canaries that are dense gradients of LoRA-adapted weights, for PRISM (module docstring).

    ``directions``: lora_A tensor name → (M, d_out, d_in) unit directions u_m in the space of the module's
    adapted weight (flattened), zero for a canary on another module, or (K, M, d_out, d_in), one per model
    (``tangent``: each model's own tangent space); the directions of all modules together have norm 1 per canary.
    Canary m's intrinsic gradient is ``∇_Z ℓ = norm · u_m`` (Z = ``lora_B lora_A``, [P]'s ``Z = A Bᵀ``;
    :class:`dpaudit.mechanisms.prism.PeftLoraAdapter`), i.e. the weight gradient
    ``G_m = norm · u_m / s`` of W = W_0 + s Z, s = ``scale``.
    """

    directions: dict[str, torch.Tensor]
    norm: float
    scale: float

    @staticmethod
    def _lora_B(a_name: str) -> str:
        return a_name.replace(".lora_A.", ".lora_B.")

    def factor_gradients(self, parameters: dict[str, torch.Tensor]) -> example_gradients.DenseExampleGradients:
        """(K, M, ...) per-example gradients: the factor gradients a real example with weight gradient G_m has.

        peft's chain rule at the current factors: ``∂ℓ/∂lora_B = s G_m lora_Aᵀ``, ``∂ℓ/∂lora_A = s lora_Bᵀ G_m``
        (``= (∇_Z ℓ) B`` and ``((∇_Z ℓ)ᵀ A)ᵀ`` in [P]'s notation), zero for every other trained tensor. PRISM's
        clip norm (Eq. 15 from these, :func:`~dpaudit.mechanisms.prism.tangent._tangent_sq_norms`) is then the
        canary's lifted intrinsic norm ``norm · ‖P(u_m)‖``, as for any real example.
        """
        first = next(iter(parameters.values()))
        k, m = first.shape[0], next(iter(self.directions.values())).shape[-3]
        tensors = {name: t.new_zeros(k, m, *t.shape[1:]) for name, t in parameters.items()}
        for a_name, direction in self.directions.items():
            b_name = self._lora_B(a_name)
            intrinsic = (self.norm * direction).to(first.device, first.dtype)  # s G_m
            lora_A, lora_B = parameters[a_name].flatten(2), parameters[b_name].flatten(2)
            g = _direction_subscripts(direction)
            tensors[b_name] = torch.einsum(f"{g},kri->kmor", intrinsic, lora_A).reshape(tensors[b_name].shape)
            tensors[a_name] = torch.einsum(f"kor,{g}->kmri", lora_B, intrinsic).reshape(tensors[a_name].shape)
        return example_gradients.DenseExampleGradients(tensors)

    def project(self, parameters: dict[str, torch.Tensor]) -> torch.Tensor:
        """(K, M): ``⟨Z, u_m⟩`` summed over the modules, Z = ``lora_B lora_A`` of each, in float64."""
        return functools.reduce(
            operator.add,
            (
                torch.einsum(
                    f"kor,kri,{_direction_subscripts(direction)}->km",
                    parameters[self._lora_B(a_name)].flatten(2).double(),
                    parameters[a_name].flatten(2).double(),
                    direction.to(parameters[a_name].device).double(),
                )
                for a_name, direction in self.directions.items()
            ),
        )


def _direction_subscripts(direction: torch.Tensor) -> str:
    """The einsum subscripts of adapted-weight directions: shared by K models (M, o, i) or per model (K, M, o, i)."""
    return "moi" if direction.ndim == 3 else "kmoi"


@dataclass(frozen=True)
class TangentCanary:
    """The ``tangent`` direction's recipe (module docstring): one module, and its real gradients' energy there.

    ``module``: the module's lora_A tensor name. ``output_gram`` (d_out, d_out) ``Σ_n G_n G_nᵀ`` and
    ``input_gram`` (d_in, d_in) ``Σ_n G_nᵀ G_n`` over the public examples' weight gradients G_n at the start.
    """

    module: str
    output_gram: torch.Tensor
    input_gram: torch.Tensor

    def directions(self, lora_A: torch.Tensor, lora_B: torch.Tensor) -> torch.Tensor:
        """(K, 1, d_out, d_in) float64 unit ``u vᵀ`` per model, from its (K, r, d_in) lora_A, (K, d_out, r) lora_B.

        ``Z = lora_B lora_A`` ([P]'s ``A Bᵀ`` with ``A = lora_B``, ``B = lora_Aᵀ``): u is the unit vector of
        col(A) minimising ``uᵀ Σ G Gᵀ u``, v that of col(B) minimising ``vᵀ Σ Gᵀ G v``; ``u vᵀ = Π_A (u vᵀ) Π_B``
        lies in the tangent space. PRISM zero-pads a layer narrower than r (:func:`dpaudit.mechanisms.prism.
        prism_rank`): the bases keep only the factors' nonzero singular directions.
        """
        u = self._quietest(lora_B.double(), self.output_gram)
        v = self._quietest(lora_A.double().mT, self.input_gram)
        return (u.unsqueeze(-1) * v.unsqueeze(-2)).unsqueeze(1)

    @staticmethod
    def _quietest(factor: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
        """(K, d): per model the unit vector of col(factor) (factor (K, d, r)) with the least energy under ``gram``."""
        basis, singular, _ = torch.linalg.svd(factor, full_matrices=False)
        rank = int((singular[0] > singular[0, 0] * 1e-6).sum())
        basis = basis[..., :rank]
        _, vectors = torch.linalg.eigh(basis.mT @ gram.to(basis) @ basis)  # ascending eigenvalues
        return (basis @ vectors[..., :1]).squeeze(-1)


@dataclass(frozen=True)
class GradientCanaries:
    """The campaign's M gradient canaries of norm ``norm``: Dirac coordinates, or one dense unit direction.

    ``coordinates``: (tensor name, flat index) per canary (``dirac``), or None; ``direction``: name → tensor of
    the trained tensor's shape, all together of norm 1 (``random``, M = 1), or None; ``tangent``: the
    ``tangent`` direction's recipe (M = 1; PRISM), made at each model's start, or None. Exactly one is given.
    ``lora_scale`` s (PRISM; None otherwise): the canaries are gradients of adapted weights (module docstring),
    named by their module's lora_A tensor, a coordinate's flat index and a direction's shape in the module's
    (d_out, d_in) weight.
    """

    norm: float
    coordinates: tuple[tuple[str, int], ...] | None = None
    direction: dict[str, torch.Tensor] | None = None
    lora_scale: float | None = None
    tangent: TangentCanary | None = None

    @property
    def count(self) -> int:
        return 1 if self.coordinates is None else len(self.coordinates)

    def examples(
        self, parameters: dict[str, torch.Tensor]
    ) -> DiracExampleGradients | DirectionExampleGradients | AdaptedWeightCanaries:
        """The canaries for K models with (K, ...) trained ``parameters``: their per-example gradients (K, M, ...).

        Adapted-weight canaries (``lora_scale``) depend on the factors: :meth:`AdaptedWeightCanaries.factor_gradients`
        gives them at each step.
        """
        first = next(iter(parameters.values()))
        if self.lora_scale is not None:
            return AdaptedWeightCanaries(self._weight_directions(parameters), self.norm, self.lora_scale)
        if self.coordinates is not None:
            names, flat = zip(*self.coordinates)
            return DiracExampleGradients(
                tuple(names),
                torch.tensor(flat, dtype=torch.int64, device=first.device),
                self.norm,
                {name: t.shape for name, t in parameters.items()},
                first.device,
                first.dtype,
            )
        if self.direction is None:
            raise ValueError("GradientCanaries needs coordinates or a direction")
        k = first.shape[0]
        rows = {
            name: (self.norm * self.direction[name]).to(first.device, first.dtype).expand(k, 1, *t.shape[1:])
            for name, t in parameters.items()
        }
        return DirectionExampleGradients(rows, self.norm)

    def _weight_directions(self, parameters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """lora_A name → (M, d_out, d_in) (or per model (K, M, ...)) float64 unit directions in that module's weight."""
        if self.tangent is not None:
            a_name = self.tangent.module
            lora_A = parameters[a_name].flatten(2)
            lora_B = parameters[AdaptedWeightCanaries._lora_B(a_name)].flatten(2)
            return {a_name: self.tangent.directions(lora_A, lora_B)}
        if self.direction is not None:
            return {name: u.double().unsqueeze(0) for name, u in self.direction.items()}
        if self.coordinates is None:
            raise ValueError("GradientCanaries needs coordinates or a direction")
        directions: dict[str, torch.Tensor] = {}
        for m, (a_name, flat) in enumerate(self.coordinates):
            if a_name not in directions:
                d_out = parameters[AdaptedWeightCanaries._lora_B(a_name)].flatten(2).shape[1]
                d_in = parameters[a_name].flatten(2).shape[2]
                directions[a_name] = torch.zeros(self.count, d_out, d_in, dtype=torch.float64)
            directions[a_name][m].view(-1)[flat] = 1.0
        return directions


def inclusion_schedule(
    membership: np.ndarray,
    randomness: Sequence[ModelRandomness],
    sample_rate: float | None,
    steps_per_epoch: int,
    epochs: int,
) -> Iterator[np.ndarray]:
    """Per step: (K, M) float32, 1 where model k's batch holds canary m (only canaries it is a member of).

    Poisson (``sample_rate`` q): each canary independently with rate q per step. Shuffled (``sample_rate`` None):
    once per epoch, at a step drawn uniformly. Draws come from each model's "gradient-canary" stream, made for
    every canary whether the model is a member or not, so a model's draws depend on (seed, index) only.
    """
    rngs = [model.numpy("gradient-canary") for model in randomness]
    count = membership.shape[1]
    for _ in range(epochs):
        if sample_rate is None:
            chosen = np.stack([rng.integers(steps_per_epoch, size=count) for rng in rngs])
            for step in range(steps_per_epoch):
                yield ((chosen == step) & membership).astype(np.float32)
        else:
            for _ in range(steps_per_epoch):
                drawn = np.stack([rng.random(count) < sample_rate for rng in rngs])
                yield (drawn & membership).astype(np.float32)


OBSERVATIONS = ("weights", "steps")


class CanaryRun:
    """A chunk's gradient canaries during :func:`dpaudit.training.engine.train`: inserted into its steps, observed.

    ``membership`` (K, M): which canaries each model is IN for. ``observe``: ``weights`` records the total change
    ``⟨θ_T - θ_0, u_m⟩`` ((K, 1, M) after :meth:`finish`), ``steps`` every step's ``⟨g̃_t, u_m⟩`` ((K, T, M)).
    """

    def __init__(self, canaries: GradientCanaries, membership: np.ndarray, observe: str):
        if observe not in OBSERVATIONS:
            raise ValueError(f"observe must be one of {', '.join(OBSERVATIONS)}, got {observe!r}")
        if membership.ndim != 2 or membership.shape[1] != canaries.count:
            raise ValueError(f"canary membership has shape {membership.shape}, expected (models, {canaries.count})")
        self.canaries, self.membership, self.observe = canaries, membership.astype(bool), observe
        self._steps: list[torch.Tensor] = []

    def start(
        self,
        params: dict[str, torch.Tensor],
        randomness: Sequence[ModelRandomness],
        sample_rate: float | None,
        steps_per_epoch: int,
        epochs: int,
    ) -> None:
        """Before the first step, after the mechanism's ``initialise``: θ_0's projections and the schedule."""
        self.examples = self.canaries.examples(params)
        self._params = params  # the engine updates these in place: adapted-weight canaries are read at each step
        self._schedule = inclusion_schedule(self.membership, randomness, sample_rate, steps_per_epoch, epochs)
        self._last = self.examples.project(params).double()
        self._initial = self._last

    def insert(self, gradients, weights: torch.Tensor, per_example: bool):
        """The step's gradients and example weights with this step's canaries appended.

        Per example: the canaries are one more block of examples (weight 1 where sampled, 0 elsewhere). Batch mean
        (K, ...): each sampled canary is one more example of the mean, ``(n ḡ + Σ g_c) / (n + c)``; a model with
        no canary in this step keeps its mean bit for bit.
        """
        included = torch.from_numpy(next(self._schedule)).to(weights.device)
        examples = (
            self.examples.factor_gradients(self._params)
            if isinstance(self.examples, AdaptedWeightCanaries)
            else self.examples
        )
        if per_example:
            if isinstance(gradients, example_gradients.BlockedExampleGradients):
                blocks, widths = gradients.blocks, gradients.widths
            else:
                blocks, widths = (gradients,), (weights.shape[1],)
            return (
                example_gradients.BlockedExampleGradients((*blocks, examples), (*widths, self.canaries.count)),
                torch.cat([weights, included], dim=1),
            )
        count, added = weights.sum(1), included.sum(1)
        sums = examples.weighted_sum(included)
        mixed = {}
        for name, mean in gradients.items():
            shape = (-1,) + (1,) * (mean.ndim - 1)
            extended = (mean * count.view(shape) + sums[name]) / (count + added).view(shape)
            mixed[name] = torch.where(added.view(shape) > 0, extended, mean)
        return mixed, weights

    def record(self, direction: dict[str, torch.Tensor] | None, params: dict[str, torch.Tensor], lr: float) -> None:
        """After a step: record its released direction's projections (``steps``).

        ``direction`` is None for a mechanism that owns its update: its direction is then read from the change of
        the parameters, ``(θ_t - θ_{t+1}) / η_t``.
        """
        if self.observe != "steps":
            return
        if direction is not None:
            self._steps.append(self.examples.project(direction).double())
            return
        now = self.examples.project(params).double()
        self._steps.append((self._last - now) / lr)
        self._last = now

    def finish(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """(K, S, M) float64 observations: S = 1 (``weights``: ⟨θ_T - θ_0, u⟩) or T (``steps``)."""
        if self.observe == "steps":
            return torch.stack(self._steps, dim=1)
        return (self.examples.project(params).double() - self._initial).unsqueeze(1)


def choose(
    reference: engine.ShadowModels,
    x: np.ndarray,
    y: np.ndarray,
    direction: str,
    count: int,
    norm: float,
    rng: np.random.Generator,
    lora_scale: float | None = None,
) -> GradientCanaries:
    """A campaign's ``count`` canaries of norm ``norm``: Dirac coordinates, a random or a tangent direction.

    ``reference``: the attacker's reference model at its start, ranking the Dirac coordinates on the public (x, y);
    ``rng`` draws a random direction. ``lora_scale`` s (PRISM): the canaries live in the adapted weights of the
    LoRA modules, W = W_0 + s ``lora_B lora_A``; the Dirac rule then ranks the coordinates of ``∂ℓ/∂W`` at the
    start (peft's ``lora_B = 0``, so the gradients of the base weights W_0). ``tangent`` (module docstring) needs
    ``lora_scale``: its module is the one of the quietest Dirac coordinate, its grams are those of ``∂ℓ/∂W``.
    """
    if direction == "tangent" and lora_scale is None:
        raise UsageError(
            "--canary-direction tangent lies in the tangent space of LoRA factors that the mechanism updates as"
            " Z = B A (--mechanism prism); this mechanism has none: use --canary-direction dirac or random"
        )
    frozen, trainable, names = reference.frozen, reference.trainable, {}
    if lora_scale is not None:
        names = {
            name.split(".lora_A.")[0] + ".base_layer.weight": name for name in reference.trainable if ".lora_A." in name
        }
        frozen = {**{name: t for name, t in frozen.items() if name not in names}, **trainable}
        trainable = {name: reference.frozen[name] for name in names}
    if direction == "random":
        shapes = {name: t.shape[1:] if lora_scale is None else t[0].flatten(1).shape for name, t in trainable.items()}
        unit = random_direction(shapes, rng)
        return GradientCanaries(
            norm, direction={names.get(name, name): u for name, u in unit.items()}, lora_scale=lora_scale
        )
    coordinates = dirac_coordinates(reference.module, frozen, trainable, x, y, count)
    if direction == "tangent":
        weight = coordinates[0][0]
        output_gram, input_gram = _gradient_grams(reference.module, frozen, trainable, weight, x, y)
        return GradientCanaries(
            norm, lora_scale=lora_scale, tangent=TangentCanary(names[weight], output_gram, input_gram)
        )
    return GradientCanaries(
        norm, coordinates=tuple((names.get(name, name), flat) for name, flat in coordinates), lora_scale=lora_scale
    )


def random_direction(shapes: dict[str, torch.Size], rng: np.random.Generator) -> dict[str, torch.Tensor]:
    """A uniformly random unit direction over all trained tensors (shapes without K), float64 normals normalised."""
    normals = {name: rng.standard_normal(tuple(shape)) for name, shape in shapes.items()}
    norm = math.sqrt(sum(float(np.square(v).sum()) for v in normals.values()))
    return {name: torch.from_numpy(v / norm).float() for name, v in normals.items()}


def dirac_coordinates(
    module: torch.nn.Module,
    frozen: dict[str, torch.Tensor],
    trainable: dict[str, torch.Tensor],
    x: np.ndarray,
    y: np.ndarray,
    count: int,
) -> tuple[tuple[str, int], ...]:
    """The ``count`` coordinates of the trained tensors where real gradients are smallest (module docstring).

    ``frozen`` and ``trainable`` are one model's (1, ...) starting tensors (:func:`.engine.build`); the mean
    squared per-example gradient over the public examples (x, y) ranks every coordinate, ties by tensor order then
    flat index. A tensor whose gradient is zero for every public example at the start (LoRA's A while B = 0) is
    left out: its coordinates only look quiet until training moves B.
    """
    moments = {name: torch.zeros(t.shape[1:], dtype=torch.float64) for name, t in trainable.items()}
    for dense in _public_example_gradients(module, frozen, trainable, x, y):
        for name, g in dense.items():
            moments[name] += g.square().sum(0)
    eligible = [name for name, moment in moments.items() if bool((moment > 0).any())]
    available = sum(moments[name].numel() for name in eligible)
    if count > available:
        raise UsageError(
            f"--canaries {count} exceeds the {available} coordinates of the trained tensors that real gradients"
            f" reach ({', '.join(eligible)}): orthogonal Dirac canaries need one coordinate each; use --canaries"
            f" <= {available}"
        )
    values = np.concatenate([moments[name].flatten().numpy() for name in eligible])
    tensor_of = np.concatenate([np.full(moments[name].numel(), i) for i, name in enumerate(eligible)])
    flat = np.concatenate([np.arange(moments[name].numel()) for name in eligible])
    order = np.lexsort((flat, tensor_of, values))[:count]
    return tuple((eligible[int(tensor_of[i])], int(flat[i])) for i in order)


def _public_example_gradients(
    module: torch.nn.Module,
    frozen: dict[str, torch.Tensor],
    trainable: dict[str, torch.Tensor],
    x: np.ndarray,
    y: np.ndarray,
) -> Iterator[dict[str, torch.Tensor]]:
    """Per block of public examples: name → (b, ...) float64 per-example gradients of one model's ``trainable``."""
    gradients = example_gradients.example_gradient_function(module, list(trainable))
    with torch.no_grad():
        for start in range(0, len(y), _MEASURE_BLOCK):
            xb = torch.from_numpy(x[start : start + _MEASURE_BLOCK]).unsqueeze(0)
            yb = torch.from_numpy(y[start : start + _MEASURE_BLOCK]).unsqueeze(0)
            dense = gradients(trainable, frozen, xb, yb, torch.ones(yb.shape)).materialise()
            yield {name: g[0].double().cpu() for name, g in dense.items()}


def _gradient_grams(
    module: torch.nn.Module,
    frozen: dict[str, torch.Tensor],
    trainable: dict[str, torch.Tensor],
    name: str,
    x: np.ndarray,
    y: np.ndarray,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Σ_n G_n G_nᵀ, Σ_n G_nᵀ G_n)`` of tensor ``name``'s per-example gradients G_n (flattened to 2-D) on (x, y)."""
    shape = trainable[name][0].flatten(1).shape
    output_gram = torch.zeros(shape[0], shape[0], dtype=torch.float64)
    input_gram = torch.zeros(shape[1], shape[1], dtype=torch.float64)
    others = {other: t for other, t in trainable.items() if other != name}
    for dense in _public_example_gradients(module, {**frozen, **others}, {name: trainable[name]}, x, y):
        g = dense[name].flatten(2)
        output_gram += torch.einsum("noi,npi->op", g, g)
        input_gram += torch.einsum("noi,noj->ij", g, g)
    return output_gram, input_gram

"""Batched shadow-model training: K models at once on stacked parameters (torch.func).

Each model is the same module evaluated with its own tensors through ``functional_call``; ``vmap`` runs all K
in one pass. The frozen pretrained base is one tensor seen by every model through a stride-0 view, never copied
K times. Every model has its own membership row, data order and mechanism randomness (:mod:`dpaudit.seeding`),
so a model's result does not depend on which other models it is trained with.
"""

from __future__ import annotations

import copy
import functools
import math
import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from dpaudit import background
from dpaudit import models as model_lib
from dpaudit.config import SCHEDULES
from dpaudit.errors import UsageError
from dpaudit.mechanisms.base import Mechanism, PerExampleGradients, Step
from dpaudit.seeding import ModelRandomness

if TYPE_CHECKING:
    from dpaudit.canaries import CanaryRun


@dataclass(frozen=True)
class TrainingConfig:
    """SGD with momentum; ``cosine`` anneals to ``min_lr`` over all steps ([W] App. F.1)."""

    epochs: int = 30
    batch_size: int = 32
    lr: float = 0.1
    momentum: float = 0.9
    schedule: str = "cosine"
    min_lr: float = 1e-4

    def __post_init__(self):
        if self.epochs < 1:
            raise UsageError(f"--epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise UsageError(f"--batch-size must be >= 1, got {self.batch_size}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise UsageError(f"--lr must be a positive number, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise UsageError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.schedule not in SCHEDULES:
            raise UsageError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")


@dataclass
class ShadowModels:
    """K models of one architecture: ``module`` evaluated with ``frozen[k]`` ∪ ``trainable[k]``.

    Both are stacked with a leading model dimension K. ``frozen`` holds the pretrained base (one tensor, seen by
    every model through a stride-0 view) and per-model frozen tensors (e.g. LoRA-FA's ``lora_A``).
    ``canary_observations``: what :func:`train` observed of its gradient canaries (:mod:`dpaudit.canaries`), if any.
    """

    module: nn.Module
    frozen: dict[str, torch.Tensor]
    trainable: dict[str, torch.Tensor]
    canary_observations: torch.Tensor | None = None

    @property
    def n_models(self) -> int:
        return next(iter(self.trainable.values())).shape[0]


def build(
    base: nn.Module,
    parameterization: str,
    lora: model_lib.LoraSpec | None,
    randomness: Sequence[ModelRandomness],
    device: torch.device,
) -> ShadowModels:
    """K = len(randomness) copies of the pretrained ``base`` ready to fine-tune with ``parameterization``.

    LoRA factors start as in [W] App. E: ``lora_A`` i.i.d. N(0, 1/r) from each model's "init" stream (frozen
    under ``lora-fa``, trained under ``lora``), ``lora_B = 0`` so every model starts at the base function.
    """
    if parameterization not in model_lib.PARAMETERIZATIONS:
        raise UsageError(
            f"unknown parameterization {parameterization!r}: use one of {', '.join(model_lib.PARAMETERIZATIONS)}"
        )
    k = len(randomness)
    if parameterization == "full":
        module = base
        weights = {f"{name}.weight" for name in model_lib.adapted_layers(base)}
        tensors = {name: p.detach().to(device) for name, p in base.named_parameters()}
        trainable = {name: t.expand(k, *t.shape).clone() for name, t in tensors.items() if name in weights}
        base_views = {name: _per_model_view(t, k) for name, t in tensors.items() if name not in weights}
        return ShadowModels(module, base_views, trainable)
    if lora is None:
        raise UsageError(f"parameterization {parameterization!r} needs a LoRA rank")
    module = model_lib.attach_lora(base, lora)
    tensors = {name: p.detach() for name, p in module.named_parameters()}
    a_names = [name for name in tensors if ".lora_A." in name]
    generators = [model.torch("init") for model in randomness]
    lora_a = {
        name: torch.stack([model_lib.draw_lora_a(tuple(tensors[name].shape), lora.rank, g) for g in generators]).to(
            device, tensors[name].dtype
        )
        for name in a_names
    }
    # Each model's stream yields its factors in layer order, as in WishartProjection.setup: both realisations of
    # LoRA-FA (docs/theory.md §1.2) share A.
    lora_b = {
        name: torch.zeros(k, *t.shape, device=device, dtype=t.dtype)
        for name, t in tensors.items()
        if ".lora_B." in name
    }
    base_views = {name: _per_model_view(t.to(device), k) for name, t in tensors.items() if ".lora_" not in name}
    if parameterization == "lora-fa":
        return ShadowModels(module, {**base_views, **lora_a}, lora_b)
    return ShadowModels(module, base_views, {**lora_a, **lora_b})


def _per_model_view(tensor: torch.Tensor, k: int) -> torch.Tensor:
    """The frozen base as a (K, ...) stride-0 view: every model gets it without a copy.

    Passing it per model (in_dims=0) rather than once (in_dims=None) costs ~4% speed and keeps each model's
    arithmetic independent of K: with in_dims=None, vmap fuses the K models' rows into one large GEMM whose
    blocking, and so rounding, changes with K (seen: a model's canary logits changed in the last bits with the
    chunk size).
    """
    return tensor.expand(k, *tensor.shape)


@dataclass(frozen=True)
class BatchLayout:
    """Steps per epoch and padded batch width, fixed by the largest member count of the whole campaign.

    Every model's epoch is ``steps`` batches of its own members, spread evenly (sizes differ by at most one) and
    padded with weight-0 slots to ``width``. Deriving both from the campaign (not from the models trained
    together) keeps each model's arithmetic independent of chunking. ``members`` (that largest count) also
    fixes the Poisson sampling rate of DP mechanisms (:class:`PoissonLayout`).
    """

    steps: int
    width: int
    members: int | None = None

    @classmethod
    def for_members(cls, max_members: int, batch_size: int) -> BatchLayout:
        steps = math.ceil(max_members / batch_size)
        return cls(steps, math.ceil(max_members / steps), max_members)


# Per model and step, the chance that a Poisson batch does not fit the first block (the chunk then adds blocks).
_FIRST_BLOCK_OVERFLOW = 1e-3


@dataclass(frozen=True)
class PoissonLayout:
    """Poisson sampling of DP mechanisms (docs/theory.md §1.5), fixed by the campaign, never by the models in a chunk.

    ``N`` = the campaign's largest member count (:attr:`BatchLayout.members`) and ``b`` = the expected batch
    size: rate ``q = b / N``, ``steps = ⌈N / b⌉`` per epoch (as many as shuffled batches, so that an epoch visits
    each member once in expectation), and the clipped sum is divided by ``b = q N``.

    A step is computed in blocks of fixed widths, so that every GEMM a model takes part in has the same shape
    whatever its chunk (a GEMM's rounding can depend on its row count: torch's bmm, e.g., switches kernels with
    size): a first block of ``width`` slots (the Binomial(N, q) quantile exceeded with probability 1e-3 per model
    and step), then, while the chunk's largest batch does not fit, blocks of ``overflow_width`` (about one
    standard deviation). Padding slots have weight 0, so a block of padding only adds exact zeros. This keeps
    chunk independence at ~1.6x the mean batch of arithmetic, where one worst-case width (1e-9) cost ~2.2x.
    """

    sample_rate: float
    steps: int
    expected_batch_size: int
    width: int
    overflow_width: int

    @classmethod
    def for_members(cls, max_members: int, expected_batch_size: int) -> PoissonLayout:
        from scipy.stats import binom

        if expected_batch_size > max_members:
            raise UsageError(
                f"--batch-size {expected_batch_size} exceeds the {max_members} training examples of a "
                f"shadow model: the Poisson rate q = batch size / examples must be <= 1"
            )
        rate = expected_batch_size / max_members
        width = max(1, int(binom.isf(_FIRST_BLOCK_OVERFLOW, max_members, rate)))  # P(batch > width) <= 1e-3
        overflow_width = max(1, math.ceil(math.sqrt(max_members * rate * (1 - rate))))
        return cls(rate, math.ceil(max_members / expected_batch_size), expected_batch_size, width, overflow_width)

    def blocks(self, largest_batch: int) -> list[slice]:
        """The slots of each block of a step whose largest batch has ``largest_batch`` examples."""
        extra = math.ceil(max(0, largest_batch - self.width) / self.overflow_width)
        return [slice(0, self.width)] + [
            slice(self.width + j * self.overflow_width, self.width + (j + 1) * self.overflow_width)
            for j in range(extra)
        ]

    @classmethod
    def for_batch_layout(cls, layout: BatchLayout, expected_batch_size: int) -> PoissonLayout:
        if layout.members is None:
            raise ValueError(
                "Poisson sampling needs the campaign's member count: build the layout with BatchLayout.for_members"
            )
        return cls.for_members(layout.members, expected_batch_size)


def shuffled_batches(
    membership: np.ndarray, randomness: Sequence[ModelRandomness], layout: BatchLayout, epochs: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per step: pool indices (K, width) and example weights (K, width), each model in its own shuffled order.

    Model k visits each of its members (``membership[k]``) once per epoch, in an order from its "data" stream.
    """
    members = [np.flatnonzero(row) for row in membership]
    if any(len(m) == 0 for m in members):
        raise UsageError("a shadow model has no training examples: check the membership plan")
    if max(map(len, members)) > layout.steps * layout.width:
        raise ValueError("batch layout too small for the membership plan")
    rngs = [model.numpy("data") for model in randomness]
    for _ in range(epochs):
        index = np.zeros((len(members), layout.steps, layout.width), dtype=np.int64)
        weight = np.zeros((len(members), layout.steps, layout.width), dtype=np.float32)
        for k, (rows, rng) in enumerate(zip(members, rngs)):
            for s, batch in enumerate(np.array_split(rng.permutation(rows), layout.steps)):
                index[k, s, : len(batch)] = batch
                weight[k, s, : len(batch)] = 1.0
        for s in range(layout.steps):
            yield index[:, s], weight[:, s]


def poisson_batches(
    membership: np.ndarray, randomness: Sequence[ModelRandomness], layout: PoissonLayout, epochs: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per step: pool indices (K, w) and example weights (K, w) of Poisson-sampled batches (docs/theory.md §1.5).

    Each member of model k is included independently with probability ``layout.sample_rate``, drawn from k's
    "data" stream (one uniform per member and step), so a model's batches do not depend on its chunk. Each step
    is padded with weight-0 slots to the end of the last block it needs (:meth:`PoissonLayout.blocks`).
    """
    members = [np.flatnonzero(row) for row in membership]
    if any(len(m) == 0 for m in members):
        raise UsageError("a shadow model has no training examples: check the membership plan")
    rngs = [model.numpy("data") for model in randomness]
    for _ in range(epochs * layout.steps):
        batches = [rows[rng.random(len(rows)) < layout.sample_rate] for rows, rng in zip(members, rngs)]
        sizes = np.array([len(batch) for batch in batches])
        sampled = np.arange(layout.blocks(sizes.max())[-1].stop) < sizes[:, None]
        index = np.zeros(sampled.shape, dtype=np.int64)
        index[sampled] = np.concatenate(batches)
        yield index, sampled.astype(np.float32)


def _loss_functions(module: nn.Module):
    """Weighted batch-mean and single-example losses as functions of (trainable, frozen, data).

    The loss is the module's task's (:func:`dpaudit.models.task_of`).
    """
    task = model_lib.task_of(module)

    def batch_loss(trainable, frozen, x, y, w):
        logits = functional_call(module, {**frozen, **trainable}, (x,))
        losses = model_lib.example_losses(task, logits, y)
        return (w * losses).sum() / w.sum().clamp(min=1.0)

    def example_loss(trainable, frozen, x, y):
        logits = functional_call(module, {**frozen, **trainable}, (x.unsqueeze(0),))
        return model_lib.mean_loss(task, logits, y.unsqueeze(0))

    return batch_loss, example_loss


def gradient_function(module: nn.Module, per_example: bool) -> Callable:
    """(trainable, frozen, x, y, w) → gradients for K models: (K, ...) or per example (K, b, ...)."""
    batch_loss, example_loss = _loss_functions(module)
    if not per_example:
        return vmap(grad(batch_loss), in_dims=(0, 0, 0, 0, 0))
    per_model = vmap(grad(example_loss), in_dims=(None, None, 0, 0))
    models = vmap(per_model, in_dims=(0, 0, 0, 0))
    return lambda trainable, frozen, x, y, w: models(trainable, frozen, x, y)


@dataclass(frozen=True)
class DenseExampleGradients:
    """Materialised per-example gradients: each trained tensor's name → (K, b, ...) (``vmap(grad)``)."""

    tensors: dict[str, torch.Tensor]

    def squared_norms(self) -> torch.Tensor:
        return functools.reduce(operator.add, (g.flatten(2).square().sum(-1) for g in self.tensors.values()))

    def weighted_sum(self, coefficients: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: torch.einsum("kb,kb...->k...", coefficients, g) for name, g in self.tensors.items()}

    def add_weighted_sum(self, totals, coefficients, scale) -> None:
        for name, value in self.weighted_sum(coefficients).items():
            totals[name].add_(value, alpha=scale)

    def transformed_squared_norms(self, name, left, right) -> torch.Tensor:
        matrices = self.tensors[name].flatten(3)
        if left is not None:
            matrices = left.unsqueeze(1) @ matrices
        if right is not None:
            matrices = matrices @ right.unsqueeze(1)
        return matrices.square().sum((-2, -1))

    def materialise(self) -> dict[str, torch.Tensor]:
        return self.tensors


_POSITION_SAFE_ROWS = 8  # row counts whose batched GEMMs do not depend on a model's position (see _per_model_products)


@dataclass(frozen=True)
class LinearExampleGradients:
    """Per-example gradients of Linear weights in factored form: ``g_i = δ_i x_iᵀ`` (Goodfellow 2015).

    ``inputs[name]`` (K, b, d_in) are the layer's inputs and ``output_gradients[name]`` (K, b, d_out) the
    gradients of the per-example loss with respect to its outputs, so ``‖g_i‖² = ‖δ_i‖² ‖x_i‖²`` and
    ``Σ_i c_i g_i = (c δ)ᵀ x`` are exact without forming any (K, b, d_out, d_in) tensor. A layer that sees a
    sequence per example has (K, b, T, d_in) inputs and (K, b, T, d_out) output gradients, and
    ``g_i = Σ_t δ_{i,t} x_{i,t}ᵀ``: sums run over positions as over examples, and norms need the positions'
    Gram matrices or ``g_i`` itself (:func:`_summed_outer_squared_norms`).
    """

    inputs: dict[str, torch.Tensor]
    output_gradients: dict[str, torch.Tensor]

    def squared_norms(self) -> torch.Tensor:
        return functools.reduce(
            operator.add,
            (
                (
                    torch.linalg.vector_norm(self.output_gradients[name], dim=-1) * torch.linalg.vector_norm(x, dim=-1)
                ).square()
                if x.ndim == 3
                else _summed_outer_squared_norms(self.output_gradients[name], x)
                for name, x in self.inputs.items()
            ),
        )

    def weighted_sum(self, coefficients: torch.Tensor) -> dict[str, torch.Tensor]:
        sums = {}
        for name in self.inputs:
            left, right = self._sum_factors(name, coefficients)
            # MKL forms K wide products 3-4x faster than K tall ones (K = 64: 8×128 from 50 examples in 0.13 ms,
            # 128×8 in 0.55 ms): a tall sum (LoRA's B) is formed transposed, then laid out as usual.
            tall = left.shape[-2] > right.shape[-1]
            sums[name] = torch.bmm(right.mT, left.mT).mT.contiguous() if tall else torch.bmm(left, right)
        return sums

    def add_weighted_sum(self, totals, coefficients, scale) -> None:
        for name in self.inputs:
            totals[name].baddbmm_(*self._sum_factors(name, coefficients), alpha=scale)  # the sum in the GEMM

    def _sum_factors(self, name: str, coefficients: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(L, R) with ``L @ R = (c δ)ᵀ x``.

        The coefficients scale the narrower factor (e.g. the inputs of LoRA's
        B, which have r features).
        """
        output_gradients, inputs = self.output_gradients[name], self.inputs[name]
        if inputs.ndim == 4:  # g_i = Σ_t δ_{i,t} x_{i,t}ᵀ: a sum over positions as over examples, each weighted c_i
            coefficients = coefficients.unsqueeze(-1).expand(inputs.shape[:3]).flatten(1, 2)
            output_gradients, inputs = output_gradients.flatten(1, 2), inputs.flatten(1, 2)
        if output_gradients.shape[-1] <= inputs.shape[-1]:
            return (coefficients.unsqueeze(-1) * output_gradients).mT, inputs
        return output_gradients.mT, coefficients.unsqueeze(-1) * inputs

    def transformed_squared_norms(self, name, left, right) -> torch.Tensor:
        """``‖L δ_i x_iᵀ R‖² = ‖L δ_i‖² ‖Rᵀ x_i‖²``: O(b (d_out p + d_in q)) per model."""
        output_gradients, inputs = self.output_gradients[name], self.inputs[name]
        if left is not None:
            output_gradients = self._per_model_products(left, output_gradients)
        if right is not None:
            inputs = self._per_model_products(right.mT, inputs)
        if inputs.ndim == 4:  # L (Σ_t δ_t x_tᵀ) R = Σ_t (L δ_t)(Rᵀ x_t)ᵀ
            return _summed_outer_squared_norms(output_gradients, inputs)
        return _squared_row_norms(output_gradients) * _squared_row_norms(inputs)

    @staticmethod
    def _per_model_products(matrices: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
        """``M_k v`` for each vector v (K, b, [T,] d) of model k and its matrix M_k (K, p, d): (K, b, [T,] p).

        One batched GEMM in its wide orientation, ``M_k Vᵀ`` (p × vectors): 3-10x faster than ``V M_kᵀ`` and than
        broadcast products (K = 64, 50 examples, d = 128, p = 8: 0.14 vs 0.22 and 0.61 ms). A model's products
        must not depend on its position in the chunk (its memory offset): MKL's were found to for p not a multiple
        of 4 (p = 1, 2, 3, 5), never for multiples of 4 (tested up to d = 257, misaligned starts included), so
        M_k gets zero rows up to a multiple of 8, which are dropped.
        """
        rows = matrices.shape[-2]
        if rows % _POSITION_SAFE_ROWS:
            matrices = torch.nn.functional.pad(matrices, (0, 0, 0, -rows % _POSITION_SAFE_ROWS))
        products = torch.bmm(matrices, vectors.flatten(1, -2).mT)[:, :rows]  # (K, p, vectors)
        return products.mT.reshape(*vectors.shape[:-1], rows)

    def materialise(self) -> dict[str, torch.Tensor]:
        return {
            name: self.output_gradients[name].mT @ x
            if x.ndim == 4
            else torch.einsum("kbo,kbi->kboi", self.output_gradients[name], x)
            for name, x in self.inputs.items()
        }


def _squared_row_norms(vectors: torch.Tensor) -> torch.Tensor:
    """``‖v‖²`` of every vector along the last dim, by the faster reduction for the layout.

    Row-major vectors (the engine's activations and output gradients): ``vector_norm``, one pass (2x faster than
    ``square().sum()``); transposed ones (:meth:`LinearExampleGradients._per_model_products`): ``square().sum()``,
    whose reduction then runs along memory.
    """
    if vectors.stride(-1) == 1:
        return torch.linalg.vector_norm(vectors, dim=-1).square()
    return vectors.square().sum(-1)


def _summed_outer_squared_norms(output_gradients: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """(K, b): ``‖Σ_t δ_t x_tᵀ‖_F²`` for δ (K, b, T, d_out) and x (K, b, T, d_in), exactly, by the cheaper route.

    Either the Gram matrices, ``Σ_{t,s} (δ_t·δ_s)(x_t·x_s)`` at O(T² (d_out + d_in)) per example, or the
    gradient itself at O(T d_out d_in): the Gram route wins when T (d_out + d_in) < d_out d_in.
    """
    positions, d_out, d_in = inputs.shape[-2], output_gradients.shape[-1], inputs.shape[-1]
    if positions * (d_out + d_in) < d_out * d_in:
        return ((output_gradients @ output_gradients.mT) * (inputs @ inputs.mT)).sum((-2, -1))
    return (output_gradients.mT @ inputs).square().sum((-2, -1))


@dataclass(frozen=True)
class BlockedExampleGradients:
    """Per-example gradients of a Poisson step computed block by block (:meth:`PoissonLayout.blocks`).

    Per-example quantities are the blocks' concatenated along the example axis; sums are accumulated block by
    block in order, so a block that holds only padding for a model adds exact zeros to that model's sum.
    """

    blocks: tuple[PerExampleGradients, ...]
    widths: tuple[int, ...]

    def squared_norms(self) -> torch.Tensor:
        return torch.cat([block.squared_norms() for block in self.blocks], dim=1)

    def transformed_squared_norms(self, name, left, right) -> torch.Tensor:
        return torch.cat([block.transformed_squared_norms(name, left, right) for block in self.blocks], dim=1)

    def weighted_sum(self, coefficients: torch.Tensor) -> dict[str, torch.Tensor]:
        (first, head), *rest = zip(self.blocks, coefficients.split(self.widths, dim=1))
        totals = first.weighted_sum(head)
        for block, block_coefficients in rest:
            block.add_weighted_sum(totals, block_coefficients, 1.0)
        return totals

    def add_weighted_sum(self, totals, coefficients, scale) -> None:
        for block, block_coefficients in zip(self.blocks, coefficients.split(self.widths, dim=1)):
            block.add_weighted_sum(totals, block_coefficients, scale)

    def materialise(self) -> dict[str, torch.Tensor]:
        parts = [block.materialise() for block in self.blocks]
        return {name: torch.cat([part[name] for part in parts], dim=1) for name in parts[0]}


def _trained_linear_layers(module: nn.Module, names: Sequence[str]) -> dict[str, nn.Linear] | None:
    """Name → layer when every trained tensor is the weight of an ``nn.Linear`` (peft's lora_A/lora_B are)."""
    layers = {}
    for name in names:
        layer = module.get_submodule(name.removesuffix(".weight")) if name.endswith(".weight") else None
        if not isinstance(layer, nn.Linear):
            return None
        layers[name] = layer
    return layers


def _summed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``Σ_k Σ_i ℓ(logits[k, i], labels[k, i])`` for (K, b, C) logits: cross-entropy summed over all examples.

    Spelled out for speed on CPU, where the batched loss was ~10% of a DP-SGD step: torch's log-softmax over a
    last dimension of C = 10 reduces row by row (~5x slower than over a middle dimension, where it vectorises
    across the b examples), and ``nll_loss``, batched, decomposes into indexing ops. So classes are laid along
    dim -2 of a contiguous (K, C, b) copy. Same value as ``cross_entropy(reduction="sum")`` up to float rounding
    (the C terms are summed in another order); each example's arithmetic still depends on nothing but its logits.
    """
    by_class = logits.mT.contiguous()
    return -by_class.log_softmax(-2).gather(-2, labels.unsqueeze(-2)).sum()


def example_gradient_function(module: nn.Module, names: Sequence[str]) -> Callable:
    """(trainable, frozen, x, y, w) → :class:`PerExampleGradients` of K models, exact per example.

    If every trained tensor ``names`` is a Linear weight, one batched backward pass records each layer's inputs
    and output gradients (:class:`LinearExampleGradients`). A layer that sees several vectors per example (a
    sequence's T positions; any further axes are flattened into them) has ``g_i = Σ_t δ_{i,t} x_{i,t}ᵀ``, still
    exact. Otherwise nested ``vmap(grad)`` materialises them (:class:`DenseExampleGradients`). The loss is the
    module's task's (:func:`dpaudit.models.task_of`).
    """
    task = model_lib.task_of(module)
    layers = _trained_linear_layers(module, names)
    if layers is None:
        dense = gradient_function(module, per_example=True)
        return lambda *args: DenseExampleGradients(dense(*args))

    def forward(trainable, frozen, x):
        inputs, outputs = {}, {}

        def recorder(name):
            def hook(layer, args, output):
                if name in inputs:
                    raise ValueError(
                        f"layer {name!r} is called twice in one forward pass: factored per-example gradients "
                        "record one input per layer; give each use its own layer"
                    )
                inputs[name], outputs[name] = args[0], output

            return hook

        handles = [layer.register_forward_hook(recorder(name)) for name, layer in layers.items()]
        try:
            return functional_call(module, {**frozen, **trainable}, (x,)), inputs, outputs
        finally:
            for handle in handles:
                handle.remove()

    per_model = vmap(forward, in_dims=(0, 0, 0))

    def gradients(trainable, frozen, x, y, w):
        # vmap runs the K forward passes on (K, ...) tensors that plain autograd records, so one backward pass
        # through all of them gives each layer's output gradient δ (∂(Σ_i ℓ_i)/∂output_i; the models do not
        # interact). Weights only need to require grad for the pass to be recorded: their gradients are not asked
        # for, so none is computed.
        with torch.enable_grad():
            recorded = {name: t.detach().requires_grad_() for name, t in trainable.items()}
            logits, inputs, outputs = per_model(recorded, frozen, x)
            versions = {name: output._version for name, output in outputs.items()}
            loss = (
                _summed_cross_entropy(logits, y)
                if task == "classification"
                else model_lib.example_losses(task, logits.flatten(0, 1), y.flatten(0, 1)).sum()
            )
            if any(output._version != versions[name] for name, output in outputs.items()):
                raise ValueError(
                    "a trained layer's output was modified in place (e.g. ReLU(inplace=True)): "
                    "per-example output gradients need it unchanged; use out-of-place modules"
                )
            output_gradients = torch.autograd.grad(loss, list(outputs.values()))
        # (K, b, ..., d): positions along one axis (K, b, T, d) where there are several. In the trained weights'
        # dtype: under bf16 autocast the recorded activations and output gradients are bf16, and the mechanism's
        # clipping and sums run in the weights' precision.
        dtype = next(iter(trainable.values())).dtype
        positions = {name: value.flatten(2, -2) if value.ndim > 4 else value for name, value in inputs.items()}
        return LinearExampleGradients(
            {name: value.detach().to(dtype) for name, value in positions.items()},
            {name: (g.flatten(2, -2) if g.ndim > 4 else g).to(dtype) for name, g in zip(outputs, output_gradients)},
        )

    return gradients


def _gathered(
    batches: Iterator[tuple[np.ndarray, np.ndarray]],
    x: np.ndarray,
    y: np.ndarray,
    blocks: Callable[[int], list[slice]],
    device: torch.device,
):
    """Per step of ``batches``: the example weights as a tensor and, per block, its slots, inputs and labels.

    The example weights are (K, w); per block of the step come its slots and the
    gathered inputs (K, width, ...) and labels (K, width), each block contiguous.

    Gathered with numpy: the engine runs this on its background thread, where a torch op could start an OpenMP
    team that competes with the engine's own (:mod:`dpaudit.background`).
    """
    for index, weight in batches:
        yield (
            torch.from_numpy(weight).to(device),
            [
                (
                    block,
                    torch.from_numpy(x[index[:, block]]).to(device),
                    torch.from_numpy(y[index[:, block]]).to(device),
                )
                for block in blocks(index.shape[1])
            ],
        )


def train(
    shadow: ShadowModels,
    mechanism: Mechanism,
    x: np.ndarray,
    y: np.ndarray,
    membership: np.ndarray,
    randomness: Sequence[ModelRandomness],
    config: TrainingConfig,
    layout: BatchLayout | None = None,
    on_step: Callable[[int], None] | None = None,
    canaries: CanaryRun | None = None,
) -> ShadowModels:
    """Fine-tune the K models of ``shadow`` in place on their members of the pool (x, y) with ``mechanism``.

    ``membership`` is a (K, n_pool) boolean matrix; ``layout`` defaults to the one these K models need alone
    (a campaign passes its own so that chunking does not matter). Batches are shuffled, or Poisson-sampled with
    expected size ``config.batch_size`` for a mechanism with ``sampling = "poisson"`` (:class:`PoissonLayout`).
    The optimiser is torch's SGD with momentum over the stacked tensors (elementwise, so stacking does not change
    any model's arithmetic), unless the mechanism owns its update; the hooks ``initialise``, ``update`` and
    ``finish`` (no-ops by default) are documented in :class:`dpaudit.mechanisms.base.Mechanism`. ``canaries``:
    gradient canaries appended to the steps' examples and observed (:class:`dpaudit.canaries.CanaryRun`); their
    observations are left in ``shadow.canary_observations``.
    """
    if membership.shape != (shadow.n_models, len(y)):
        raise ValueError(f"membership has shape {membership.shape}, expected ({shadow.n_models}, {len(y)})")
    device = next(iter(shadow.trainable.values())).device
    params = {name: t.clone() for name, t in shadow.trainable.items()}
    optimiser = torch.optim.SGD(
        list(params.values()), lr=config.lr, momentum=config.momentum, fused=True
    )  # one pass over the weights per step instead of three
    layout = layout or BatchLayout.for_members(int(membership.sum(axis=1).max()), config.batch_size)
    if mechanism.sampling == "poisson":
        if not mechanism.per_example:
            raise ValueError(
                f"mechanism {mechanism.name!r} samples Poisson batches, which the engine computes "
                f"per example only (clipped sums divided by the expected batch size)"
            )
        poisson = PoissonLayout.for_batch_layout(layout, config.batch_size)
        steps, expected_batch_size, blocks = poisson.steps, poisson.expected_batch_size, poisson.blocks
        sample_rate: float | None = poisson.sample_rate
        batches = poisson_batches(membership, randomness, poisson, config.epochs)
    else:
        steps, expected_batch_size, sample_rate = layout.steps, None, None
        blocks = lambda largest_batch: [slice(0, largest_batch)]  # noqa: E731 (a shuffled step is one block)
        batches = shuffled_batches(membership, randomness, layout, config.epochs)
    schedule = (
        torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, T_max=config.epochs * steps, eta_min=config.min_lr)
        if config.schedule == "cosine"
        else None
    )
    state = mechanism.setup({name: t.shape[1:] for name, t in params.items()}, randomness)
    with torch.no_grad():
        mechanism.initialise(params, state)
    if canaries is not None:
        canaries.start(params, randomness, sample_rate, steps, config.epochs)
    gradients = (
        example_gradient_function(shadow.module, list(params))
        if mechanism.per_example
        else gradient_function(shadow.module, per_example=False)
    )
    for step, (weight_t, examples) in enumerate(background.ahead(_gathered(batches, x, y, blocks, device))):
        parts = tuple(
            gradients(params, shadow.frozen, block_x, block_y, weight_t[:, block])
            for block, block_x, block_y in examples
        )
        grads = (
            parts[0]
            if len(parts) == 1
            else BlockedExampleGradients(parts, tuple(block.stop - block.start for block, _, _ in examples))
        )
        # The mechanism's arithmetic (clipping, sums, noise, PRISM's algebra) in the weights' precision: bf16
        # autocast (--precision bf16) is for the model's forward and backward passes only.
        with torch.autocast(device.type, enabled=False):
            if canaries is not None:
                grads, weight_t = canaries.insert(grads, weight_t, mechanism.per_example)
            current = Step(grads, weight_t, step, expected_batch_size, config.epochs * steps, params)
            lr = optimiser.param_groups[0]["lr"]
            direction = None
            if mechanism.update is not None:
                with torch.no_grad():
                    mechanism.update(params, current, state, lr)
                optimiser.step()  # no gradients: changes nothing, keeps the schedule's bookkeeping in order
            else:
                direction = mechanism.transform(current, state)
                for name, p in params.items():
                    p.grad = direction[name]
                optimiser.step()
            if canaries is not None:
                canaries.record(direction, params, lr)
        if schedule is not None:
            schedule.step()
        if on_step is not None:
            on_step(step)
    with torch.no_grad():
        mechanism.finish(params, state, config.lr)
    if canaries is not None:
        shadow.canary_observations = canaries.finish(params)
    shadow.trainable = {name: p.detach() for name, p in params.items()}
    return shadow


@torch.no_grad()
def logits(shadow: ShadowModels, x: np.ndarray, batch_size: int = 4096) -> torch.Tensor:
    """(K, n, classes) logits of every model on the same inputs ``x`` (n, ...)."""
    forward = vmap(
        lambda trainable, frozen, inputs: functional_call(shadow.module, {**frozen, **trainable}, (inputs,)),
        in_dims=(0, 0, 0),
    )
    device = next(iter(shadow.trainable.values())).device
    inputs = torch.from_numpy(x).to(device)
    # Inputs per model too (a view), so that no GEMM spans several models (see _per_model_view). No inputs (a
    # gradient canary has none) still run one empty batch, which gives the (K, 0, classes) result.
    parts = [
        forward(shadow.trainable, shadow.frozen, _per_model_view(inputs[i : i + batch_size], shadow.n_models))
        for i in range(0, max(len(inputs), 1), batch_size)
    ]
    return torch.cat(parts, dim=1)


def train_sequentially(
    shadow: ShadowModels,
    mechanism: Mechanism,
    x: np.ndarray,
    y: np.ndarray,
    membership: np.ndarray,
    randomness: Sequence[ModelRandomness],
    config: TrainingConfig,
    layout: BatchLayout | None = None,
) -> ShadowModels:
    """The plain per-model loop the batched engine is checked and benchmarked against.

    Each model is a real ``nn.Module`` (a deep copy loaded with its tensors) trained with autograd and its own
    ``torch.optim.SGD``, on the same batches and mechanism randomness as :func:`train`.
    """
    if mechanism.per_example:
        raise ValueError("the per-model reference loop covers batch-gradient mechanisms only")
    layout = layout or BatchLayout.for_members(int(membership.sum(axis=1).max()), config.batch_size)
    inputs, labels = torch.from_numpy(x), torch.from_numpy(y)
    task = model_lib.task_of(shadow.module)
    trained: dict[str, list[torch.Tensor]] = {name: [] for name in shadow.trainable}
    for k in range(shadow.n_models):
        module = copy.deepcopy(shadow.module)
        values = {n: t[k] for n, t in {**shadow.frozen, **shadow.trainable}.items()}
        params = dict(module.named_parameters())
        with torch.no_grad():
            for name, value in values.items():
                params[name].copy_(value)
        for name, p in params.items():
            p.requires_grad_(name in shadow.trainable)
        optimiser = torch.optim.SGD([params[n] for n in shadow.trainable], lr=config.lr, momentum=config.momentum)
        schedule = (
            torch.optim.lr_scheduler.CosineAnnealingLR(
                optimiser, T_max=config.epochs * layout.steps, eta_min=config.min_lr
            )
            if config.schedule == "cosine"
            else None
        )
        state = mechanism.setup({n: t.shape[1:] for n, t in shadow.trainable.items()}, randomness[k : k + 1])
        batches = shuffled_batches(membership[k : k + 1], randomness[k : k + 1], layout, config.epochs)
        for step, (index, weight) in enumerate(batches):
            batch = torch.from_numpy(index[0][weight[0] > 0])
            optimiser.zero_grad()
            model_lib.mean_loss(task, module(inputs[batch]), labels[batch]).backward()
            grads = {n: _gradient(params[n]).unsqueeze(0) for n in shadow.trainable}
            update = mechanism.transform(Step(grads, torch.from_numpy(weight), step), state)
            for n in shadow.trainable:
                params[n].grad = update[n][0]
            optimiser.step()
            if schedule is not None:
                schedule.step()
        for name in trained:
            trained[name].append(params[name].detach().clone())
    shadow.trainable = {name: torch.stack(stack) for name, stack in trained.items()}
    return shadow


def _gradient(parameter: torch.Tensor) -> torch.Tensor:
    """``parameter.grad`` after a backward pass that reached it."""
    if parameter.grad is None:
        raise RuntimeError("a trained tensor has no gradient: the loss does not depend on it")
    return parameter.grad

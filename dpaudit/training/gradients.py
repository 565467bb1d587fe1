"""Per-example gradients of K models at once, materialised or factored (exact either way).

Mechanisms see them only through :class:`dpaudit.mechanisms.base.PerExampleGradients`' operations (squared norms,
weighted sums, transformed norms), so clipping is exact whether they are materialised (``vmap(grad)``,
:class:`DenseExampleGradients`) or, when only Linear weights train, kept as each layer's inputs and output
gradients (:class:`LinearExampleGradients`; :class:`BlockedExampleGradients` joins the blocks of a Poisson step,
:class:`GroupedExampleGradients` groups of models, :class:`PaddedExampleGradients` a model's exact batch).
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import grad, vmap

from dpaudit import models as model_lib
from dpaudit.errors import UsageError
from dpaudit.linalg import position_safe_product, tall, wide_product
from dpaudit.mechanisms.base import PerExampleGradients
from dpaudit.models.adapters import merged_adapters, merges
from dpaudit.models.transformer import flash_attention


def _loss_functions(module: nn.Module):
    """Weighted batch-mean and single-example losses as functions of (trainable, frozen, data).

    The loss is the module's task's (:func:`dpaudit.models.task_of`).
    """
    task = model_lib.task_of(module)

    def batch_loss(trainable, frozen, x, y, w):
        logits = model_lib.functional_forward(module, {**frozen, **trainable}, x)
        losses = model_lib.example_losses(task, logits, y)
        return (w * losses).sum() / w.sum().clamp(min=1.0)

    def example_loss(trainable, frozen, x, y):
        logits = model_lib.functional_forward(module, {**frozen, **trainable}, x.unsqueeze(0))
        return model_lib.mean_loss(task, logits, y.unsqueeze(0))

    return batch_loss, example_loss


def gradient_function(module: nn.Module, per_example: bool, alone: bool = False) -> Callable:
    """(trainable, frozen, x, y, w) → gradients for K models: (K, ...) or per example (K, b, ...).

    Batch gradients: ``vmap`` runs the K forward passes and one plain backward pass of the sum of the K losses gives
    every model its own gradient (the models do not interact), as in :func:`example_gradient_function`. Backward
    through ``vmap(grad)`` instead ran each backward op through vmap's batching rules: 2-3x slower per step on the
    byte-level transformer (docs/performance.md). ``alone`` (per example only): every call is one model's (K = 1),
    computed without the models' ``vmap`` (:func:`one_model_call`).
    """
    batch_loss, example_loss = _loss_functions(module)
    shared_layers = shared_layers_of(module)
    if not per_example:

        def batch_gradients(trainable, frozen, x, y, w):
            frozen, frozen_dims = shared_base(shared_layers, frozen)
            losses = vmap(batch_loss, in_dims=(0, frozen_dims, 0, 0, 0))
            with (
                torch.enable_grad(),
                merged_adapters(linear=token_sequences(x), convolutions=large_images(x)),
                flash_attention(),
            ):
                recorded = {name: t.detach().requires_grad_() for name, t in trainable.items()}
                total = losses(recorded, frozen, x, y, w).sum()
                # A trained tensor the loss does not use gets zeros, as vmap(grad) gives them.
                sums = torch.autograd.grad(total, list(recorded.values()), materialize_grads=True)
            # Laid out as the weights (a weight's gradient can come back transposed): the fused optimiser reads
            # both in memory order.
            return {name: g.contiguous() for name, g in zip(recorded, sums)}

        return batch_gradients
    per_model = vmap(grad(example_loss), in_dims=(None, None, 0, 0))

    def example_gradients(trainable, frozen, x, y, w):
        frozen, frozen_dims = shared_base(shared_layers, frozen)
        in_dims = (0, frozen_dims, 0, 0)
        if alone:
            return with_models_axis(per_model(*one_model_call((trainable, frozen, x, y), in_dims)))
        return vmap(per_model, in_dims=in_dims)(trainable, frozen, x, y)

    return example_gradients


def token_sequences(x: torch.Tensor) -> bool:
    """Whether inputs ``x`` (K, b, ...) are (K, b, T) token ids: thousands of rows a model in every layer.

    A step on them trains with merged Linear adapters (:func:`dpaudit.models.adapters.merged_adapters`), which pay
    at that many rows where an MLP's or a CNN's b rows are too few (docs/performance.md §8), and the engine computes
    them a group of models at a time (:func:`dpaudit.training.engine.model_groups`).
    """
    return not torch.is_floating_point(x) and x.ndim >= 3


# Pixels of one model's batch of images from which its adapted convolutions train merged, one convolution per model:
# the seed CNN's step ran 0.69-0.79x as fast merged on 32 images of 8² (2048 pixels), 1.19-1.33x as fast on 16²
# (8192) and 1.4-1.5x on 32² (docs/performance.md §16).
_PIXELS_TO_MERGE = 8192


def large_images(x: torch.Tensor) -> bool:
    """Whether inputs ``x`` (K, b, C, H, W) are images of :data:`_PIXELS_TO_MERGE` pixels or more a model's batch.

    A step on them trains with merged Conv2d adapters (:func:`dpaudit.models.adapters.merged_adapters`); on fewer,
    a model's convolutions are too small to run alone, and peft's layers, the base convolution once over the K
    models' images, are faster. (Scoring merges them at any size: no backward pass, and thousands of images.)
    """
    return torch.is_floating_point(x) and x.ndim == 5 and x.shape[1] * x.shape[-2] * x.shape[-1] >= _PIXELS_TO_MERGE


# Layers whose frozen tensors vmap takes once, for the K models' rows together, where the op computes each image or
# row alone, so that the K models' numbers stay those of each model alone (shared_base).
SHARED_LAYER_TYPES = (nn.Conv2d, nn.LayerNorm, nn.Embedding)


def shared_layers_of(module: nn.Module) -> set[str]:
    """The names of ``module``'s layers whose frozen base :func:`shared_base` passes once.

    Not a layer holding a tied weight (GPT-2's embedding is its output head's): the head, a GEMM, would get it once
    too.
    """
    tied = model_lib.tied_parameters(module)
    return {
        name
        for name, layer in module.named_modules()
        if isinstance(layer, SHARED_LAYER_TYPES) and not any(id(p) in tied for p in layer.parameters(recurse=False))
    }


def shared_base(shared_layers: set[str], frozen: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """The frozen tensors as ``vmap`` takes them, and their in_dims: a shared layer's base once (None).

    Every model's frozen base is one tensor seen through a stride-0 (K, ...) view (:func:`engine._per_model_view`).
    Passed per model, a convolution's becomes a grouped convolution over the K models, which oneDNN runs 1.2-1.7x
    slower than one convolution over the K·B images (docs/performance.md §2); a LayerNorm's affine weights, vmap
    applies in two further elementwise passes, not in the fused kernel; an Embedding is looked up per model. Each
    image's or row's output and input gradient are the same bit for bit at every batch size (tested). GEMMs stay
    per model: their rounding can change with the number of rows.
    """
    tensors: dict[str, torch.Tensor] = {}
    dims: dict[str, int | None] = {}
    for name, tensor in frozen.items():
        shared = tensor.stride(0) == 0 and name.rpartition(".")[0] in shared_layers
        tensors[name], dims[name] = (tensor[0], None) if shared else (tensor, 0)
    return tensors, dims


def one_model_call(arguments: tuple, in_dims: tuple) -> tuple:
    """The arguments of a ``vmap`` over the models (``in_dims`` as vmap takes them) for its one model, without it.

    Where a pass computes one model (a Poisson step's exact batches, :func:`dpaudit.training.engine.train`), the
    function runs on that model's own tensors: ``vmap``'s batching cost a fifth of such a pass of the byte-level
    transformer (docs/performance.md §17). The caller puts the models' axis back on the results. The ops differ from
    vmap's batched ones (``addmm`` where vmap adds a Linear layer's bias after the product), so the numbers round
    otherwise: a path either always takes it or never, as the engine's exact batches do.
    """
    if any(isinstance(arg, torch.Tensor) and arg.shape[0] != 1 for arg, dim in zip(arguments, in_dims) if dim == 0):
        raise ValueError("a call without the models' vmap computes one model: its inputs must have K = 1")
    return tuple(_model_zero(arg, dim) for arg, dim in zip(arguments, in_dims))


def with_models_axis(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One model's results (of a :func:`one_model_call`) with the models' axis put back: (1, ...) views."""
    return {name: t.unsqueeze(0) for name, t in tensors.items()}


def _model_zero(argument, dim):
    """Model 0's part of one ``vmap`` argument: a tensor, or a dict of tensors with a dim or a dim per name."""
    if isinstance(argument, torch.Tensor):
        return argument if dim is None else argument.select(dim, 0)
    dims = dim if isinstance(dim, dict) else dict.fromkeys(argument, dim)
    return {name: t if dims[name] is None else t.select(dims[name], 0) for name, t in argument.items()}


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

    @functools.cached_property
    def _formed(self) -> dict[str, torch.Tensor]:
        """(K, b, d_out, d_in) gradients ``g_i`` of the sequence layers whose norms are cheaper from ``g_i`` itself.

        Formed once, for the norms; then each sum ``Σ_i c_i g_i`` reads them (b d_out d_in products a model) instead
        of a product over the records of every position (b T d_out d_in): a DP-SGD step's sums on the byte-level
        transformer's LoRA factors took 4% of its time from the records (docs/performance.md §17). They are no larger
        than the records they come from (:func:`_forms_gradients`).
        """
        return {
            name: wide_product(self.output_gradients[name].mT, x)
            for name, x in self.inputs.items()
            if x.ndim == 4 and _forms_gradients(self.output_gradients[name], x)
        }

    def squared_norms(self) -> torch.Tensor:
        return functools.reduce(operator.add, (self._squared_norms(name) for name in self.inputs))

    def _squared_norms(self, name: str) -> torch.Tensor:
        output_gradients, x = self.output_gradients[name], self.inputs[name]
        if x.ndim == 3:
            return (torch.linalg.vector_norm(output_gradients, dim=-1) * torch.linalg.vector_norm(x, dim=-1)).square()
        if name in self._formed:
            return self._formed[name].square().sum((-2, -1))
        return _summed_outer_squared_norms(output_gradients, x)

    def weighted_sum(self, coefficients: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            name: self._formed_sum(name, coefficients)
            if name in self._formed
            else wide_product(*self._sum_factors(name, coefficients)).contiguous()  # laid out as the weight
            for name in self.inputs
        }

    def add_weighted_sum(self, totals, coefficients, scale) -> None:
        for name in self.inputs:
            if name in self._formed:
                totals[name].add_(self._formed_sum(name, coefficients), alpha=scale)
                continue
            left, right = self._sum_factors(name, coefficients)
            if tall(left, right):  # LoRA's B: formed transposed, then added
                totals[name].add_(wide_product(left, right), alpha=scale)
            else:
                totals[name].baddbmm_(left, right, alpha=scale)  # the sum in the GEMM

    def _formed_sum(self, name: str, coefficients: torch.Tensor) -> torch.Tensor:
        """``Σ_i c_i g_i`` (K, d_out, d_in) from the formed gradients: one (1 × b) (b × d_out d_in) product a model."""
        formed = self._formed[name]
        return position_safe_product(coefficients.unsqueeze(1), formed.flatten(2)).view(
            formed.shape[0], *formed.shape[2:]
        )

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
            output_gradients = self.per_model_products(left, output_gradients)
        if right is not None:
            inputs = self.per_model_products(right.mT, inputs)
        if inputs.ndim == 4:  # L (Σ_t δ_t x_tᵀ) R = Σ_t (L δ_t)(Rᵀ x_t)ᵀ
            return _summed_outer_squared_norms(output_gradients, inputs)
        return _squared_row_norms(output_gradients) * _squared_row_norms(inputs)

    @staticmethod
    def per_model_products(matrices: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
        """``M_k v`` for each vector v (K, b, [T,] d) of model k and its matrix M_k (K, p, d): (K, b, [T,] p).

        One batched GEMM in its wide orientation, ``M_k Vᵀ`` (p × vectors): 3-10x faster than ``V M_kᵀ`` and than
        broadcast products (K = 64, 50 examples, d = 128, p = 8: 0.14 vs 0.22 and 0.61 ms). A model's products
        must not depend on its position in the chunk (its memory offset): MKL's were found to for p not a multiple
        of 4 (p = 1, 2, 3, 5), never for multiples of 4 (tested up to d = 257, misaligned starts included), so
        M_k gets zero rows up to a multiple of 8, which are dropped (:func:`dpaudit.linalg.position_safe_product`).
        """
        products = position_safe_product(matrices, vectors.flatten(1, -2).mT)  # (K, p, vectors)
        return products.mT.reshape(*vectors.shape[:-1], matrices.shape[-2])

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
    ``square().sum()``); transposed ones (:meth:`LinearExampleGradients.per_model_products`): ``square().sum()``,
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
    if _forms_gradients(output_gradients, inputs):
        return wide_product(output_gradients.mT, inputs).square().sum((-2, -1))
    return ((output_gradients @ output_gradients.mT) * (inputs @ inputs.mT)).sum((-2, -1))


def _forms_gradients(output_gradients: torch.Tensor, inputs: torch.Tensor) -> bool:
    """Whether a sequence layer's norms are cheaper from ``g_i`` itself than from the positions' Gram matrices.

    ``g_i`` costs T d_out d_in products, the Gram matrices T² (d_out + d_in): ``g_i`` when d_out d_in ≤ T (d_out +
    d_in), where it is also no larger than the example's records (T (d_out + d_in) numbers).
    """
    positions, d_out, d_in = inputs.shape[-2], output_gradients.shape[-1], inputs.shape[-1]
    return positions * (d_out + d_in) >= d_out * d_in


def joined(parts: Sequence[dict[str, torch.Tensor]], dim: int = 0) -> dict[str, torch.Tensor]:
    """Each name's tensors of ``parts`` concatenated along ``dim``: the models' axis (0) or the examples' (1)."""
    return {name: torch.cat([part[name] for part in parts], dim=dim) for name in parts[0]}


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
        return joined(parts, dim=1)


@dataclass(frozen=True)
class GroupedExampleGradients:
    """Per-example gradients of a chunk's K models computed group by group: consecutive models, ``sizes`` of them.

    Per-model quantities are the groups' concatenated along the model axis; sums are formed per group into the
    group's rows of the result. A model's numbers are those of the group that holds it, which are those of the model
    alone (the engine's arithmetic does not depend on a model's companions), so the grouping changes no bit.
    """

    groups: tuple[PerExampleGradients, ...]
    sizes: tuple[int, ...]

    def _models(self) -> list[slice]:
        ends = list(itertools.accumulate(self.sizes))
        return [slice(end - size, end) for size, end in zip(self.sizes, ends)]

    def squared_norms(self) -> torch.Tensor:
        return torch.cat([group.squared_norms() for group in self.groups])

    def transformed_squared_norms(self, name, left, right) -> torch.Tensor:
        return torch.cat(
            [
                group.transformed_squared_norms(
                    name, None if left is None else left[models], None if right is None else right[models]
                )
                for group, models in zip(self.groups, self._models())
            ]
        )

    def weighted_sum(self, coefficients: torch.Tensor) -> dict[str, torch.Tensor]:
        return joined([group.weighted_sum(coefficients[models]) for group, models in zip(self.groups, self._models())])

    def add_weighted_sum(self, totals, coefficients, scale) -> None:
        for group, models in zip(self.groups, self._models()):
            group.add_weighted_sum({name: t[models] for name, t in totals.items()}, coefficients[models], scale)

    def materialise(self) -> dict[str, torch.Tensor]:
        return joined([group.materialise() for group in self.groups])


@dataclass(frozen=True)
class PaddedExampleGradients:
    """One model's per-example gradients of its ``count`` sampled examples, seen at the step's ``width`` slots.

    The engine computes a model alone on its exact Poisson batch (the sampled examples fill a row's first slots);
    the mechanism sees the step's (1, width) layout: the padding slots' norms are 0 and their coefficients, 0 by
    their weights, are not read.
    """

    examples: PerExampleGradients
    count: int
    width: int

    def _padded(self, values: torch.Tensor) -> torch.Tensor:
        return torch.cat([values, values.new_zeros(values.shape[0], self.width - self.count, *values.shape[2:])], 1)

    def squared_norms(self) -> torch.Tensor:
        return self._padded(self.examples.squared_norms())

    def transformed_squared_norms(self, name, left, right) -> torch.Tensor:
        return self._padded(self.examples.transformed_squared_norms(name, left, right))

    def weighted_sum(self, coefficients: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.examples.weighted_sum(coefficients[:, : self.count])

    def add_weighted_sum(self, totals, coefficients, scale) -> None:
        self.examples.add_weighted_sum(totals, coefficients[:, : self.count], scale)

    def materialise(self) -> dict[str, torch.Tensor]:
        return {name: self._padded(g) for name, g in self.examples.materialise().items()}


def _trained_linear_layers(module: nn.Module, names: Sequence[str]) -> dict[str, nn.Linear] | None:
    """Name → layer when every trained tensor is the weight of an ``nn.Linear`` (peft's lora_A/lora_B are).

    A tied weight is used by more than one layer, whose inputs one layer's record misses: None (materialised).
    """
    layers = {}
    tied = model_lib.tied_parameters(module)
    for name in names:
        layer = module.get_submodule(name.removesuffix(".weight")) if name.endswith(".weight") else None
        if not isinstance(layer, nn.Linear) or id(layer.weight) in tied:
            return None
        layers[name] = layer
    return layers


def _adapted_layer(name: str) -> str:
    """The adapted layer a LoRA factor's weight belongs to: ``….q.lora_B.default.weight`` → ``….q``."""
    return name.split(".lora_")[0]


def _merged_adapter_factors(module: nn.Module, names: Sequence[str]) -> dict[str, dict[str, str]]:
    """Adapted layer → {"A": …, "B": …}, its factors' weight names, for layers of trained factors that merge.

    (:func:`models.merges`.) Both factors are named, trained or not: one's per-example gradient needs the other.
    """
    adapters: dict[str, dict[str, str]] = {}
    for name in names:
        if (".lora_A." in name or ".lora_B." in name) and merges(module.get_submodule(_adapted_layer(name))):
            b = name.replace(".lora_A.", ".lora_B.")
            adapters[_adapted_layer(name)] = {"A": b.replace(".lora_B.", ".lora_A."), "B": b}
    return adapters


def _factor_records(
    adapters: dict[str, dict[str, str]],
    trained: Sequence[str],
    tensors: dict[str, torch.Tensor],
    inputs: dict[str, torch.Tensor],
    output_gradients: dict[str, torch.Tensor],
    dtype: torch.dtype,
) -> None:
    """Replace each merged layer's input x and output gradient δ by those of its ``trained`` factors (in place).

    ``z = W x + b + B (A x)``, so B's input is ``A x`` and its output gradient δ; A's input is x and its output
    gradient ``Bᵀ δ``: the factored per-example gradients of :class:`LinearExampleGradients`, exact. A layer the
    forward never called is left out (its factors get zeros).
    """
    for layer, names in adapters.items():
        if layer not in inputs:
            continue
        x, delta = inputs.pop(layer).detach().to(dtype), output_gradients.pop(layer).to(dtype)
        a, b = (tensors[names[factor]].detach().to(dtype) for factor in ("A", "B"))
        if names["B"] in trained:
            inputs[names["B"]] = LinearExampleGradients.per_model_products(a, x)
            output_gradients[names["B"]] = delta
        if names["A"] in trained:
            inputs[names["A"]] = x
            output_gradients[names["A"]] = LinearExampleGradients.per_model_products(b.mT, delta)


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


def example_gradient_function(module: nn.Module, names: Sequence[str], alone: bool = False) -> Callable:
    """(trainable, frozen, x, y, w) → :class:`PerExampleGradients` of K models, exact per example.

    ``alone``: every call is one model's (K = 1), computed without the models' ``vmap`` (:func:`one_model_call`).

    If every trained tensor ``names`` is a Linear weight, one batched backward pass records each layer's inputs
    and output gradients (:class:`LinearExampleGradients`). A layer that sees several vectors per example (a
    sequence's T positions; any further axes are flattened into them) has ``g_i = Σ_t δ_{i,t} x_{i,t}ᵀ``, still
    exact. Otherwise nested ``vmap(grad)`` materialises them (:class:`DenseExampleGradients`). The loss is the
    module's task's (:func:`dpaudit.models.task_of`). On sequences adapters are merged (:func:`token_sequences`):
    a merged layer's input and output gradient are recorded, and its factors' derived from them
    (:func:`_factor_records`).
    """
    task = model_lib.task_of(module)
    layers = _trained_linear_layers(module, names)
    if layers is None:
        dense = gradient_function(module, per_example=True, alone=alone)
        return lambda *args: DenseExampleGradients(dense(*args))
    adapters = _merged_adapter_factors(module, names)
    shared_layers = shared_layers_of(module)

    def forward(trainable, frozen, x, merged):
        inputs, outputs = {}, {}

        def recorder(name):
            def hook(layer, args, output):
                if name in inputs:
                    raise UsageError(
                        f"layer {name!r} is called twice in one forward pass: factored per-example gradients "
                        "record one input per layer; give each use its own layer"
                    )
                inputs[name], outputs[name] = args[0], output

            return hook

        # Merged, an adapted layer's input x and output z are recorded, not its factors', which it never calls.
        recorded = {name: module.get_submodule(name) for name in adapters} if merged else {}
        recorded |= {n: layer for n, layer in layers.items() if not (merged and _adapted_layer(n) in adapters)}
        handles = [layer.register_forward_hook(recorder(name)) for name, layer in recorded.items()]
        try:
            with merged_adapters(linear=merged, factor_gradients=False), flash_attention():
                return model_lib.functional_forward(module, {**frozen, **trainable}, x), inputs, outputs
        finally:
            for handle in handles:
                handle.remove()

    def gradients(trainable, frozen, x, y, w):
        # vmap runs the K forward passes on (K, ...) tensors that plain autograd records, so one backward pass
        # through all of them gives each layer's output gradient δ (∂(Σ_i ℓ_i)/∂output_i; the models do not
        # interact). Weights only need to require grad for the pass to be recorded: their gradients are not asked
        # for, so none is computed.
        merged = token_sequences(x)
        with torch.enable_grad():
            recorded = {name: t.detach().requires_grad_() for name, t in trainable.items()}
            shared, frozen_dims = shared_base(shared_layers, frozen)
            in_dims = (0, frozen_dims, 0)
            if alone:
                logits, inputs, outputs = forward(*one_model_call((recorded, shared, x), in_dims), merged=merged)
                logits = logits.unsqueeze(0)
            else:
                logits, inputs, outputs = vmap(functools.partial(forward, merged=merged), in_dims=in_dims)(
                    recorded, shared, x
                )
            versions = {name: output._version for name, output in outputs.items()}
            loss = (
                _summed_cross_entropy(logits, y)
                if task == "classification"
                else model_lib.example_losses(task, logits.flatten(0, 1), y.flatten(0, 1)).sum()
            )
            if any(output._version != versions[name] for name, output in outputs.items()):
                raise UsageError(
                    "a trained layer's output was modified in place (e.g. ReLU(inplace=True)): "
                    "per-example output gradients need it unchanged; use out-of-place modules"
                )
            # An output the loss does not use has zero gradients, as vmap(grad) gives them.
            output_gradients = dict(
                zip(outputs, torch.autograd.grad(loss, list(outputs.values()), materialize_grads=True))
            )
        if alone:  # the models' axis back (after the backward pass, which differentiates the tensors recorded)
            inputs, output_gradients = with_models_axis(inputs), with_models_axis(output_gradients)
        # (K, b, ..., d): positions along one axis (K, b, T, d) where there are several. In the trained weights'
        # dtype: under bf16 autocast the recorded activations and output gradients are bf16, and the mechanism's
        # clipping and sums run in the weights' precision.
        dtype = next(iter(trainable.values())).dtype
        if merged:
            _factor_records(adapters, names, {**frozen, **trainable}, inputs, output_gradients, dtype)
        # A trained layer the forward never calls (e.g. a head the model defines but does not use) has zero
        # per-example gradients, as vmap(grad) gives them: zero inputs and output gradients keep every operation
        # exact and leave its weights as they are.
        for name in [name for name in layers if name not in inputs]:
            d_out, d_in = layers[name].weight.shape
            inputs[name] = torch.zeros(*x.shape[:2], d_in, dtype=dtype, device=x.device)
            output_gradients[name] = torch.zeros(*x.shape[:2], d_out, dtype=dtype, device=x.device)
        return LinearExampleGradients(
            {name: (v.flatten(2, -2) if v.ndim > 4 else v).detach().to(dtype) for name, v in inputs.items()},
            {name: (g.flatten(2, -2) if g.ndim > 4 else g).to(dtype) for name, g in output_gradients.items()},
        )

    return gradients

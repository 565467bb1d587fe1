"""How an adapted layer computes: peft's LoRA forward with dpaudit's numbers, and merged adapters.

:func:`dpaudit.models.attach_lora` gives every adapted layer :func:`lora_forward` as its forward. Inside
:func:`merged_adapters` (the engine's passes) a layer computes with its adapter merged into its weight, ``W + B A``:
one product per layer instead of three (docs/performance.md §8, §16). Every merged layer here is computed per model:
no tensor of one model enters another's product, so a model's numbers do not depend on its companions.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dpaudit.linalg import wide_product


@dataclass(frozen=True)
class _Merging:
    """What merges inside :func:`merged_adapters`: Linear layers with ``linear`` (None: none), Conv2d layers or not."""

    linear: Callable | None
    convolutions: bool


# How the adapted layers compute in this context (merged_adapters), or None: peft's unmerged layers.
_MERGING: contextvars.ContextVar[_Merging | None] = contextvars.ContextVar("merged_adapters", default=None)


@contextmanager
def merged_adapters(linear: bool = True, convolutions: bool = True, *, factor_gradients: bool = True) -> Iterator[None]:
    """Within it, adapted layers at scaling 1 compute with their adapter merged into the weight, ``W + B A``.

    - ``linear``: an adapted ``nn.Linear`` computes ``x (W + B A)ᵀ + b``, one GEMM. peft's ``W x + b + B (A x)`` is
      three, two of them with the rank as a dimension, which MKL runs at a fraction of its speed: where a layer sees
      thousands of rows per model (a batch of sequences) the merged layer trains 1.2-2.4x faster, its backward
      included, although where A trains it forms the (d_out, d_in) gradient of ``W + B A`` (:class:`_MergedLinear`);
      at tens of rows (an MLP's batch) it is 2x slower (docs/performance.md §8).
    - ``convolutions``: an adapted ``nn.Conv2d`` (3×3 ``A``, 1×1 ``B``, as peft builds them) computes one convolution
      with ``W + B A`` per model (:class:`_MergedConv`), channels-last, instead of the base's, A's and B's, where the
      factors' gradients are formed (``factor_gradients``): the seed CNN trained 1.4-1.5x faster on CIFAR-shaped
      images, 1.2-1.3x on 16², and 0.7-0.8x on digits' 8² (too few pixels a model; docs/performance.md §16).

    The same functions, rounded otherwise (about 1e-7 relative). The context is the calling thread's: the engine's
    forward passes only, never the per-model loop's.

    ``factor_gradients``: whether the backward pass forms the factors' gradients. False where it asks for the
    layers' output gradients only (DP-SGD's per-example pass, which derives the factors' from them and records the
    convolutions' factors as layers of their own): there a merged Linear layer is autograd's own, whose backward
    forms no gradient that is not asked for, where a custom function's forms one for every input that requires grad
    (20% of a dp-lora step, measured), and a Conv2d layer computes unmerged.
    """
    merged_linear = (_MergedLinear.apply if factor_gradients else _merged_linear) if linear else None
    token = _MERGING.set(_Merging(merged_linear, convolutions=convolutions and factor_gradients))
    try:
        yield
    finally:
        _MERGING.reset(token)


def merges(layer: nn.Module) -> bool:
    """Whether ``layer`` (an adapted layer of :func:`attach_lora`) is one product inside ``merged_adapters(linear)``.

    An ``nn.Linear`` base at scaling 1 whose forward is :func:`lora_forward`, which also leaves a call with more than
    the input unmerged. (The Conv2d layers that merge do so only where the factors' gradients are formed, never in
    the per-example pass that asks this.)
    """
    forward = vars(layer).get("forward")
    return getattr(forward, "__func__", None) is lora_forward and _mergeable_linear(layer)


def _mergeable_linear(layer: Any) -> bool:
    """An adapted layer whose adapter :func:`lora_forward` merges into its weight as a Linear: scaling 1."""
    return type(layer.base_layer) is nn.Linear and layer.scaling == {"default": 1.0}


def _mergeable_convolution(layer: Any) -> bool:
    """An adapted Conv2d at scaling 1 whose ``B A`` is a convolution like its base's: A its kernel, B 1×1.

    peft builds A with the base's kernel, stride, padding and dilation, and B as a 1×1 convolution; a grouped or
    string-padded base, or another padding mode, stays unmerged.
    """
    base, lora_a, lora_b = layer.base_layer, layer.lora_A["default"], layer.lora_B["default"]
    geometry = ("kernel_size", "stride", "padding", "dilation")
    return (
        type(base) is nn.Conv2d
        and type(lora_a) is nn.Conv2d
        and type(lora_b) is nn.Conv2d
        and layer.scaling == {"default": 1.0}
        and all(getattr(lora_a, name) == getattr(base, name) for name in geometry)
        and not isinstance(base.padding, str)
        and base.groups == lora_a.groups == 1
        and base.padding_mode == lora_a.padding_mode == "zeros"
        and _one_by_one(lora_b)
        and lora_a.bias is None
        and lora_b.bias is None
    )


def lora_forward(layer: Any, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """The LoRA forward of peft, ``base(x) + B(A(x)) · scaling``, with peft's numbers for Linear layers.

    peft multiplies by the scaling even when it is 1: an elementwise pass over every adapted layer's output, and its
    backward, per step (docs/performance.md); here only a scaling other than 1 is multiplied. Dropout is 0
    (:func:`attach_lora`), so peft's is the identity. Inside :func:`merged_adapters`, the adapter is merged into the
    weight. An unmerged Conv2d layer's factors run with padded channels (:func:`_channel_padded_update`).
    """
    lora_a, lora_b = layer.lora_A["default"], layer.lora_B["default"]
    base = layer.base_layer
    merging = _MERGING.get()
    if merging is not None and not args and not kwargs:
        if merging.linear is not None and _mergeable_linear(layer):
            return merging.linear(x, base.weight, base.bias, lora_b.weight, lora_a.weight)
        if merging.convolutions and _mergeable_convolution(layer):
            geometry = (base.stride, base.padding, base.dilation)
            return _MergedConv.apply(x, base.weight, base.bias, lora_b.weight, lora_a.weight, geometry)
    result = base(x, *args, **kwargs)
    x = layer._cast_input_dtype(x, lora_a.weight.dtype)
    update = _channel_padded_update(lora_a, lora_b, x) if type(lora_a) is nn.Conv2d else lora_b(lora_a(x))
    scaling = layer.scaling["default"]
    return (result + (update if scaling == 1 else update * scaling)).to(result.dtype)


def _models_first(info, in_dims, inputs) -> list:
    """A ``vmap`` rule's inputs with the models first: a tensor vmap passes once expanded (a view), others as given."""
    return [
        t
        if not isinstance(t, torch.Tensor)
        else t.expand(info.batch_size, *t.shape)
        if dim is None
        else t.movedim(dim, 0)
        for t, dim in zip(inputs, in_dims)
    ]


def _one_model(inputs) -> list:
    """One model's tensors as a batch of one model (the models first); others as given."""
    return [t.unsqueeze(0) if isinstance(t, torch.Tensor) else t for t in inputs]


def _merged_linear(x, weight, bias, lora_b, lora_a):
    """``x (W + B A)ᵀ + b``: an adapted Linear layer at scaling 1 as one GEMM (:func:`merged_adapters`)."""
    return nn.functional.linear(x, weight + lora_b @ lora_a, bias)


def _merged_products(x, weight, bias, lora_b, lora_a):
    """K models' ``x (W + B A)ᵀ + b``, each tensor with the models first: one batched GEMM, the bias inside it.

    vmap's rule for ``linear`` adds the bias in a pass of its own over the (K, rows, d_out) outputs; ``baddbmm`` starts
    each model's product from it (as ``addmm`` does for one model's rows in the per-model loop).
    """
    rows = x.reshape(x.shape[0], -1, x.shape[-1])
    merged = (weight + lora_b @ lora_a).mT
    products = torch.bmm(rows, merged) if bias is None else torch.baddbmm(bias.unsqueeze(-2), rows, merged)
    return products.view(*x.shape[:-1], weight.shape[-2])


def _merged_gradients(needs: tuple[bool, ...], grad, x, weight, lora_b, lora_a) -> tuple:
    """The gradients of :func:`_merged_products` that ``needs`` (x, W, b, B, A) asks for, the models first.

    Autograd's backward of the merged product forms the (d_out, d_in) gradient of ``W + B A`` and projects it on
    the factors. Where B alone trains (LoRA-FA), B's gradient is ``δᵀ (x Aᵀ)`` instead: r (d_in + d_out) products per
    row instead of d_in d_out, 1.4-1.9x faster at the byte-level transformer's layers (docs/performance.md §10),
    formed as ``((x Aᵀ)ᵀ δ)ᵀ``, which MKL runs 1.4-3.4x faster at r = 8, as fast at 16 (docs/performance.md §17).
    Where A trains too, the gradient of ``W + B A`` is formed once for both factors, as autograd does.
    """
    need_x, need_weight, need_bias, need_b, need_a = needs
    rows_grad = grad.reshape(grad.shape[0], -1, grad.shape[-1])
    rows_x = x.reshape(x.shape[0], -1, x.shape[-1])
    grad_x = (rows_grad @ (weight + lora_b @ lora_a)).view(x.shape) if need_x else None
    grad_bias = rows_grad.sum(1) if need_bias else None
    grad_weight = grad_b = grad_a = None
    if need_weight or need_a:
        merged_grad = rows_grad.mT @ rows_x
        grad_weight = merged_grad if need_weight else None
        grad_b = merged_grad @ lora_a.mT if need_b else None
        grad_a = lora_b.mT @ merged_grad if need_a else None
    elif need_b:
        grad_b = wide_product(rows_grad.mT, rows_x @ lora_a.mT)
    return grad_x, grad_weight, grad_bias, grad_b, grad_a


def _save_merged_inputs(ctx, inputs, output) -> None:
    """What the merged layers' backward reads: x, W, B and A (not the bias), and a convolution's geometry."""
    x, weight, _, lora_b, lora_a, *geometry = inputs
    ctx.save_for_backward(x, weight, lora_b, lora_a)
    ctx.geometry = geometry


def _merged_layer(name: str, products: Callable, gradients: Callable) -> type[torch.autograd.Function]:
    """The autograd function of a merged layer, written for one model, and its ``vmap`` rule.

    Under ``vmap`` (the engine's K models) the rule hands the K models' tensors, every one with the models first, to
    a second function that computes them together: ``products`` its forward pass, ``gradients`` (what
    ``needs_input_grad`` asks for, then the tensors saved by :func:`_save_merged_inputs`) its backward pass.
    """

    class Models(torch.autograd.Function):
        @staticmethod
        def forward(*inputs):
            return products(*inputs)

        setup_context = staticmethod(_save_merged_inputs)

        @staticmethod
        def backward(ctx, grad):
            return gradients(ctx.needs_input_grad, grad, *ctx.saved_tensors, *ctx.geometry)

    class Model(torch.autograd.Function):
        @staticmethod
        def forward(*inputs):
            return products(*_one_model(inputs))[0]

        setup_context = staticmethod(_save_merged_inputs)

        @staticmethod
        def backward(ctx, grad):
            batched = gradients(ctx.needs_input_grad, *_one_model((grad, *ctx.saved_tensors)), *ctx.geometry)
            return tuple(None if g is None else g[0] for g in batched)

        @staticmethod
        def vmap(info, in_dims, *inputs):
            return Models.apply(*_models_first(info, in_dims, inputs)), 0

    Models.__name__ = Models.__qualname__ = f"{name}s"
    Model.__name__ = Model.__qualname__ = name
    return Model


# ``x (W + B A)ᵀ + b``, a merged Linear adapter (merged_adapters) with B's gradient formed at rank r. Under vmap the
# K models' layers are one baddbmm each: 1.03-1.13x faster training steps of the byte-level transformer than vmap's
# own rules for the same function, whose ``linear`` adds the bias in a separate pass (docs/performance.md §15).
_MergedLinear = _merged_layer("_MergedLinear", _merged_products, _merged_gradients)


def _merged_kernels(weight, lora_b, lora_a) -> torch.Tensor:
    """K models' ``W + B A`` of a Conv2d adapter: B (K, c_out, r, 1, 1) times A (K, r, c_in, kh, kw), plus W."""
    return weight + (lora_b.flatten(2) @ lora_a.flatten(2)).view(lora_b.shape[0], *weight.shape[1:])


def _merged_convolutions(x, weight, bias, lora_b, lora_a, geometry):
    """K models' ``conv(x, W + B A) + b``, each tensor with the models first: one convolution per model.

    A convolution per model rather than one grouped over the K models: oneDNN runs grouped ones 1.2-1.7x slower and
    rounds a group's output otherwise as the number of groups changes (docs/performance.md §2, §8).
    """
    kernels = _merged_kernels(weight, lora_b, lora_a)
    return torch.stack(
        [
            nn.functional.conv2d(_channels_last(x[k]), kernels[k], None if bias is None else bias[k], *geometry)
            for k in range(x.shape[0])
        ]
    )


def _channels_last(images: torch.Tensor) -> torch.Tensor:
    """``images`` (B, C, H, W) laid out channels-last (themselves where they are), as a merged convolution takes them.

    oneDNN's kernels for channels-last images ran a 3-channel layer's convolution 7.5x faster than for NCHW ones and
    the others as fast, and torch's max-pooling of the channels-last outputs 11-16x faster (docs/performance.md §16).
    """
    return images.contiguous(memory_format=torch.channels_last)


def _merged_convolution_gradients(needs: tuple[bool, ...], grad, x, weight, lora_b, lora_a, geometry) -> tuple:
    """The gradients of :func:`_merged_convolutions` that ``needs`` (x, W, b, B, A) asks for, the models first.

    The input's and W's from the merged kernel (oneDNN's backward of one convolution); B's as ``Σ δ (A x)ᵀ`` over
    the images and pixels, with ``A x`` computed again (r channels); A's from ``Bᵀ δ`` through A's convolution. No
    (c_out, c_in, kh, kw) gradient of ``W + B A`` is formed unless W itself trains.
    """
    need_x, need_weight, need_bias, need_b, need_a = needs[:5]
    stride, padding, dilation = geometry
    # Under bf16 autocast δ is bf16 and the saved inputs may not be: oneDNN's backward takes one dtype.
    x, weight, lora_b, lora_a = (t.to(grad.dtype) for t in (x, weight, lora_b, lora_a))
    kernels = _merged_kernels(weight, lora_b, lora_a)
    per_model: dict[str, list[torch.Tensor]] = {name: [] for name in ("x", "weight", "bias", "b", "a")}
    for k in range(x.shape[0]):
        grad_k, x_k = _channels_last(grad[k]), _channels_last(x[k])
        if need_x or need_weight:
            grad_x, grad_weight, _ = torch.ops.aten.convolution_backward(
                grad_k, x_k, kernels[k], None, stride, padding, dilation, False, (0, 0), 1,
                (need_x, need_weight, False),
            )  # fmt: skip
            per_model["x"].append(grad_x)
            per_model["weight"].append(grad_weight)
        if need_bias:
            per_model["bias"].append(grad_k.sum((0, 2, 3)))
        if need_b or need_a:
            hidden = nn.functional.conv2d(x_k, lora_a[k], None, stride, padding, dilation)
            if need_b:
                per_model["b"].append((grad_k.flatten(2) @ hidden.flatten(2).mT).sum(0).view(lora_b.shape[1:]))
            if need_a:
                # Bᵀ δ at each pixel, laid out channels-last as δ and the images are
                rows = grad_k.flatten(2).mT @ lora_b[k].flatten(1)
                grad_hidden = rows.view(hidden.shape[0], *hidden.shape[2:], hidden.shape[1]).permute(0, 3, 1, 2)
                per_model["a"].append(
                    torch.ops.aten.convolution_backward(
                        grad_hidden, x_k, lora_a[k], None, stride, padding, dilation, False, (0, 0), 1,
                        (False, True, False),
                    )[1]
                )  # fmt: skip
    asked = (need_x, need_weight, need_bias, need_b, need_a)
    return tuple(torch.stack(per_model[name]) if need else None for name, need in zip(per_model, asked)) + (None,)


# ``conv(x, W + B A) + b``, a merged Conv2d adapter (merged_adapters) with B's gradient formed at rank r; its last
# argument the convolution's stride, padding and dilation. A convolution per model under vmap.
_MergedConv = _merged_layer("_MergedConv", _merged_convolutions, _merged_convolution_gradients)


def _one_by_one(layer: nn.Conv2d) -> bool:
    """Whether ``layer`` (LoRA's B of a Conv2d adapter) is a plain 1×1 convolution: a matrix on each pixel."""
    return layer.kernel_size == layer.stride == (1, 1) and layer.padding in ((0, 0), "valid") and layer.groups == 1


# Channels per group from which oneDNN's grouped convolutions round as single ones: 8 where it runs AVX2 kernels, 16
# where AVX-512 ones (a seed CNN alone and with 3 others differed at 8 on an AVX-512 machine); 16 serves both.
_CHANNEL_BLOCK = 16


def _channel_padded_update(lora_a: nn.Conv2d, lora_b: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``B(A(x))`` of a Conv2d adapter: A with its input and rank channels zero-padded to multiples of 16, B a GEMM.

    The same numbers with zeros added. Under ``vmap`` each factor is a grouped convolution over the K models, and
    oneDNN rounds a group's output otherwise from 2-3 groups on where a group's input or output channels are not a
    multiple of its kernels' block (an image's 3 channels, a rank of 4; 8 channels with AVX2, 16 with AVX-512), and
    a 1×1 convolution's backward otherwise with one group than with several (at 32 images of 32×32): a model's numbers
    depended on how many models it was trained with (docs/performance.md §8). B, a 1×1 convolution, is one matrix
    product per image over its pixels instead.
    """
    if lora_a.groups != 1 or lora_a.padding_mode != "zeros" or not _one_by_one(lora_b):
        return lora_b(lora_a(x))
    c_in, rank = lora_a.in_channels, lora_a.out_channels
    pad_in, pad_rank = -c_in % _CHANNEL_BLOCK, -rank % _CHANNEL_BLOCK
    a = nn.functional.pad(lora_a.weight, (0, 0, 0, 0, 0, pad_in, 0, pad_rank))
    if pad_in:
        x = nn.functional.pad(x, (0, 0, 0, 0, 0, pad_in))
    hidden = nn.functional.conv2d(x, a, None, lora_a.stride, lora_a.padding, lora_a.dilation).narrow(-3, 0, rank)
    # One (d_out, r) @ (r, pixels) product per image, batched over the images: the per-model loop and the engine
    # (which batches the models' images too) run the same products and sum B's gradient over images alike.
    weight, pixels = lora_b.weight.flatten(1), hidden.flatten(-2)
    return (weight.expand(*pixels.shape[:-2], *weight.shape) @ pixels).unflatten(-1, hidden.shape[-2:])

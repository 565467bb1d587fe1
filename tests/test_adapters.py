"""Merged Conv2d adapters (``dpaudit.models.adapters``): one convolution with ``W + B A`` per model, peft's numbers.

The merged Linear layers are tested on the transformer (tests/test_transformer.py).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn
from torch.func import functional_call, vmap

from dpaudit import models
from dpaudit.models import adapters

MODELS = 3


def _adapted(geometry: dict, trained: tuple[str, ...], dtype: torch.dtype) -> tuple[nn.Module, dict, dict]:
    """Two adapted convolutions of ``geometry``; the (K, ...) tensors ``trained`` names, and the frozen rest."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Conv2d(3, 6, 3, **geometry), nn.ReLU(), nn.Conv2d(6, 5, 3, **geometry)).to(dtype)
    module = models.attach_lora(base, models.LoraSpec(2))
    generator = torch.Generator().manual_seed(1)
    stacked = {
        # lora_B away from 0, where lora_A's gradients vanish; every model its own factors (and base tensors).
        name: 0.3 * torch.randn((MODELS, *p.shape), generator=generator, dtype=dtype)
        for name, p in module.named_parameters()
        if any(part in name for part in trained)
    }
    frozen = {name: p.detach() for name, p in module.named_parameters() if name not in stacked}
    return module, stacked, frozen


def _outputs_and_gradients(module, stacked, frozen, images):
    """The K models' outputs on their images, and the gradients of their squares' sum: the images', the trained."""
    trained = {name: t.detach().requires_grad_() for name, t in stacked.items()}
    images = images.detach().requires_grad_()
    outputs = vmap(lambda tensors, x: functional_call(module, {**frozen, **tensors}, (x,)))(trained, images)
    return outputs, torch.autograd.grad(outputs.square().sum(), [images, *trained.values()])


def _calls_of_base_layers(module: nn.Module) -> list:
    """A list that grows by one each time an adapted layer calls its base layer (which a merged one never does)."""
    calls: list = []
    for name, layer in module.named_modules():
        if name.endswith("base_layer"):
            layer.register_forward_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize(
    "geometry, merges",
    [
        ({"padding": 1}, True),
        ({"stride": 2}, True),
        ({"stride": 2, "padding": 1}, True),
        ({"padding": "same"}, False),  # a string padding stays peft's layer, with the same numbers
    ],
)
@pytest.mark.parametrize(
    "trained", [("lora_B",), ("lora_A", "lora_B"), ("lora_B", "base_layer.bias"), ("lora_B", "base_layer.weight")]
)
def test_a_merged_convolution_computes_peft_s_layer_and_its_gradients(geometry, merges, trained):
    """``conv(x, W + B A) + b`` for K models under vmap: peft's ``conv(x, W) + b + B (A x)`` in float64.

    The outputs and every gradient asked for; the base layer is never called where the adapter merges.
    """
    module, stacked, frozen = _adapted(geometry, trained, torch.float64)
    images = torch.randn(MODELS, 4, 3, 9, 9, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    calls = _calls_of_base_layers(module)
    with adapters.merged_adapters():
        merged, merged_gradients = _outputs_and_gradients(module, stacked, frozen, images)
    assert len(calls) == (0 if merges else 2)
    with adapters.merged_adapters(factor_gradients=False):  # DP-SGD's per-example pass: never merged
        _outputs_and_gradients(module, stacked, frozen, images)
    factored, factored_gradients = _outputs_and_gradients(module, stacked, frozen, images)
    assert len(calls) == (4 if merges else 6)
    torch.testing.assert_close(merged, factored, rtol=1e-12, atol=1e-12)
    for ours, peft in zip(merged_gradients, factored_gradients, strict=True):
        assert peft.abs().max() > 1e-3
        torch.testing.assert_close(ours, peft, rtol=1e-10, atol=1e-12)


def test_one_merged_model_outside_vmap_computes_peft_s_layer():
    """The merged layer of one model (no vmap): the same outputs and B's gradient as peft's layer."""
    module, stacked, frozen = _adapted({"padding": 1}, ("lora_B",), torch.float64)
    module.load_state_dict({**frozen, **{name: t[0] for name, t in stacked.items()}}, strict=False)
    images = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    factors = [p for name, p in module.named_parameters() if "lora_B" in name]
    calls, results = _calls_of_base_layers(module), []
    for context, base_calls in ((adapters.merged_adapters(), 0), (contextlib.nullcontext(), 2)):
        with context:
            outputs = models.forward(module, images)
            results.append((outputs, *torch.autograd.grad(outputs.square().sum(), factors)))
        assert len(calls) == base_calls
    for ours, peft in zip(*results, strict=True):
        torch.testing.assert_close(ours, peft, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("trained", [("lora_B",), ("lora_B", "base_layer.weight")])
def test_a_merged_convolution_trains_under_bf16_autocast_within_its_rounding(trained):
    """Under bf16 autocast (``--precision bf16``): float32 gradients, the float32 ones to bf16's rounding.

    Its backward pass gets bf16 output gradients, and float32 images and weights.
    """
    module, stacked, frozen = _adapted({"padding": 1}, trained, torch.float32)
    images = torch.randn(MODELS, 4, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    with adapters.merged_adapters():
        _, exact = _outputs_and_gradients(module, stacked, frozen, images)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, rounded = _outputs_and_gradients(module, stacked, frozen, images)
    for ours, reference in zip(rounded, exact, strict=True):
        assert ours.dtype == reference.dtype == torch.float32
        # bf16 keeps 8 bits (0.4% a rounding); measured at most 3% of a gradient's norm here (the images', W trained).
        assert (ours - reference).norm() < 0.1 * reference.norm()

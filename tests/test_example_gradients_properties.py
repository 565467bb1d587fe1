"""Per-example gradient representations against their own ``materialise()``: a property sweep over small shapes.

The mechanisms clip and sum per-example gradients through ``squared_norms``, ``weighted_sum``,
``add_weighted_sum`` and ``transformed_squared_norms`` without forming the gradients (the factored and blocked
forms exist for speed), so each of these must equal the same quantity computed from the materialised (K, b, ...)
gradients; so must a model's computed without the models' ``vmap``. The maths is compared in float64, to 1e-10
relative to the values' magnitude; a shorter sweep in float32 checks that the reduced precision stays within
float32 rounding of the same magnitude.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dpaudit.training import gradients as example_gradients

# Trained tensors of the test network (below), by parameterisation: LoRA-FA trains B only, LoRA trains both factors,
# full trains the Linear weights; "bias" also trains a bias, which is no Linear weight, so it takes the dense path.
TRAINED = {
    "lora-fa": ("lora_B.weight",),
    "lora": ("lora_A.weight", "lora_B.weight"),
    "full": ("base.weight", "head.weight"),
    "bias": ("base.weight", "base.bias"),
    # Layers whose per-example gradients are exactly zero: one the forward never calls, one whose output it drops.
    "unused": ("head.weight", "spare.weight", "ignored.weight"),
}


class _LoraNet(nn.Module):
    """``head(tanh(base(x) + B A x))``, averaged over positions when each example is a sequence (K, b, T, d_in).

    ``spare`` is never called and ``ignored``'s output never reaches the loss, as a user's model may leave a layer.

    Small and built in microseconds, unlike peft's wrapper; its factors are plain ``nn.Linear`` layers as peft's
    ``lora_A``/``lora_B`` are, so the engine takes the same factored path.
    """

    def __init__(self, d_in: int, d_out: int, rank: int, classes: int, bias: bool):
        super().__init__()
        self.base = nn.Linear(d_in, d_out, bias=bias)
        self.lora_A = nn.Linear(d_in, rank, bias=False)
        self.lora_B = nn.Linear(rank, d_out, bias=False)
        self.head = nn.Linear(d_out, classes, bias=bias)
        self.spare = nn.Linear(d_in, d_out, bias=False)
        self.ignored = nn.Linear(d_in, d_out, bias=False)

    def forward(self, x):
        self.ignored(x)
        hidden = torch.tanh(self.base(x) + self.lora_B(self.lora_A(x)))
        return self.head(hidden.mean(-2) if x.ndim == 3 else hidden)


@st.composite
def cases(draw):
    bias = draw(st.booleans())
    parameterization = draw(st.sampled_from([p for p in TRAINED if bias or p != "bias"]))
    widths = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))  # the blocks of a Poisson step
    return dict(
        models=draw(st.integers(1, 3)),
        widths=tuple(widths),
        d_in=draw(st.integers(1, 6)),
        d_out=draw(st.integers(1, 6)),
        rank=draw(st.integers(1, 4)),
        classes=draw(st.integers(2, 4)),
        positions=draw(st.sampled_from([None, 1, 3])),  # None: one vector per example; T: a sequence of T
        bias=bias,
        parameterization=parameterization,
        zero_fraction=draw(st.sampled_from([0.0, 0.5, 1.0])),  # of the coefficients (padding has weight 0)
        left_rows=draw(st.sampled_from([None, 1, 3])),
        right_columns=draw(st.sampled_from([None, 2, 5])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def _representations(case: dict, dtype: torch.dtype):
    """(name → (representation, its gradients by an independent route), trained names, K, b, generator).

    The trained tensors are perturbed away from their initial values so that no gradient is structurally zero.
    "padded" holds the first block's examples only, as a model's exact Poisson batch at the step's b slots: its
    other slots' gradients are zero.
    """
    generator = torch.Generator().manual_seed(case["seed"])
    torch.manual_seed(case["seed"])  # the network's initial weights
    k, b = case["models"], sum(case["widths"])
    module = _LoraNet(case["d_in"], case["d_out"], case["rank"], case["classes"], case["bias"]).to(dtype)
    module.requires_grad_(False)
    names = TRAINED[case["parameterization"]]
    parameters = dict(module.named_parameters())
    trainable = {
        name: parameters[name].expand(k, *parameters[name].shape)
        + torch.randn(k, *parameters[name].shape, generator=generator, dtype=dtype)
        for name in names
    }
    frozen = {name: p.expand(k, *p.shape) for name, p in parameters.items() if name not in names}
    vector = () if case["positions"] is None else (case["positions"],)
    x = torch.randn(k, b, *vector, case["d_in"], generator=generator, dtype=dtype)
    y = torch.randint(case["classes"], (k, b), generator=generator)
    w = torch.ones(k, b, dtype=dtype)  # unused by the per-example functions (the mechanism weighs examples)

    function = example_gradients.example_gradient_function(module, list(names))
    edges = torch.tensor((0, *case["widths"])).cumsum(0).tolist()
    blocks = tuple(function(trainable, frozen, x[:, i:j], y[:, i:j], w[:, i:j]) for i, j in zip(edges, edges[1:]))
    dense = example_gradients.gradient_function(module, per_example=True)(trainable, frozen, x, y, w)
    count = case["widths"][0]
    sampled_only = {name: torch.cat([g[:, :count], torch.zeros_like(g[:, count:])], 1) for name, g in dense.items()}
    representations = {
        "factored": (function(trainable, frozen, x, y, w), dense),
        "dense": (example_gradients.DenseExampleGradients(dense), dense),
        "blocked": (example_gradients.BlockedExampleGradients(blocks, case["widths"]), dense),
        "padded": (example_gradients.PaddedExampleGradients(blocks[0], count, b), sampled_only),
    }
    if k == 1:  # one model, computed without the models' vmap (a Poisson step's exact batches)
        alone = example_gradients.example_gradient_function(module, list(names), alone=True)
        representations["alone"] = (alone(trainable, frozen, x, y, w), dense)
    return representations, names, k, b, generator


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, tolerance: float):
    """Equal to ``tolerance`` relative to the larger of 1 and the expected values' magnitude (zeros included)."""
    scale = max(1.0, float(expected.abs().max())) if expected.numel() else 1.0
    torch.testing.assert_close(actual, expected, rtol=tolerance, atol=tolerance * scale)


def _check(case: dict, dtype: torch.dtype, tolerance: float):
    representations, names, k, b, generator = _representations(case, dtype)
    # The factored path is taken exactly when every trained tensor is a Linear weight.
    expected_type = (
        example_gradients.DenseExampleGradients if "base.bias" in names else example_gradients.LinearExampleGradients
    )
    assert type(representations["factored"][0]) is expected_type
    assert type(representations.get("alone", representations["factored"])[0]) is expected_type
    coefficients = torch.randn(k, b, generator=generator, dtype=dtype)
    coefficients *= torch.rand(k, b, generator=generator) >= case["zero_fraction"]
    scale = float(torch.randn((), generator=generator, dtype=torch.float64))
    for label, (gradients, independent) in representations.items():
        materialised = gradients.materialise()
        assert set(materialised) == set(names), label
        for name in names:
            assert materialised[name].shape[:2] == (k, b), (label, name)
            # The independent route (nested vmap(grad)) gives the same gradients.
            _assert_close(materialised[name], independent[name], tolerance)
        flat = torch.cat([materialised[name].flatten(2) for name in names], dim=-1)  # (K, b, every entry)

        _assert_close(gradients.squared_norms(), flat.square().sum(-1), tolerance)

        summed = gradients.weighted_sum(coefficients)
        assert set(summed) == set(names), label
        for name in names:
            _assert_close(summed[name], torch.einsum("kb,kb...->k...", coefficients, materialised[name]), tolerance)

        totals = {
            name: torch.randn(k, *materialised[name].shape[2:], generator=generator, dtype=dtype) for name in names
        }
        updated = {name: value.clone() for name, value in totals.items()}
        gradients.add_weighted_sum(updated, coefficients, scale)
        for name in names:
            expected = totals[name] + scale * torch.einsum("kb,kb...->k...", coefficients, materialised[name])
            _assert_close(updated[name], expected, tolerance)

        for name in (n for n in names if n.endswith(".weight")):  # ‖L g_i R‖² of a (d_out, d_in) weight
            d_out, d_in = materialised[name].shape[2:]
            left = (
                None
                if case["left_rows"] is None
                else torch.randn(k, case["left_rows"], d_out, generator=generator, dtype=dtype)
            )
            right = (
                None
                if case["right_columns"] is None
                else torch.randn(k, d_in, case["right_columns"], generator=generator, dtype=dtype)
            )
            product = materialised[name]
            if left is not None:
                product = torch.einsum("kpo,kboi->kbpi", left, product)
            if right is not None:
                product = torch.einsum("kboi,kiq->kboq", product, right)
            expected = product.square().sum((-2, -1))
            _assert_close(gradients.transformed_squared_norms(name, left, right), expected, tolerance)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(case=cases())
def test_representations_agree_with_their_materialised_gradients_in_float64(case):
    _check(case, torch.float64, 1e-10)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(case=cases())
def test_representations_agree_with_their_materialised_gradients_in_float32(case):
    # float32 has 24 bits (6e-8); the sums here run over at most a few dozen terms of magnitude ≤ the scale.
    _check(case, torch.float32, 1e-5)


@pytest.mark.parametrize("parameterization", ["lora-fa", "lora", "bias"])
@pytest.mark.parametrize("positions", [None, 3])
def test_one_model_computed_without_the_models_vmap_agrees_with_its_materialised_gradients(parameterization, positions):
    """The sweep's checks at K = 1, where the "alone" representation is built, factored and dense ("bias")."""
    case = dict(
        models=1,
        widths=(2, 3),
        d_in=4,
        d_out=3,
        rank=2,
        classes=3,
        positions=positions,
        bias=True,
        parameterization=parameterization,
        zero_fraction=0.5,
        left_rows=3,
        right_columns=2,
        seed=7,
    )
    _check(case, torch.float64, 1e-10)


def test_a_call_without_the_models_vmap_refuses_several_models():
    module = _LoraNet(3, 2, 1, 2, bias=False).requires_grad_(False)
    parameters = dict(module.named_parameters())
    trainable = {"lora_B.weight": parameters["lora_B.weight"].expand(2, 2, 1)}
    frozen = {name: p.expand(2, *p.shape) for name, p in parameters.items() if name not in trainable}
    alone = example_gradients.example_gradient_function(module, list(trainable), alone=True)
    x, y = torch.zeros(2, 4, 3), torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="must have K = 1"):
        alone(trainable, frozen, x, y, torch.ones(2, 4))

"""DP-SGD family: exact per-example gradients (vs opacus), Poisson sampling, clipping, noise-free limit, chunking."""

import copy
import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from dpaudit import data, models, seeding
from dpaudit.mechanisms.base import Step
from dpaudit.mechanisms.dpsgd import DpSgd, GaussianNoiseStream, clip_coefficients, dp_sgd, gaussian_noise
from dpaudit.mechanisms.prism import PrismMechanism
from dpaudit.mechanisms.wishart import NoisyProjection
from dpaudit.training import engine, sampling
from dpaudit.training import gradients as example_gradients


@pytest.fixture(scope="module")
def digits():
    return data.digits()


@pytest.fixture(scope="module")
def base(digits):
    return models.pretrain(models.mlp(64, 10, hidden=(32, 32)), digits.public.x, digits.public.y, epochs=5, seed=1)


def _perturbed(shadow: engine.ShadowModels) -> engine.ShadowModels:
    """Non-zero lora_B everywhere, so that every factor has a non-zero gradient."""
    generator = torch.Generator().manual_seed(1)
    shadow.trainable = {n: t + 0.1 * torch.randn(t.shape, generator=generator) for n, t in shadow.trainable.items()}
    return shadow


def _opacus_grad_samples(shadow: engine.ShadowModels, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Opacus's per-sample gradients of model 0 of ``shadow``; summed loss, so no 1/b scaling to undo."""
    from opacus import GradSampleModule

    module = shadow.model(0).train()  # opacus records activations in training mode only
    # peft's own layers: opacus records per-sample gradients through module calls, and our forward runs a
    # convolution adapter's B as matrix products (models.adapters._channel_padded_update), the same function.
    for layer in module.modules():
        vars(layer).pop("forward", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # opacus warns about the secure RNG it is not asked to use here
        sampled = GradSampleModule(module, loss_reduction="sum")
        nn.functional.cross_entropy(sampled(x), y, reduction="sum").backward()
    return {name.removeprefix("_module."): p.grad_sample for name, p in sampled.named_parameters() if p.requires_grad}


@pytest.mark.parametrize(
    "architecture,parameterization,path",
    [
        ("mlp", "full", "LinearExampleGradients"),
        ("mlp", "lora", "LinearExampleGradients"),
        ("mlp", "lora-fa", "LinearExampleGradients"),
        ("mlp", "full", "DenseExampleGradients"),
        ("cnn", "full", "DenseExampleGradients"),
        ("cnn", "lora", "DenseExampleGradients"),
    ],
)
def test_per_example_gradients_match_opacus(digits, base, architecture, parameterization, path):
    """Acceptance 3: one model's per-example gradients equal opacus's GradSampleModule's (float64, to 1e-10).

    The comparison is about the maths, so it runs in float64: in float32 the two libraries sum in different orders
    (opacus unfolds convolutions, torch's backward does not; BLAS kernels differ between machines and thread
    counts), which moved single elements by up to 2e-6 on another machine of the same kind.
    """
    if architecture == "cnn":
        module = models.seed_cnn(1, 10, image_size=8).double().eval().requires_grad_(False)
        x = torch.from_numpy(digits.private.x[:12].reshape(12, 1, 8, 8)).double()
    else:
        module, x = copy.deepcopy(base).double(), torch.from_numpy(digits.private.x[:12]).double()
    y = torch.from_numpy(digits.private.y[:12])
    randomness = seeding.shadow_randomness(0, range(1))
    shadow = _perturbed(engine.build(module, parameterization, models.LoraSpec(4), randomness, torch.device("cpu")))
    if path == "DenseExampleGradients":
        dense = example_gradients.gradient_function(shadow.module, per_example=True)
        ours = example_gradients.DenseExampleGradients(dense(shadow.trainable, shadow.frozen, x[None], y[None], None))
    else:
        ours = example_gradients.example_gradient_function(shadow.module, list(shadow.trainable))(
            shadow.trainable, shadow.frozen, x[None], y[None], None
        )
    assert type(ours).__name__ == path
    reference = _opacus_grad_samples(shadow, x, y)
    assert reference.keys() == shadow.trainable.keys()
    for name, grad_sample in reference.items():
        assert grad_sample.abs().max() > 1e-4
        assert ours.materialise()[name].dtype == torch.float64
        torch.testing.assert_close(ours.materialise()[name][0], grad_sample, atol=1e-10, rtol=1e-10)
    # the factored norms and sums agree with the materialised gradients
    materialised = example_gradients.DenseExampleGradients(ours.materialise())
    torch.testing.assert_close(ours.squared_norms(), materialised.squared_norms(), atol=1e-10, rtol=1e-10)
    coefficients = torch.linspace(0, 1, 12, dtype=x.dtype)[None]
    for name, total in ours.weighted_sum(coefficients).items():
        torch.testing.assert_close(total, materialised.weighted_sum(coefficients)[name], atol=1e-10, rtol=1e-10)


def test_poisson_batches_have_binomial_sizes_and_ignore_chunking():
    """Each member is drawn with rate q: batch sizes have mean Nq and variance Nq(1-q); draws are per model."""
    layout = sampling.PoissonLayout.for_members(719, 32)
    assert (layout.steps, layout.expected_batch_size) == (23, 32) and layout.sample_rate == 32 / 719
    # first block: P(Binomial(719, q) > 50) = 9.0e-4 <= 1e-3 < P(> 49) = 1.5e-3;
    # overflow blocks ⌈√(Nq(1-q))⌉ = ⌈5.53⌉ wide
    assert (layout.width, layout.overflow_width) == (50, 6)
    assert layout.blocks(50) == [slice(0, 50)] and layout.blocks(57) == [slice(0, 50), slice(50, 56), slice(56, 62)]
    membership = np.ones((16, 719), dtype=bool)
    randomness = seeding.shadow_randomness(11, range(16))
    sizes, first_batches = [], []
    for step, (index, weight) in enumerate(sampling.poisson_batches(membership, randomness, layout, epochs=5)):
        sizes.append(weight.sum(1))
        assert index.shape[1] == layout.blocks(int(weight.sum(1).max()))[-1].stop  # padded to its last block
        if step == 0:
            first_batches = [set(row[w > 0]) for row, w in zip(index, weight)]
    sizes = np.concatenate(sizes).astype(np.float64)  # 16 models x 115 steps = 1840 batch sizes
    mean, variance = 719 * layout.sample_rate, 719 * layout.sample_rate * (1 - layout.sample_rate)
    assert (mean, variance) == pytest.approx((32.0, 30.576), abs=1e-3)
    assert (sizes.mean(), sizes.var()) == pytest.approx((31.755, 31.353), abs=1e-3)  # these seeds' realisation
    assert abs(sizes.mean() - mean) < 4 * math.sqrt(variance / sizes.size)  # within 4 standard errors
    assert abs(sizes.var() / variance - 1) < 4 * math.sqrt(2 / sizes.size)
    alone = next(sampling.poisson_batches(membership[5:6], randomness[5:6], layout, epochs=1))
    assert set(alone[0][0][alone[1][0] > 0]) == first_batches[5]


def test_clipping_is_exact_per_example_over_all_trained_tensors(digits, base):
    randomness = seeding.shadow_randomness(0, range(3))
    shadow = _perturbed(engine.build(base, "lora", models.LoraSpec(4), randomness, torch.device("cpu")))
    x = torch.from_numpy(digits.private.x[:30].reshape(3, 10, 64))
    y = torch.from_numpy(digits.private.y[:30].reshape(3, 10))
    examples = example_gradients.example_gradient_function(shadow.module, list(shadow.trainable))(
        shadow.trainable, shadow.frozen, x, y, None
    )
    per_example = examples.materialise()
    weights = torch.ones(3, 10)
    weights[:, 7:] = 0  # padding
    clip = float(examples.squared_norms().sqrt().median())  # half of the examples get clipped
    expected = {}
    for name, g in per_example.items():
        expected[name] = torch.zeros_like(g[:, 0])
    for k in range(3):
        for i in range(7):
            norm = math.sqrt(sum(float(g[k, i].square().sum()) for g in per_example.values()))
            for name, g in per_example.items():
                expected[name][k] += g[k, i] * min(1.0, clip / norm)
    for name, total in examples.weighted_sum(clip_coefficients(examples, weights, clip)).items():
        torch.testing.assert_close(total, expected[name], atol=1e-5, rtol=1e-5)


def test_no_noise_and_no_clipping_is_plain_sgd_on_the_poisson_batches(digits, base):
    """Acceptance 3: σ = 0, C = inf → SGD with momentum on Σ_{i∈B} ℓ_i / b, B the Poisson batches."""
    x, y = digits.private.x[:300], digits.private.y[:300]
    membership = np.random.default_rng(0).random((3, len(y))) < 0.8
    randomness = seeding.shadow_randomness(4, range(3))
    config = sampling.TrainingConfig(epochs=2, batch_size=20, lr=0.05, schedule="constant")
    layout = sampling.BatchLayout.for_members(int(membership.sum(1).max()), config.batch_size)
    trained = engine.train(
        engine.build(base, "full", None, randomness, torch.device("cpu")),
        DpSgd(0.0, math.inf),
        x,
        y,
        membership,
        randomness,
        config,
        layout,
    )
    poisson = sampling.PoissonLayout.for_batch_layout(layout, config.batch_size)
    for k in range(3):
        module = copy.deepcopy(base)
        weights = [module.get_parameter(n).requires_grad_(True) for n in trained.trainable]
        optimiser = torch.optim.SGD(weights, lr=config.lr, momentum=config.momentum)
        batches = sampling.poisson_batches(membership[k : k + 1], randomness[k : k + 1], poisson, config.epochs)
        for index, weight in batches:
            batch = torch.from_numpy(index[0][weight[0] > 0])
            optimiser.zero_grad()
            loss = (
                nn.functional.cross_entropy(
                    module(torch.from_numpy(x)[batch]), torch.from_numpy(y)[batch], reduction="sum"
                )
                / poisson.expected_batch_size
            )
            loss.backward()
            optimiser.step()
        for name, weight in zip(trained.trainable, weights):
            torch.testing.assert_close(trained.trainable[name][k], weight.detach(), atol=1e-5, rtol=0)


POISSON_MECHANISMS = {
    "dp-sgd": lambda: dp_sgd("dp-sgd", 1.0, 1.0),
    "dp-lora": lambda: dp_sgd("dp-lora", 1.0, 1.0),
    "dp-lora-fa": lambda: dp_sgd("dp-lora-fa", 1.0, 1.0),
    "m2": lambda: NoisyProjection(4, 1.0, 1.0),
    "prism": lambda: PrismMechanism(1.0, 1.0),
}


@pytest.mark.usefixtures("single_torch_thread")  # as campaign workers train: thread count changes rounding
@pytest.mark.parametrize("rank", [4, 16])  # multiples of 4: at other ranks MKL's GEMMs round by memory offset
@pytest.mark.parametrize("first_block_overflow", [1e-3, 0.5])
@pytest.mark.parametrize("name", sorted(POISSON_MECHANISMS))
def test_dp_models_do_not_depend_on_their_batch_companions(digits, base, name, first_block_overflow, rank, monkeypatch):
    """Poisson batches, clipping and noise per model: a model does not depend on its batch companions.

    Each model trained alone is bit-identical to the same model
    trained at position 1, 3 or 4 of a chunk of 5 (where its tensors sit at other memory offsets). With a first
    block that half of the batches overflow, most steps run in several blocks whose number depends on the chunk.
    """
    monkeypatch.setattr(sampling, "_FIRST_BLOCK_OVERFLOW", first_block_overflow)
    x, y = digits.private.x[:200], digits.private.y[:200]
    membership = np.ones((5, len(y)), dtype=bool)
    membership[::2, -1] = False
    randomness = seeding.shadow_randomness(7, range(5))
    config = sampling.TrainingConfig(epochs=1, batch_size=25, lr=0.01)
    layout = sampling.BatchLayout.for_members(len(y), config.batch_size)
    mechanism = POISSON_MECHANISMS[name]()
    spec = models.LoraSpec(rank)

    def train(rows):
        shadow = engine.build(
            base, mechanism.parameterization, spec, [randomness[i] for i in rows], torch.device("cpu")
        )
        return engine.train(
            shadow, mechanism, x, y, membership[rows], [randomness[i] for i in rows], config, layout
        ).trainable

    together = train([0, 1, 2, 3, 4])
    for k in (1, 3, 4):
        alone = train([k])
        for tensor in together:
            assert torch.equal(together[tensor][k], alone[tensor][0]), (k, tensor)


def test_blocked_gradients_equal_one_block(digits, base):
    """A step computed in blocks (PoissonLayout.blocks) gives one pass's norms, sums and gradients.

    The sums are also accumulated into given
    totals; the gradients agree to float32 rounding (the blocks' GEMMs have other shapes).
    """
    randomness = seeding.shadow_randomness(0, range(3))
    shadow = _perturbed(engine.build(base, "lora", models.LoraSpec(4), randomness, torch.device("cpu")))
    x = torch.from_numpy(digits.private.x[:36].reshape(3, 12, 64))
    y = torch.from_numpy(digits.private.y[:36].reshape(3, 12))
    gradients = example_gradients.example_gradient_function(shadow.module, list(shadow.trainable))
    whole = gradients(shadow.trainable, shadow.frozen, x, y, None)
    widths = (7, 3, 2)
    blocks = example_gradients.BlockedExampleGradients(
        tuple(
            gradients(shadow.trainable, shadow.frozen, part_x, part_y, None)
            for part_x, part_y in zip(x.split(widths, 1), y.split(widths, 1))
        ),
        widths,
    )
    coefficients = torch.rand(3, 12, generator=torch.Generator().manual_seed(0))
    name = next(n for n in shadow.trainable if ".lora_B." in n)
    left, right = torch.randn(3, 5, shadow.trainable[name].shape[1]), torch.randn(3, 4, 2)
    torch.testing.assert_close(blocks.squared_norms(), whole.squared_norms(), rtol=1e-5, atol=0)
    torch.testing.assert_close(
        blocks.transformed_squared_norms(name, left, right),
        whole.transformed_squared_norms(name, left, right),
        rtol=1e-5,
        atol=0,
    )
    for tensor, total in blocks.weighted_sum(coefficients).items():
        torch.testing.assert_close(total, whole.weighted_sum(coefficients)[tensor], rtol=1e-5, atol=1e-6)
    for tensor, value in blocks.materialise().items():
        torch.testing.assert_close(value, whole.materialise()[tensor], rtol=1e-5, atol=1e-6)
    # accumulating ``scale · Σ`` into given totals (the DP noise) equals adding the sum, in every representation
    dense = example_gradients.DenseExampleGradients(whole.materialise())
    start = {
        tensor: torch.randn(t.shape, generator=torch.Generator().manual_seed(1))
        for tensor, t in shadow.trainable.items()
    }
    for examples in (whole, blocks, dense):
        totals = {tensor: t.clone() for tensor, t in start.items()}
        examples.add_weighted_sum(totals, coefficients, 0.25)
        assert totals.keys() == start.keys()
        for tensor, total in totals.items():
            expected = start[tensor] + 0.25 * whole.weighted_sum(coefficients)[tensor]
            torch.testing.assert_close(total, expected, rtol=1e-5, atol=1e-6)


def test_noise_has_std_sigma_c_over_b(digits, base):
    """With zero gradients the update is pure noise: per-entry std σC/b, each model its own draw."""
    zeros = example_gradients.DenseExampleGradients({"w": torch.zeros(2, 5, 300, 40)})
    mechanism = DpSgd(noise_multiplier=2.0, clip_norm=3.0)
    noise = mechanism.setup({"w": torch.Size([300, 40])}, seeding.shadow_randomness(0, range(2)))
    step = Step(zeros, torch.ones(2, 5), 0, expected_batch_size=4, parameters={"w": torch.zeros(2, 300, 40)})
    update = mechanism.transform(step, noise)["w"]
    assert update.std().item() == pytest.approx(2.0 * 3.0 / 4, rel=0.02)
    assert not torch.equal(update[0], update[1])


@pytest.mark.parametrize("steps", [None, 4])
def test_noise_drawn_ahead_equals_noise_drawn_in_place(steps):
    """The stream draws step t+1 on a background thread only when the run has one; the numbers are the same."""
    like = {"w": torch.zeros(3, 20, 7), "v": torch.zeros(3, 5)}
    in_place = [gaussian_noise(like, generators, 0.5) for generators in [_generators()] for _ in range(4)]
    stream = GaussianNoiseStream(_generators())
    for index, expected in enumerate(in_place):
        drawn = stream.draw(like, Step({}, torch.ones(3, 1), index, steps=steps), 0.5)
        assert drawn.keys() == expected.keys() and all(torch.equal(drawn[n], expected[n]) for n in expected)
        assert (stream._pending is not None) == (steps is not None and index < 3)


def _generators():
    return [model.torch("noise") for model in seeding.shadow_randomness(5, range(3))]

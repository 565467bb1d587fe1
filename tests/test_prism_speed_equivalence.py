"""PRISM's faster step paths equal the maths they replace: float64, fixed seeds.

The retraction's truncated SVD and Procrustes rotation from eigendecompositions of Gram matrices (vs
``torch.linalg.svd``), the tangent noise made ahead on the background thread (vs made in the step, also after the
factors changed), and the factored per-example gradients' products (vs the materialised gradients; a model's
norms do not depend on its position in the chunk).
"""

from __future__ import annotations

import pytest
import torch

from dpaudit import models, seeding
from dpaudit.mechanisms import prism
from dpaudit.mechanisms.base import Step
from dpaudit.mechanisms.prism import tangent as prism_tangent
from dpaudit.mechanisms.prism import update as prism_update
from dpaudit.training import engine
from dpaudit.training import gradients as example_gradients

DTYPE = torch.float64

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def _normal(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=DTYPE)


@pytest.mark.parametrize("size, rank", [(16, 8), (6, 3), (4, 4), (2, 1)])
def test_top_singular_triplets_are_the_svds(size, rank):
    core = _normal(5, size, size, seed=size + rank)
    left, values, right = prism_update._top_singular_triplets(core, rank)
    u, s, vt = torch.linalg.svd(core)
    assert (values - s[..., :rank]).abs().max() < 1e-12 * s.max()
    truncated = (u[..., :rank] * s[..., None, :rank]) @ vt[..., :rank, :]
    assert (left * values.unsqueeze(-2) @ right.mT - truncated).abs().max() < 1e-12 * s.max()
    eye = torch.eye(rank, dtype=DTYPE)
    assert (left.mT @ left - eye).abs().max() < 1e-12 and (right.mT @ right - eye).abs().max() < 1e-10


def test_a_zero_singular_value_gives_a_zero_right_vector_as_a_zero_factor_column():
    core = _normal(3, 6, 6, seed=1)
    core[..., -3:] = 0.0  # rank 3: a rank-4 truncation has one zero singular value
    _, values, right = prism_update._top_singular_triplets(core, 4)
    assert values[..., -1].abs().max() < 1e-7 and right[..., -1].abs().max() < 1e-7


def test_procrustes_rotation_is_u_vt_of_the_svd():
    matrix = _normal(7, 5, 5, seed=2)
    u, _, vt = torch.linalg.svd(matrix)
    assert (prism_update._procrustes_rotation(matrix) - u @ vt).abs().max() < 1e-10


def test_a_singular_alignment_still_gives_an_optimal_rotation():
    """A rank-deficient P (no inverse square root) takes U Vᵀ from the SVD: orthogonal, finite, tr(WᵀP) = ‖P‖_*."""
    matrix = _normal(3, 5, 5, seed=3)
    matrix[..., -2:] = 0.0
    rotation = prism_update._procrustes_rotation(matrix)
    identity = torch.eye(5, dtype=matrix.dtype)
    assert torch.isfinite(rotation).all() and (rotation.mT @ rotation - identity).abs().max() < 1e-10
    nuclear = torch.linalg.svdvals(matrix).sum(-1)
    assert (torch.einsum("kij,kij->k", rotation, matrix) - nuclear).abs().max() < 1e-10


@pytest.mark.parametrize(
    "values, tall, small",
    [
        ((5, 2), (5, 3), (3, 2)),  # unbatched
        ((2, 5, 2), (2, 5, 3), (2, 3, 2)),  # the engine's (K, d, r): baddbmm directly
        ((2, 5, 2), (5, 3), (3, 2)),  # shared operands broadcast
        ((4, 2, 5, 2), (2, 5, 3), (4, 1, 3, 2)),  # extra leading dims
    ],
)
def test_add_product_is_values_plus_alpha_times_the_product(values, tall, small):
    values, tall, small = (_normal(*shape, seed=i) for i, shape in enumerate((values, tall, small)))
    got = prism_tangent._add_product(values, tall, small, -0.5)
    assert got.shape == values.shape and (got - (values - 0.5 * tall @ small)).abs().max() < 1e-14


def _mechanism_setting(seed: int):
    base = models.mlp(6, 3, hidden=(8,)).double().requires_grad_(False)
    randomness = seeding.shadow_randomness(seed, range(2))
    shadow = engine.build(base, "lora", models.LoraSpec(2), randomness, torch.device("cpu"))
    params = {name: t.clone() for name, t in shadow.trainable.items()}
    mechanism = prism.PrismMechanism(noise_multiplier=1.0, clip_norm=0.5)
    state = mechanism.setup({name: t.shape[1:] for name, t in params.items()}, randomness)
    mechanism.initialise(params, state)
    return mechanism, state, params


def _step(params, index: int, followed: bool) -> Step:
    examples = {name: _normal(2, 5, *t.shape[1:], seed=100 * index + i) for i, (name, t) in enumerate(params.items())}
    weights = torch.ones(2, 5, dtype=DTYPE)
    return Step(
        example_gradients.DenseExampleGradients(examples), weights, index, 4.0, 3 if followed else index + 1, params
    )


def _three_steps(seed: int, moved: int | None, ahead: bool, reuse: bool) -> dict[str, torch.Tensor]:
    """Three steps of :func:`_mechanism_setting`'s models; the parameters after them.

    ``moved``: before the third step another writer moves the first module's lora_A (0) or lora_B (1) in place.
    ``ahead``: each step makes the next one's noise ahead. ``reuse`` False: every step recomputes the geometry.
    """
    mechanism, state, params = _mechanism_setting(seed)
    for index in range(3):
        if moved is not None and index == 2:
            name = state.modules[0][moved]
            params[name].add_(0.01 * _normal(*params[name].shape, seed=seed + 4))
        if not reuse:
            state.geometries = ()
        mechanism.update(params, _step(params, index, followed=ahead), state, learning_rate=0.05)
        assert (state.noise_ahead is not None) == (ahead and index < 2)
    return params


@pytest.mark.parametrize("moved", [None, 1])
def test_noise_made_ahead_equals_noise_made_in_the_step(moved):
    """Steps with the next noise made ahead (``followed``) give the numbers of steps that make it in place.

    With the factors moved between steps (not by the step), the normals drawn ahead are lifted again at the
    factors' new geometry: the same as drawing them in that step.
    """
    ahead, in_place = (_three_steps(3, moved, ahead=ahead, reuse=True) for ahead in (True, False))
    for name in ahead:
        assert torch.equal(ahead[name], in_place[name])


@pytest.mark.parametrize("moved", [None, 0])
def test_a_steps_geometry_is_reused_only_for_the_factors_it_wrote(moved):
    """The next step reuses the geometry a step returned only while the LoRA tensors are those it wrote.

    A tensor changed in place since (by another writer) gets its geometry recomputed: the numbers of steps that
    never reuse a geometry (float64 rounding apart: the reused geometry comes from the retraction, not a QR).
    """
    reused, fresh = (_three_steps(4, moved, ahead=False, reuse=reuse) for reuse in (True, False))
    for name in reused:
        torch.testing.assert_close(reused[name], fresh[name], rtol=0, atol=1e-12)


def _factored(models_: int, examples: int, d_out: int, d_in: int, positions: int = 0):
    shape = (models_, examples, *((positions,) if positions else ()))
    return example_gradients.LinearExampleGradients(
        {"w": _normal(*shape, d_in, seed=d_in)}, {"w": _normal(*shape, d_out, seed=d_out + 1)}
    )


@pytest.mark.parametrize(
    "d_out, d_in, positions",
    [(128, 8, 0), (8, 96, 0), (10, 8, 0), (40, 8, 3)],  # wide (grouped) and narrow products; a sequence layer
)
def test_factored_products_equal_the_materialised_gradients(d_out, d_in, positions):
    factored = _factored(3, 11, d_out, d_in, positions)
    dense = example_gradients.DenseExampleGradients(factored.materialise())
    left, right = _normal(3, 4, d_out, seed=5), _normal(3, d_in, 3, seed=6)
    for l_, r_ in ((None, None), (left, None), (None, right), (left, right)):
        got, want = factored.transformed_squared_norms("w", l_, r_), dense.transformed_squared_norms("w", l_, r_)
        assert ((got - want).abs() / want).max() < 1e-12
    coefficients = _normal(3, 11, seed=8)
    got, want = factored.weighted_sum(coefficients)["w"], dense.weighted_sum(coefficients)["w"]
    assert (got - want).abs().max() < 1e-12 * want.abs().max() and got.is_contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "examples, d_out, rows", [(50, 128, 8), (50, 10, 3), (7, 257, 5), (7, 10, 1)]
)  # rows not a multiple of 4 and odd sizes put models at misaligned offsets (MKL's GEMMs then differ unpadded)
def test_factored_norms_do_not_depend_on_the_models_position_in_the_chunk(dtype, examples, d_out, rows):
    """Each model's norms are bit for bit those it has alone, at every position of a chunk of 64."""
    factored = _factored(64, examples, d_out, 8)
    factored = example_gradients.LinearExampleGradients(
        {"w": factored.inputs["w"].to(dtype)}, {"w": factored.output_gradients["w"].to(dtype)}
    )
    left, right = _normal(64, rows, d_out, seed=9).to(dtype), _normal(64, 8, rows, seed=10).to(dtype)
    for left_, right_ in ((left, right), (None, right), (left, None)):
        together = factored.transformed_squared_norms("w", left_, right_)
        for k in range(64):
            alone = example_gradients.LinearExampleGradients(
                {"w": factored.inputs["w"][k : k + 1].clone()},
                {"w": factored.output_gradients["w"][k : k + 1].clone()},
            )
            alone_left, alone_right = (None if m is None else m[k : k + 1].clone() for m in (left_, right_))
            assert torch.equal(alone.transformed_squared_norms("w", alone_left, alone_right), together[k : k + 1])

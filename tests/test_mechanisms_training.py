"""M1/M2, the sketch, PRISM and --denoise as engine mechanisms: where the noise goes, limits, chunking."""

import math

import numpy as np
import pytest
import torch

from dpaudit import data, models, seeding
from dpaudit.mechanisms.base import Step
from dpaudit.mechanisms.dpsgd import DpSgd, clip_coefficients, denoise_update, dp_sgd
from dpaudit.mechanisms.nonprivate import lora_fa
from dpaudit.mechanisms.prism import PrismMechanism
from dpaudit.mechanisms.sketch import NoisyLoraFa
from dpaudit.mechanisms.wishart import NoisyProjection, WishartProjection
from dpaudit.studies.denoise_cosine import DenoiseCosineRecorder
from dpaudit.training import engine, sampling
from dpaudit.training import gradients as example_gradients


@pytest.fixture(scope="module")
def setting():
    d = data.digits()
    base = models.pretrain(models.mlp(64, 10, hidden=(32, 32)), d.public.x, d.public.y, epochs=5, seed=1)
    return base, d.private.x[:200], d.private.y[:200]


def _step(setting, randomness, parameterization="full", rank=4):
    """One real Step of per-example gradients (3 models, 10 examples each, 2 of them padding)."""
    base, x, y = setting
    shadow = engine.build(base, parameterization, models.LoraSpec(rank), randomness, torch.device("cpu"))
    k = len(randomness)
    examples = example_gradients.example_gradient_function(shadow.module, list(shadow.trainable))(
        shadow.trainable,
        shadow.frozen,
        torch.from_numpy(x[: 10 * k].reshape(k, 10, 64)),
        torch.from_numpy(y[: 10 * k].reshape(k, 10)),
        None,
    )
    weights = torch.ones(k, 10)
    weights[:, 8:] = 0
    return shadow, Step(examples, weights, 0, expected_batch_size=8, parameters=shadow.trainable)


def _row_space_residual(update: torch.Tensor, factors: torch.Tensor) -> float:
    """‖G (I - P_A)‖ / ‖G‖ per model, max: 0 iff every row of G lies in the row space of A (r × d_in)."""
    projector = factors.transpose(1, 2) @ torch.linalg.pinv(factors.transpose(1, 2))
    return float(((update - update @ projector).norm(dim=(1, 2)) / update.norm(dim=(1, 2))).max())


def test_m2_noise_is_projected_and_m1_noise_is_not(setting):
    """[W] Def. 3: M2 = (V + Ξ)M lies in the row space of A; M1 = VM + Ξ does not (noise added after)."""
    randomness = seeding.shadow_randomness(2, range(3))
    shadow, step = _step(setting, randomness)
    shapes = {name: t.shape[1:] for name, t in shadow.trainable.items()}
    for variant, inside in (("m2", True), ("m1", False)):
        mechanism = NoisyProjection(rank=4, noise_multiplier=1.0, clip_norm=1.0, variant=variant)
        state = mechanism.setup(shapes, randomness)
        update = mechanism.transform(step, state)
        for name, factors in state[1].items():
            residual = _row_space_residual(update[name], factors)
            assert residual < 1e-4 if inside else residual > 0.9


def test_noise_free_m2_is_the_wishart_projection_of_the_clipped_mean(setting):
    """σ = 0, C = inf, M fixed: M2's update is (Σ g_i / b) AᵀA with LoRA-FA's A (docs/theory.md §1.2 (b), §1.3)."""
    randomness = seeding.shadow_randomness(2, range(3))
    shadow, step = _step(setting, randomness)
    shapes = {name: t.shape[1:] for name, t in shadow.trainable.items()}
    mechanism = NoisyProjection(rank=4, noise_multiplier=0.0, clip_norm=math.inf, variant="m2")
    update = mechanism.transform(step, mechanism.setup(shapes, randomness))
    mean = {name: g / 8 for name, g in step.gradients.weighted_sum(step.weights).items()}
    projection = WishartProjection(rank=4)
    expected = projection.transform(Step(mean, step.weights, 0), projection.setup(shapes, randomness))
    for name in update:
        torch.testing.assert_close(update[name], expected[name], atol=1e-6, rtol=1e-5)


def test_resampled_projection_changes_every_step_and_fixed_does_not(setting):
    randomness = seeding.shadow_randomness(2, range(3))
    shadow, step = _step(setting, randomness)
    shapes = {name: t.shape[1:] for name, t in shadow.trainable.items()}
    for resample in (False, True):
        mechanism = NoisyProjection(4, 0.0, math.inf, "m2", resample=resample)
        state = mechanism.setup(shapes, randomness)
        first, second = mechanism.transform(step, state), mechanism.transform(step, state)
        assert all(torch.equal(first[n], second[n]) for n in first) is not resample


def test_sketch_adds_eta_z_to_lora_b_once(setting):
    """[S] Eq. 14: B̃ = B_T - ηZ with Z ~ N(0, σ_g²); σ_g = 0 is noise-free LoRA-FA bit for bit."""
    base, x, y = setting
    randomness = seeding.shadow_randomness(8, range(2))
    membership = np.ones((2, len(y)), dtype=bool)
    config = sampling.TrainingConfig(epochs=1, batch_size=50, lr=0.05)
    trained = {}
    for label, mechanism in (("lora-fa", lora_fa()), ("0", NoisyLoraFa(0.0)), ("3", NoisyLoraFa(3.0))):
        shadow = engine.build(base, "lora-fa", models.LoraSpec(4), randomness, torch.device("cpu"))
        trained[label] = engine.train(shadow, mechanism, x, y, membership, randomness, config).trainable
    noise = torch.cat([(trained["3"][n] - trained["lora-fa"][n]).flatten() for n in trained["3"]])
    assert all(torch.equal(trained["0"][n], trained["lora-fa"][n]) for n in trained["0"])
    assert noise.std().item() == pytest.approx(3.0 * 0.05, rel=0.05)


def test_denoise_cosine_recorder_compares_each_entry_with_itself(setting):
    """[D] Fig. 2's diagnostic on DP-LoRA compares each entry with itself.

    DP-LoRA has A and B of each layer: the sums' dicts list tensors in other orders
    than the parameters. The recorded improvement equals cos(Denoise(g̃), ḡ) - cos(g̃, ḡ) taken tensor by
    tensor.
    """
    randomness = seeding.shadow_randomness(4, range(3))
    shadow, step = _step(setting, randomness, "lora")
    shapes = {name: t.shape[1:] for name, t in shadow.trainable.items()}
    mechanism = dp_sgd("dp-lora", 0.3, 1.0)
    recorder = DenoiseCosineRecorder(mechanism)
    recorder.transform(step, recorder.setup(shapes, randomness))
    noisy = mechanism.transform(step, mechanism.setup(shapes, randomness))  # the same noise draw
    denoised = denoise_update(noisy, mechanism.entry_noise_std(step))
    clean = step.gradients.weighted_sum(clip_coefficients(step.gradients, step.weights, 1.0))

    def cosine(update):
        dots = sum((update[name] * clean[name]).flatten(1).sum(1) for name in clean)
        norms = [sum(t[name].square().flatten(1).sum(1) for name in clean).sqrt() for t in (update, clean)]
        return dots / (norms[0] * norms[1])

    torch.testing.assert_close(recorder.improvements[0], cosine(denoised) - cosine(noisy), rtol=0, atol=1e-5)
    assert recorder.improvements[0].abs().max() > 1e-3  # the denoiser changed the update


def test_denoise_preserves_each_update_norm_inside_the_engine(setting):
    """[D] Eq. 10's norm correction: same noise draw, denoised update has the noisy update's norm per matrix."""
    randomness = seeding.shadow_randomness(2, range(3))
    shadow, step = _step(setting, randomness)
    shapes = {name: t.shape[1:] for name, t in shadow.trainable.items()}
    plain, denoised = DpSgd(0.1, 1.0), DpSgd(0.1, 1.0, denoise=True)
    noisy = plain.transform(step, plain.setup(shapes, randomness))
    cleaned = denoised.transform(step, denoised.setup(shapes, randomness))
    changed = 0
    for name in noisy:
        torch.testing.assert_close(cleaned[name].norm(dim=(1, 2)), noisy[name].norm(dim=(1, 2)), rtol=1e-5, atol=0)
        changed += not torch.equal(cleaned[name], noisy[name])
    assert changed >= 1  # the shrinkage applied somewhere (above κ = 1.02 times the bulk edge)
    base, x, y = setting  # and it trains inside the engine
    membership = np.ones((3, len(y)), dtype=bool)
    config = sampling.TrainingConfig(epochs=1, batch_size=25, lr=0.05)
    trained = engine.train(
        engine.build(base, "full", None, randomness, torch.device("cpu")),
        denoised,
        x,
        y,
        membership,
        randomness,
        config,
    )
    assert all(torch.isfinite(t).all() for t in trained.trainable.values())


@pytest.fixture(scope="module")
def prism_runs(setting):
    base, x, y = setting
    membership = np.ones((4, len(y)), dtype=bool)
    membership[::2, -1] = False
    randomness = seeding.shadow_randomness(9, range(4))
    config = sampling.TrainingConfig(epochs=2, batch_size=25, lr=0.01)
    layout = sampling.BatchLayout.for_members(len(y), config.batch_size)
    mechanism = PrismMechanism(noise_multiplier=1.0, clip_norm=1.0)

    def run(rows):
        shadow = engine.build(base, "lora", models.LoraSpec(4), [randomness[i] for i in rows], torch.device("cpu"))
        return engine.train(shadow, mechanism, x, y, membership[rows], [randomness[i] for i in rows], config, layout)

    return run([0, 1, 2, 3]), run([1, 2])


def test_prism_trains_models_independently_of_their_chunk(prism_runs):
    together, alone = prism_runs
    for name in together.trainable:
        assert torch.equal(together.trainable[name][1:3], alone.trainable[name])


def test_prism_keeps_balanced_full_rank_factors(prism_runs):
    """The retraction refactors balanced ([P] Eq. 22): lora_B's AᵀA equals lora_A's BᵀB, rank r = 4."""
    together, _ = prism_runs
    for name, lora_A in together.trainable.items():
        if ".lora_A." not in name:
            continue
        lora_B = together.trainable[name.replace(".lora_A.", ".lora_B.")]
        gram_A, gram_B = lora_B.mT @ lora_B, lora_A @ lora_A.mT  # [P]'s A = lora_B, B = lora_Aᵀ
        torch.testing.assert_close(gram_A, gram_B, atol=1e-5, rtol=1e-4)
        assert torch.linalg.matrix_rank(lora_A).min() == 4

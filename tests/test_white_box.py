"""White-box audits: gradient canaries in the engine, their observations and scores, campaigns and one-run designs."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest
import torch
from scipy import stats

from accountants.validation import InvalidArgument
from attacks import white_box
from dpaudit import analysis, models
from dpaudit.campaign import runner
from dpaudit.config import CampaignConfig, Execution
from dpaudit.mechanisms.dpsgd import dp_sgd
from dpaudit.mechanisms.nonprivate import NonPrivate
from dpaudit.reporting import run_report
from dpaudit.seeding import shadow_randomness
from dpaudit.training import canaries as canary_lib
from dpaudit.training import engine, sampling
from dpaudit.training import gradients as example_gradients

# A small MLP on data whose feature 0 is 0 in every example: first-layer weights of column 0 get no real gradient.
_DIM, _CLASSES, _EXAMPLES = 6, 3, 40


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((_EXAMPLES, _DIM)).astype(np.float32)
    x[:, 0] = 0.0
    return x, rng.integers(_CLASSES, size=_EXAMPLES)


def _base() -> torch.nn.Module:
    torch.manual_seed(0)
    return models.mlp(_DIM, _CLASSES, hidden=(8,)).requires_grad_(False)


def _train(
    mechanism,
    membership,
    canary_membership,
    *,
    observe="steps",
    norm=1.0,
    batch_size=_EXAMPLES,
    epochs=3,
    indices=None,
    coordinates=(("0.weight", 0), ("0.weight", _DIM)),
    seed=0,
):
    """Train models ``indices`` (default all) with Dirac canaries at ``coordinates``; their observations."""
    x, y = _data()
    indices = np.arange(len(membership)) if indices is None else np.asarray(indices)
    randomness = shadow_randomness(seed, indices)
    shadow = engine.build(_base(), "full", None, randomness, torch.device("cpu"))
    run = None
    if canary_membership is not None:
        canaries = canary_lib.GradientCanaries(norm, coordinates=coordinates)
        run = canary_lib.CanaryRun(canaries, canary_membership[indices], observe)
    layout = sampling.BatchLayout.for_members(int(membership.sum(axis=1).max()), batch_size)
    config = sampling.TrainingConfig(epochs=epochs, batch_size=batch_size, lr=0.1, schedule="constant")
    engine.train(shadow, mechanism, x, y, membership[indices], randomness, config, layout, canaries=run)
    return shadow


def test_dirac_examples_agree_with_their_dense_form():
    """Every PerExampleGradients operation of the sparse Dirac canaries equals the dense computation (float64)."""
    rng = np.random.default_rng(1)
    k = 3
    shapes = {"a.weight": torch.Size((k, 4, 5)), "b.weight": torch.Size((k, 2, 3, 2))}
    coordinates = (("a.weight", 7), ("b.weight", 11), ("a.weight", 0))
    parameters = {name: torch.zeros(shape, dtype=torch.float64) for name, shape in shapes.items()}
    sparse = canary_lib.GradientCanaries(2.5, coordinates=coordinates).examples(parameters)
    dense = example_gradients.DenseExampleGradients(sparse.materialise())
    assert dense.tensors["a.weight"].shape == (k, 3, 4, 5)
    assert dense.tensors["a.weight"][:, 0].flatten(1)[:, 7].tolist() == [2.5] * k
    torch.testing.assert_close(sparse.squared_norms(), dense.squared_norms())
    coefficients = torch.from_numpy(rng.standard_normal((k, 3)))
    for name, value in dense.weighted_sum(coefficients).items():
        torch.testing.assert_close(sparse.weighted_sum(coefficients)[name], value)
    totals = {name: torch.from_numpy(rng.standard_normal(tuple(shape))) for name, shape in shapes.items()}
    expected = {name: t.clone() for name, t in totals.items()}
    sparse.add_weighted_sum(totals, coefficients, 0.3)
    dense.add_weighted_sum(expected, coefficients, 0.3)
    for name in shapes:
        torch.testing.assert_close(totals[name], expected[name])
    left = torch.from_numpy(rng.standard_normal((k, 3, 2)))
    right = torch.from_numpy(rng.standard_normal((k, 6, 4)))
    for l_, r_ in ((None, None), (left, None), (None, right), (left, right)):
        torch.testing.assert_close(
            sparse.transformed_squared_norms("b.weight", l_, r_), dense.transformed_squared_norms("b.weight", l_, r_)
        )
    tensors = {name: torch.from_numpy(rng.standard_normal(tuple(shape))) for name, shape in shapes.items()}
    projected = sparse.project(tensors)
    assert projected[:, 0].tolist() == tensors["a.weight"].flatten(1)[:, 7].tolist()
    assert projected[:, 1].tolist() == tensors["b.weight"].flatten(1)[:, 11].tolist()


def test_random_direction_is_a_unit_vector_and_projects_exactly():
    shapes = {"a.weight": torch.Size((4, 5)), "b.weight": torch.Size((3,))}
    direction = canary_lib.random_direction(shapes, np.random.default_rng(0))
    assert sum(float(t.double().square().sum()) for t in direction.values()) == pytest.approx(1.0, abs=1e-6)
    examples = canary_lib.GradientCanaries(3.0, direction=direction).examples(
        {name: torch.zeros(2, *shape) for name, shape in shapes.items()}
    )
    assert examples.squared_norms()[:, 0].tolist() == pytest.approx([9.0, 9.0], rel=1e-6)
    moved = {name: torch.stack([u, -2 * u]) for name, u in direction.items()}
    assert examples.project(moved)[:, 0].tolist() == pytest.approx([1.0, -2.0], rel=1e-6)


def test_full_batch_dp_sgd_releases_the_clipped_canary_in_in_models_only():
    """At q = 1, σ = 0 and canary norm 10 C, an IN model's every update moves its canary coordinate by exactly C/b.

    A mechanism that skipped clipping would show 10 C/b; real examples never reach the coordinate (feature 0 is 0).
    """
    membership = np.ones((4, _EXAMPLES), dtype=bool)
    canary_membership = np.array([[True, False], [False, False], [True, True], [False, True]])
    clip = 0.5
    shadow = _train(dp_sgd("dp-sgd", 0.0, clip), membership, canary_membership, norm=10 * clip)
    observed = shadow.canary_observations.numpy()
    assert observed.shape == (4, 3, 2)  # 3 steps (epochs of one full batch), 2 canaries
    expected = canary_membership[:, None, :] * (clip / _EXAMPLES)
    np.testing.assert_allclose(observed, np.broadcast_to(expected, observed.shape), rtol=1e-6, atol=0)


def test_poisson_canary_is_sampled_at_rate_q_from_its_own_stream():
    """At q = 1/4 over 80 steps, an IN model's canary steps number about qT, each released whole (C/b)."""
    membership = np.ones((2, _EXAMPLES), dtype=bool)
    canary_membership = np.array([[True, True], [False, False]])
    shadow = _train(dp_sgd("dp-sgd", 0.0, 1.0), membership, canary_membership, batch_size=10, epochs=20)
    observed = shadow.canary_observations.numpy()
    assert observed.shape == (2, 80, 2)
    assert not observed[1].any()
    sampled = observed[0] != 0
    np.testing.assert_allclose(observed[0][sampled], 1.0 / 10, rtol=1e-6)
    assert 20 - 3 * np.sqrt(15) < sampled[:, 0].sum() < 20 + 3 * np.sqrt(15)
    assert not np.array_equal(sampled[:, 0], sampled[:, 1])  # canaries sampled independently


def test_out_models_and_chunks_are_bit_identical_to_training_without_canaries():
    """An OUT model's canaries add exact zeros; observations do not depend on the models trained together.

    An OUT model's weights equal those of a run without canaries, bit for bit.
    """
    membership = np.ones((4, _EXAMPLES), dtype=bool)
    canary_membership = np.array([[True, True], [False, False], [True, False], [False, False]])
    mechanism = dp_sgd("dp-sgd", 1.0, 1.0)
    together = _train(mechanism, membership, canary_membership, batch_size=10)
    plain = _train(mechanism, membership, None, batch_size=10)
    for name, weights in plain.trainable.items():
        assert torch.equal(together.trainable[name][[1, 3]], weights[[1, 3]])
    # IN models moved at the canary coordinates only: feature 0 is always 0, so nothing else sees the canary.
    moved = together.trainable["0.weight"][0] != plain.trainable["0.weight"][0]
    assert moved.nonzero().tolist() == [[0, 0], [1, 0]]
    for chunk in ([0, 1], [2, 3]):
        alone = _train(mechanism, membership, canary_membership, batch_size=10, indices=chunk)
        assert torch.equal(alone.canary_observations, together.canary_observations[chunk])


def test_batch_mean_mechanism_gets_the_canary_once_per_epoch_as_one_more_example():
    """Shuffled batches: an IN model's canary is in exactly one batch per epoch, as one more example of the mean."""
    membership = np.ones((2, _EXAMPLES), dtype=bool)
    canary_membership = np.array([[True, False], [False, False]])
    shadow = _train(NonPrivate(), membership, canary_membership, batch_size=10, epochs=3, norm=2.0)
    observed = shadow.canary_observations.numpy()  # 4 steps per epoch, batches of 10 members
    assert observed.shape == (2, 12, 2)
    assert not observed[1].any() and not observed[0, :, 1].any()
    per_epoch = observed[0, :, 0].reshape(3, 4)
    assert ((per_epoch != 0).sum(axis=1) == 1).all()
    np.testing.assert_allclose(per_epoch[per_epoch != 0], 2.0 / 11, rtol=1e-6)


def test_weight_observation_is_the_momentum_sum_of_the_clipped_canary():
    """At σ = 0, q = 1 an IN model's canary coordinate moves by -η Σ_t v_t (v_t = 0.9 v_{t-1} + C/b); OUT: 0."""
    membership = np.ones((2, _EXAMPLES), dtype=bool)
    canary_membership = np.array([[True, True], [False, False]])
    shadow = _train(dp_sgd("dp-sgd", 0.0, 1.0), membership, canary_membership, observe="weights", epochs=4)
    velocity, moved = 0.0, 0.0
    for _ in range(4):
        velocity = 0.9 * velocity + 1.0 / _EXAMPLES
        moved -= 0.1 * velocity
    observed = shadow.canary_observations.numpy()
    assert observed.shape == (2, 1, 2)
    np.testing.assert_allclose(observed[0, 0], [moved, moved], rtol=1e-5)
    assert not observed[1].any()
    assert (white_box.weight_change_scores(observed)[0] > 0).all()


def test_step_likelihood_ratio_is_the_exact_log_ratio_of_the_two_hypotheses():
    """The score equals log p_IN(x) - log p_OUT(x) of the Gaussian mixture, and at q = 1 an affine map of Σ x_t."""
    rng = np.random.default_rng(3)
    x = rng.normal(0.0, 0.5, (5, 7, 2))
    q, s, tau = 0.3, 0.4, 0.5
    mixture = np.log((1 - q) * stats.norm.pdf(x, 0, tau) + q * stats.norm.pdf(x, s, tau)) - stats.norm.logpdf(x, 0, tau)
    np.testing.assert_allclose(white_box.step_likelihood_ratio_scores(x, q, s, tau), mixture.sum(axis=1), rtol=1e-12)
    full = white_box.step_likelihood_ratio_scores(x, 1.0, s, tau)
    np.testing.assert_allclose(full, (s * x.sum(axis=1) - 7 * s * s / 2) / tau**2, rtol=1e-12)
    with pytest.raises(InvalidArgument, match="sample_rate"):
        white_box.step_likelihood_ratio_scores(x, 0.0, s, tau)


def test_momentum_step_score_sums_the_fresh_releases_of_a_bias_corrected_moving_average():
    """Steps x_t = m_t / (1 - β^t), m_t = β m_(t-1) + (1 - β) g_t: the score is (1 - β) Σ_t g_t exactly."""
    rng = np.random.default_rng(4)
    fresh = rng.normal(0.0, 1.0, (5, 6, 2))
    beta, moment, steps = 0.9, np.zeros((5, 2)), []
    for t in range(6):
        moment = beta * moment + (1 - beta) * fresh[:, t]
        steps.append(moment / (1 - beta ** (t + 1)))
    scores = white_box.momentum_step_scores(np.stack(steps, axis=1), beta)
    np.testing.assert_allclose(scores, (1 - beta) * fresh.sum(axis=1), rtol=1e-12)
    # β = 0 is no average: the plain sum.
    np.testing.assert_allclose(white_box.momentum_step_scores(fresh, 0.0), fresh.sum(axis=1), rtol=1e-12)


def _campaign(tmp_path, name, **options):
    config = CampaignConfig(mechanism="dp-sgd", canary="gradient", lr=0.05, **options)
    store = runner.run(config, Execution(workers=1, chunk_size=64, progress=False), tmp_path / name)
    return run_report.write_run(analysis.analyse(store), store.root), store


def test_full_batch_step_audit_sees_the_gaussian_mechanism(tmp_path):
    """At q = 1 on digits, per-step projections are exactly N(0, τ²) OUT and N(s, τ²) IN: a nearly tight audit.

    The Dirac canary sits on an always-zero pixel's weight. Fast version of benchmarks/bench_white_box.py's case (a).
    """
    numbers, store = _campaign(tmp_path, "full", models=64, epochs=2, batch_size=718, noise=0.5, clip=1.0)
    plan, outputs = store.plan(), store.outputs()
    x = outputs.canary_observations[:, :, 0] * 718  # in units of C/b = 1/718: IN mean 1, std σ = 0.5
    member = plan.membership[:, 0]
    assert stats.kstest(x[~member].ravel(), stats.norm(0, 0.5).cdf).pvalue > 0.01
    assert stats.kstest(x[member].ravel(), stats.norm(1, 0.5).cdf).pvalue > 0.01
    assert numbers["canary"] == "gradient" and numbers["observe"] == "steps" and numbers["attack"] == "white-box"
    assert numbers["member_accuracy"] is None
    analytic = numbers["analytic_epsilon"]  # μ = √2 / 0.5 = 2.83: ε ≈ 12.7
    assert 0.3 * analytic < numbers["epsilon_lower_bound_gdp"] <= analytic
    assert numbers["audit_tightness"] == pytest.approx(numbers["epsilon_lower_bound_gdp"] / analytic)
    json.loads((store.root / "summary.json").read_text(), parse_constant=_no_constant)


def _no_constant(token):
    raise AssertionError(f"{token} in summary.json")


def test_one_run_gradient_canaries_bound_epsilon_in_one_run_and_null_gives_zero(tmp_path):
    """With M = 300 Dirac canaries in 2 runs, both one-run bounds are in (0, analytic ε]; a null campaign gives 0.

    Fast version of benchmarks/bench_white_box.py's case (c).
    """
    options = dict(models=2, epochs=2, batch_size=718, noise=0.5, clip=1.0, design="one-run", canaries=300)
    numbers, store = _campaign(tmp_path, "one-run", **options)
    analytic = numbers["analytic_epsilon"]
    for key in ("epsilon_lower_bound_one_run", "epsilon_lower_bound_one_run_fdp"):
        assert 0 < numbers[key] <= analytic
    assert numbers["epsilon_lower_bound"] is None and numbers["verdict"] == "consistent"
    assert store.plan().membership.shape == (2, 300)
    null, _ = _campaign(tmp_path, "null", null=True, **options)
    assert null["epsilon_lower_bound_one_run"] == 0 and null["epsilon_lower_bound_one_run_fdp"] == 0


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--canary", "gradient", "--observe", "outputs"], "--canary gradient needs --observe weights or steps"),
        (["--observe", "weights"], "--observe weights needs --canary gradient"),
        (["--design", "one-run"], "--design one-run needs --canaries M"),
        (["--canaries", "10"], "--canaries applies to --design one-run"),
        (["--canary", "gradient", "--design", "all-examples"], "--canary gradient applies to the canary and one-run"),
        (["--canary", "gradient", "--mechanism", "sketch"], "--observe steps does not apply to the sketch"),
        (
            ["--canary", "gradient", "--canary-direction", "tangent", "--mechanism", "dp-lora"],
            "--canary-direction tangent lies in the tangent space of LoRA factors",
        ),
        (
            ["--canary", "gradient", "--canary-direction", "tangent", "--design", "one-run", "--canaries", "4"],
            "--design one-run needs orthogonal canaries",
        ),
        (
            [
                "--canary",
                "gradient",
                "--design",
                "one-run",
                "--canaries",
                "300",
                "--mechanism",
                "dp-lora-fa",
                "--rank",
                "1",
            ],
            "--canaries 300 exceeds the 266 coordinates",
        ),
    ],
)
def test_senseless_white_box_options_are_one_line_usage_errors(tmp_path, capsys, arguments, message):
    from dpaudit.cli import main

    assert main(["audit", "--models", "2", "--out", str(tmp_path / "run"), *arguments]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


# The fields of run format 2's campaign.json, before white-box campaigns.
_FORMAT_2_FIELDS = (
    "mechanism dataset rank alpha models epochs batch_size lr momentum seed delta null design precision noise clip"
    " denoise resample_projection"
).split()


def test_campaigns_recorded_before_the_white_box_fields_keep_their_hash():
    config = CampaignConfig(mechanism="dp-sgd", models=8)
    older = {name: value for name, value in dataclasses.asdict(config).items() if name in _FORMAT_2_FIELDS}
    assert config.canonical_hash() == hashlib.sha256(json.dumps(older, sort_keys=True).encode()).hexdigest()
    assert CampaignConfig(mechanism="dp-sgd", models=8, canary="gradient").canonical_hash() != config.canonical_hash()


# PRISM's gradient canaries are gradients of the adapted weights (docs/theory.md §3.9).
_PRISM_SCALE = 2.0


def _prism_parameters(k: int = 2):
    """A LoRA MLP's (K, ...) float64 trained tensors after PRISM's start, and the mechanism (rank 4, s = 2)."""
    from dpaudit.mechanisms.prism import PrismMechanism

    randomness = shadow_randomness(0, np.arange(k))
    shadow = engine.build(_base(), "lora", models.LoraSpec(4, _PRISM_SCALE), randomness, torch.device("cpu"))
    params = {name: t.double().clone() for name, t in shadow.trainable.items()}
    mechanism = PrismMechanism(noise_multiplier=1.0, clip_norm=1.0, lora_scale=_PRISM_SCALE)
    state = mechanism.setup({name: t.shape[1:] for name, t in params.items()}, randomness)
    mechanism.initialise(params, state)
    return params, mechanism, state


def test_adapted_weight_canary_has_a_real_examples_factor_gradients():
    """Autograd on a peft model (float64) for a loss whose weight gradient is G gives the canary's factor gradients."""
    import peft

    torch.manual_seed(1)
    layer = torch.nn.Sequential(torch.nn.Linear(6, 5)).double()
    config = peft.LoraConfig(r=3, lora_alpha=3 * _PRISM_SCALE, lora_dropout=0.0, target_modules=["0"])
    model = peft.get_peft_model(layer, config).double()
    names = {"A": "base_model.model.0.lora_A.default.weight", "B": "base_model.model.0.lora_B.default.weight"}
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        parameters[names["B"]].normal_()  # peft starts lora_B at 0, which would hide lora_A's gradient
    inputs, output_gradients = torch.randn(7, 6, dtype=torch.float64), torch.randn(7, 5, dtype=torch.float64)
    (output_gradients * model(inputs)).sum().backward()  # ∂ℓ/∂W = G = Σ_t δ_t x_tᵀ (full rank)
    weight_gradient = output_gradients.T @ inputs
    unit = weight_gradient / torch.linalg.matrix_norm(weight_gradient)
    canary = canary_lib.AdaptedWeightCanaries(
        {names["A"]: unit.unsqueeze(0)}, float(_PRISM_SCALE * torch.linalg.matrix_norm(weight_gradient)), _PRISM_SCALE
    )
    trained = {name: parameters[name].detach().unsqueeze(0) for name in names.values()}
    factor = canary.factor_gradients(trained).materialise()
    for name in names.values():
        torch.testing.assert_close(factor[name][0, 0], parameters[name].grad, rtol=1e-12, atol=1e-12)


def test_prism_clips_an_adapted_weight_canary_at_its_lifted_intrinsic_norm(monkeypatch):
    """The norm PRISM clips each canary by is ``norm ‖P(u)‖`` at the current factors (float64), for every module.

    A crafted Dirac on lora_B (PRISM's earlier factor-space canary) was clipped by less than its lift's norm; a
    weight-space canary's factor gradients come from one G, so Eq. 15 is exact for it.
    """
    from dpaudit.mechanisms import prism
    from dpaudit.mechanisms.base import Step
    from dpaudit.mechanisms.prism.tangent import tangent_project

    params, mechanism, state = _prism_parameters()
    a_names = [name for name in params if ".lora_A." in name]
    coordinates = ((a_names[0], 0), (a_names[0], 13), (a_names[1], 5))
    rng = np.random.default_rng(3)
    random = {
        name: torch.from_numpy(rng.standard_normal((params[name.replace("lora_A", "lora_B")].shape[1], d_in)))
        for name in a_names
        for d_in in [params[name].flatten(2).shape[2]]
    }
    total = float(np.sqrt(sum(float(u.square().sum()) for u in random.values())))
    random = {name: u / total for name, u in random.items()}
    recorded = []
    original = prism.clip_factors
    monkeypatch.setattr(prism, "clip_factors", lambda norms, clip: recorded.append(norms) or original(norms, clip))
    for canaries in (
        canary_lib.GradientCanaries(0.7, coordinates=coordinates, lora_scale=_PRISM_SCALE),
        canary_lib.GradientCanaries(0.7, direction=random, lora_scale=_PRISM_SCALE),
    ):
        weights = canaries.examples(params)
        assert isinstance(weights, canary_lib.AdaptedWeightCanaries)
        expected = torch.zeros(2, canaries.count, dtype=torch.float64)
        for (a_name, b_name), rank in zip(state.modules, state.ranks):
            lora_A, lora_B = params[a_name].flatten(2)[:, :rank], params[b_name].flatten(2)[..., :rank]
            if a_name in weights.directions:
                directions = weights.directions[a_name].unsqueeze(0)  # (1, M, d_out, d_in)
                projected = tangent_project(directions, lora_B.unsqueeze(1), lora_A.mT.unsqueeze(1))
                expected += projected.square().sum((-2, -1))
        step = Step(weights.factor_gradients(params), torch.ones(2, canaries.count, dtype=torch.float64), 0, 1.0, 1)
        mechanism.update({name: t.clone() for name, t in params.items()}, step, state, 1e-3)
        torch.testing.assert_close(recorded[-1], 0.7 * expected.sqrt(), rtol=1e-10, atol=0)
        # Not trivially the full norm: P drops part of u on the 8×6 layer at r = 4, and none on the 3×8 head at
        # r_ℓ = 3, where the tangent space is every matrix.
        partial = expected[:, :2] if canaries.coordinates is not None else expected
        assert bool((partial < 0.999).all())
        if canaries.coordinates is not None:
            torch.testing.assert_close(expected[:, 2], torch.ones(2, dtype=torch.float64))


def test_prism_white_box_campaign_is_consistent_and_its_observations_agree(tmp_path):
    """A tiny PRISM step audit on digits (one full-batch step): not violated; IN and OUT differ; weights = -η steps.

    The canary (a Dirac at an always-zero pixel's weight) moves IN models' Z: Welch's t-test separates them. With
    one step, the weight change along u is exactly -η times the step's projection (both read ⟨Z, u⟩).
    """
    options = dict(models=32, epochs=1, batch_size=718, noise=0.5, clip=1.0, lr=0.01)
    observed = {}
    for observe in ("steps", "weights"):
        config = CampaignConfig(mechanism="prism", canary="gradient", observe=observe, **options)
        store = runner.run(config, Execution(workers=1, chunk_size=64, progress=False), tmp_path / observe)
        numbers = run_report.write_run(analysis.analyse(store), store.root)
        assert numbers["verdict"] != "violated" and numbers["analytic_epsilon"] > 0
        observed[observe] = store.outputs().canary_observations[:, :, 0]
        member = store.plan().membership[:, 0]
    assert observed["steps"].shape == (32, 1)
    np.testing.assert_allclose(observed["weights"], -0.01 * observed["steps"], rtol=1e-6, atol=1e-12)
    steps = observed["steps"][:, 0]
    assert stats.ttest_ind(steps[member], steps[~member], equal_var=False).pvalue < 0.01


def test_tangent_canary_is_a_unit_rank_one_direction_in_each_models_tangent_space(monkeypatch):
    """The canary u vᵀ at each model's start: unit, fixed by the tangent projection, quietest u and v, clipped whole.

    Float64 identities: ``P(u vᵀ) = u vᵀ`` at every model's factors (so PRISM clips the canary at exactly its norm),
    ``‖u vᵀ‖ = 1``, u minimises ``uᵀ Γ u`` over unit vectors of col(A) (Γ the output-side gram) and the factor
    gradients are peft's chain rule of the model's own direction.
    """
    from dpaudit.mechanisms import prism
    from dpaudit.mechanisms.base import Step
    from dpaudit.mechanisms.prism.tangent import tangent_project

    params, mechanism, state = _prism_parameters(k=3)
    (a_name, b_name), rank = state.modules[0], state.ranks[0]
    lora_A, lora_B = params[a_name].flatten(2)[:, :rank], params[b_name].flatten(2)[..., :rank]
    rng = np.random.default_rng(5)
    grams = [torch.from_numpy(g @ g.T) for g in (rng.standard_normal((n, 2 * n)) for n in (lora_B.shape[1], _DIM))]
    canaries = canary_lib.GradientCanaries(
        0.7, lora_scale=_PRISM_SCALE, tangent=canary_lib.TangentCanary(a_name, *grams)
    )
    weights = canaries.examples(params)
    assert isinstance(weights, canary_lib.AdaptedWeightCanaries) and list(weights.directions) == [a_name]
    direction = weights.directions[a_name][:, 0]  # (K, d_out, d_in)
    torch.testing.assert_close(torch.linalg.matrix_norm(direction), torch.ones(3, dtype=torch.float64))
    torch.testing.assert_close(tangent_project(direction, lora_B, lora_A.mT), direction, rtol=0, atol=1e-12)
    assert float((direction[0] - direction[1]).abs().max()) > 0.1  # each model's own tangent space
    # u (a column of u vᵀ, normalised) is the unit vector of col(A) with the least Γ energy.
    u = direction[:, :, 0] / torch.linalg.vector_norm(direction[:, :, 0], dim=1, keepdim=True)
    basis = torch.linalg.qr(lora_B)[0]
    lowest = torch.linalg.eigvalsh(basis.mT @ grams[0] @ basis)[:, 0]
    torch.testing.assert_close(torch.einsum("ko,op,kp->k", u, grams[0], u), lowest, rtol=1e-10, atol=0)
    factor = weights.factor_gradients(params).materialise()
    expected_B = 0.7 * direction @ params[a_name].flatten(2).mT
    torch.testing.assert_close(factor[b_name][:, 0].flatten(2), expected_B, rtol=1e-12, atol=1e-14)
    recorded = []
    original = prism.clip_factors
    monkeypatch.setattr(prism, "clip_factors", lambda norms, clip: recorded.append(norms) or original(norms, clip))
    step = Step(weights.factor_gradients(params), torch.ones(3, 1, dtype=torch.float64), 0, 1.0, 1)
    mechanism.update({name: t.clone() for name, t in params.items()}, step, state, 1e-3)
    torch.testing.assert_close(recorded[-1], torch.full((3, 1), 0.7, dtype=torch.float64), rtol=1e-10, atol=0)


def test_tangent_canary_audits_prism_where_the_dirac_barely_does(tmp_path, capsys):
    """A seeded PRISM step audit (digits, 32 models, one full-batch step, σ = 0.5): tangent AUC far above the Dirac's.

    Only ≈ 0.42 of a Dirac lies in PRISM's tangent space (docs/theory.md §3.9). ``--canary-direction tangent``
    goes through the CLI into the campaign's store and back (what ``dpaudit resume`` and ``report`` read).
    """
    from dpaudit.campaign.store import RunStore
    from dpaudit.cli import main

    options = "--models 32 --epochs 1 --batch-size 718 --noise 0.5 --clip 1 --rank 8 --workers 1 --json".split()
    auc = {}
    for direction in ("dirac", "tangent"):
        argv = ["audit", "--mechanism", "prism", "--canary", "gradient", "--canary-direction", direction, *options]
        assert main([*argv, "--out", str(tmp_path / direction)]) == 0
        numbers = json.loads(capsys.readouterr().out)
        assert numbers["verdict"] != "violated"
        assert numbers["white_box_statistic"].startswith("sum of the adaptive rule's fresh steps")
        assert RunStore(tmp_path / direction).config().canary_direction == direction
        auc[direction] = numbers["auc"]
    assert auc["tangent"] > auc["dirac"] + 0.15, auc

"""Planted DP bugs (catalogue.MUTANTS): each does what it says, is recorded and reported, and the audit sees it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from dpaudit import models
from dpaudit.campaign import plan as campaign_plan
from dpaudit.campaign import resolve as resolver
from dpaudit.config import CampaignConfig, load_toml
from dpaudit.errors import UsageError
from dpaudit.mechanisms import catalogue, mutants
from dpaudit.mechanisms.base import Mechanism, Step
from dpaudit.seeding import shadow_randomness
from dpaudit.training import engine, sampling
from dpaudit.training.gradients import DenseExampleGradients
from tests.claims import analytic_bound

SIGMA, CLIP, B = 2.0, 1.5, 4.0  # σ, C and the expected batch size b of the mechanism-level tests
K, ENTRIES = 3, 20_000  # models, and entries of the one trained tensor "w"


def _mechanism(mutant: str | None):
    """dp-sgd (σ, C) as resolver.mechanism makes it, with ``mutant`` planted (None: the correct mechanism)."""
    config = CampaignConfig(mechanism="dp-sgd", noise=SIGMA, clip=CLIP, batch_size=int(B), mutant=mutant)
    return resolver.mechanism(config)


def _releases(mutant: str | None, gradients: torch.Tensor, steps: int, sampled: torch.Tensor | None = None):
    """The released updates of ``steps`` steps whose per-example gradients are ``gradients`` (K, b, ENTRIES).

    ``sampled`` (K, b): the example weights (default all 1); every step has the same examples, so that what differs
    between steps is the noise.
    """
    mechanism = _mechanism(mutant)
    state = mechanism.setup({"w": torch.Size([ENTRIES])}, shadow_randomness(0, range(K)))
    weights = torch.ones(gradients.shape[:2]) if sampled is None else sampled
    parameters = {"w": torch.zeros(K, ENTRIES)}
    expected = None if mechanism.sampling == "shuffle" else B  # what the engine passes for each sampling
    return [
        mechanism.transform(
            Step(DenseExampleGradients({"w": gradients}), weights, t, expected, steps, parameters), state
        )["w"]
        for t in range(steps)
    ]


def _zero_gradients() -> torch.Tensor:
    return torch.zeros(K, 2, ENTRIES)


def test_every_mutant_wraps_the_dp_sgd_family_only_and_is_hashed():
    """Each mutant wraps dp-sgd / dp-lora / dp-lora-fa in a MutatedDpSgd, changes the hash, is refused elsewhere."""
    correct = CampaignConfig(mechanism="dp-lora")
    hashes = {correct.canonical_hash()}
    for name in catalogue.MUTANTS:
        config = CampaignConfig(mechanism="dp-lora", mutant=name)
        built = resolver.mechanism(config)
        assert isinstance(built, mutants.MutatedDpSgd) and built.mutant is catalogue.MUTANTS[name]
        assert (built.name, built.parameterization) == ("dp-lora", "lora")
        hashes.add(config.canonical_hash())
        assert config.differences(correct) == [f"mutant: {name!r} → None"]
    assert len(hashes) == len(catalogue.MUTANTS) + 1
    assert CampaignConfig(mechanism="dp-lora").canonical_hash() == correct.canonical_hash()
    with pytest.raises(UsageError, match="mutant 'half-noise' is planted in dp-sgd, dp-lora, dp-lora-fa"):
        CampaignConfig(mechanism="prism", mutant="half-noise")
    with pytest.raises(UsageError, match="with --denoise"):
        CampaignConfig(mechanism="dp-sgd", denoise=True, mutant="half-noise")
    with pytest.raises(ValueError, match="mutant must be one of half-noise"):
        CampaignConfig(mechanism="dp-sgd", mutant="quarter-noise")


def test_neither_a_toml_file_nor_the_command_line_can_plant_a_mutant(tmp_path, capsys):
    from dpaudit.cli import main

    path = tmp_path / "campaign.toml"
    path.write_text('mechanism = "dp-sgd"\nmutant = "half-noise"\n')
    with pytest.raises(UsageError, match="'mutant' plants a DP bug on purpose .* remove the key"):
        load_toml(path)
    assert main(["audit", "--config", str(path), "--out", str(tmp_path / "run")]) == 2
    assert "'mutant' plants a DP bug on purpose" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["audit", "--mechanism", "dp-sgd", "--mutant", "half-noise", "--out", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --mutant half-noise" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_half_noise_draws_half_the_std():
    """The released update of zero gradients is the noise: its std is σC/(2b), half the correct one's σC/b."""
    (correct,) = _releases(None, _zero_gradients(), 1)
    (half,) = _releases("half-noise", _zero_gradients(), 1)
    target = SIGMA * CLIP / B
    # Sample std of n = K·ENTRIES normals: relative standard error 1/sqrt(2n) = 0.0029; 1.5% is 5 standard errors.
    assert float(correct.double().std()) == pytest.approx(target, rel=0.015)
    assert float(half.double().std()) == pytest.approx(target / 2, rel=0.015)
    # The same normals from the same stream, drawn at half the std.
    torch.testing.assert_close(half, correct / 2, rtol=1e-6, atol=0.0)


def test_skip_noise_every_10_releases_no_noise_on_steps_0_10_20():
    steps = 23
    correct = _releases(None, _zero_gradients(), steps)
    skipped = _releases("skip-noise-every-10", _zero_gradients(), steps)
    for t in range(steps):
        if t % 10 == 0:
            assert torch.count_nonzero(skipped[t]) == 0, t
        else:
            assert torch.equal(skipped[t], correct[t]), t  # the other steps' noise is the correct stream's
            assert float(skipped[t].double().std()) == pytest.approx(SIGMA * CLIP / B, rel=0.015)


def test_reused_noise_is_bit_identical_across_steps_and_adds_the_gradients_every_step():
    steps = 5
    correct = _releases(None, _zero_gradients(), steps)
    reused = _releases("reused-noise", _zero_gradients(), steps)
    for t in range(steps):
        assert torch.equal(reused[t], correct[0]), t
    assert not torch.equal(correct[1], correct[0])
    # With gradients: each step is the first draw plus the same clipped sum (nothing is added into the kept draw).
    gradients = torch.zeros(K, 2, ENTRIES)
    gradients[:, :, 0] = 0.5  # norm 0.5 < C: clipping leaves them whole
    with_gradients = _releases("reused-noise", gradients, steps)
    for t in range(steps):
        torch.testing.assert_close(with_gradients[t][:, 0], correct[0][:, 0] + 2 * 0.5 / B, rtol=0, atol=1e-6)
        assert torch.equal(with_gradients[t][:, 1:], correct[0][:, 1:])


def test_no_clipping_sums_the_gradients_whole_with_the_claimed_noise():
    """Clipping coefficients all 1: the update is the correct noise σC/b plus Σ_i w_i g_i / b with ‖g_i‖ = 10 C."""
    gradients = torch.zeros(K, 2, ENTRIES)
    gradients[:, 0, 0] = 10 * CLIP
    gradients[:, 1, 1] = -10 * CLIP
    sampled = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    (correct,) = _releases(None, gradients, 1, sampled)
    (unclipped,) = _releases("no-clipping", gradients, 1, sampled)
    difference = (unclipped - correct).double()
    # The correct mechanism adds C/b per sampled example, the mutant 10 C/b: the difference is 9 C/b there.
    expected = torch.zeros(K, ENTRIES, dtype=torch.float64)
    expected[:, 0] = 9 * CLIP / B * sampled[:, 0]
    expected[:, 1] = -9 * CLIP / B * sampled[:, 1]
    torch.testing.assert_close(difference, expected, rtol=0, atol=1e-5)
    (noise_only,) = _releases(None, _zero_gradients(), 1)
    torch.testing.assert_close(unclipped[:, 2:], noise_only[:, 2:], rtol=0, atol=0)


def _visits(mechanism, members: int, epochs: int, batch_size: int) -> list[np.ndarray]:
    """Per step, which pool examples model 0's batch holds, read off its per-example gradients in the engine.

    The pool is the one-hot rows e_i of a single Linear layer: example i's weight gradient δ_i e_iᵀ is non-zero in
    column i only, so the columns of the sampled examples' gradients name them.
    """
    steps: list[np.ndarray] = []

    class Recording(Mechanism):
        name, parameterization, per_example = mechanism.name, mechanism.parameterization, True
        sampling = mechanism.sampling

        def setup(self, shapes, randomness):
            return mechanism.setup(shapes, randomness)

        def transform(self, step, state):
            gradients = step.example_gradients().materialise()["0.weight"][0]  # (b, classes, members)
            columns = gradients.abs().sum(1).argmax(-1).numpy()
            steps.append(np.sort(columns[step.weights[0].numpy() > 0]))
            return mechanism.transform(step, state)

    x = np.eye(members, dtype=np.float32)
    y = np.arange(members) % 2
    torch.manual_seed(0)
    base = models.mlp(members, 2, hidden=()).requires_grad_(False)
    randomness = shadow_randomness(0, [0])
    shadow = engine.build(base, "full", None, randomness, torch.device("cpu"))
    training = sampling.TrainingConfig(epochs=epochs, batch_size=batch_size, lr=0.01, schedule="constant")
    engine.train(shadow, Recording(), x, y, np.ones((1, members), dtype=bool), randomness, training)
    return steps


def test_shuffle_as_poisson_visits_every_member_once_per_epoch_and_is_accounted_at_q_b_over_n():
    members, epochs, batch_size = 24, 3, 4
    config = CampaignConfig(
        mechanism="dp-sgd", noise=SIGMA, clip=CLIP, batch_size=batch_size, epochs=epochs, mutant="shuffle-as-poisson"
    )
    steps = _visits(resolver.mechanism(config), members, epochs, batch_size)
    per_epoch = members // batch_size
    assert len(steps) == epochs * per_epoch
    for epoch in range(epochs):
        visited = np.concatenate(steps[epoch * per_epoch : (epoch + 1) * per_epoch])
        np.testing.assert_array_equal(np.sort(visited), np.arange(members))
    # The correct mechanism's Poisson batches, same settings: members are not all visited once per epoch.
    poisson = _visits(
        resolver.mechanism(CampaignConfig(mechanism="dp-sgd", batch_size=batch_size)), members, 1, batch_size
    )
    assert sorted(np.concatenate(poisson).tolist()) != list(range(members))
    # The accountant is the correct mechanism's: Poisson rate q = b/N over T = epochs·N/b steps.
    from accountants import dpsgd

    layers = campaign_plan.layer_shapes(models.mlp(members, 2, hidden=()))
    claimed = analytic_bound(config, members, layers)
    expected = dpsgd.epsilon(SIGMA, batch_size / members, epochs * per_epoch, config.delta).epsilon
    assert claimed.epsilon == expected
    assert claimed == analytic_bound(dataclasses.replace(config, mutant=None), members, layers)


def test_shuffle_as_poisson_divides_the_clipped_sum_by_b():
    gradients = torch.zeros(K, 2, ENTRIES)
    gradients[:, :, 0] = 0.25
    (shuffled,) = _releases("shuffle-as-poisson", gradients, 1)
    (correct,) = _releases(None, gradients, 1)
    torch.testing.assert_close(shuffled, correct, rtol=0, atol=0)  # the same noise, and 2 · 0.25 / b added
    (noise_only,) = _releases(None, _zero_gradients(), 1)
    torch.testing.assert_close(shuffled[:, 0] - noise_only[:, 0], torch.full((K,), 2 * 0.25 / B), rtol=0, atol=1e-6)


# -- the audit catches them -------------------------------------------------------------------------------------
# One full-batch step (q = 1, b = N = 227 breast-cancer examples) of dp-sgd with a Dirac gradient canary observed at
# every step, 100 IN + 100 OUT models: ~2 s a campaign. At q = 1 the claimed mechanism is exactly the Gaussian
# mechanism, μ-GDP with μ = √T/σ (the canary moves the clipped sum by C, the noise is σC).


def _audit(tmp_path_factory, mutant: str | None, noise: float, canary_norm: float | None):
    from dpaudit import analysis
    from dpaudit.campaign import runner
    from dpaudit.config import Execution

    config = CampaignConfig(
        mechanism="dp-sgd",
        dataset="breast-cancer",
        models=200,
        epochs=1,
        batch_size=227,
        noise=noise,
        clip=1.0,
        canary="gradient",
        observe="steps",
        canary_norm=canary_norm,
        mutant=mutant,
    )
    out = tmp_path_factory.mktemp(mutant or "correct") / "run"
    store = runner.run(config, Execution(device="cpu", workers=1, progress=False), out)
    return store, analysis.analyse(store)


@pytest.fixture(scope="module")
def no_clipping_audits(tmp_path_factory):
    """no-clipping and the correct mechanism at σ = 2 (claimed ε = 1.99 at δ = 1e-5), canary norm 10 C."""
    return {mutant: _audit(tmp_path_factory, mutant, 2.0, 10.0) for mutant in ("no-clipping", None)}


def test_the_audit_finds_no_clipping_violated_and_the_correct_mechanism_not(no_clipping_audits):
    """The unclipped canary shifts an IN step by 10 C/b against noise 2 C/b (μ = 5): IN and OUT separate.

    Chance of a false verdict: the correct mechanism is found violated with probability ≤ 5% (Clopper-Pearson at
    95%) + 2.5% (the AUC's lower limit); the mutant was missed in 0 of 300 simulated audits of its scores.
    """
    store, mutated = no_clipping_audits["no-clipping"]
    _, correct = no_clipping_audits[None]
    assert mutated.analytic == correct.analytic and mutated.analytic.epsilon == pytest.approx(1.993, abs=1e-3)
    assert mutated.verdict.outcome == "violated"
    assert mutated.bound.epsilon > mutated.analytic.epsilon
    assert correct.verdict.outcome == "consistent"
    assert correct.bound.epsilon < correct.analytic.epsilon


def test_the_audit_finds_half_noise_violated_and_the_correct_mechanism_not(tmp_path_factory):
    """At σ = 1 the claim is μ = 1 (ε = 4.38 at δ = 1e-5); half the noise makes it μ = 2, outside the claimed profile.

    The verdict tests the ROC against the claimed mechanism's whole privacy profile (here μ-GDP's, q = 1), which a
    single (ε, δ) cannot do: 100 + 100 trials certify at most ε = 2.73, and at 2000 + 2000 a μ = 2 mechanism shows
    only CP ε ≈ 3 < 4.38 (benchmarks/bench_mutants.py). Chance of a false outcome: the correct mechanism is found
    violated with probability ≤ 5% + 2.5% (simultaneous bounds over the K = 3 white-box statistics, and the AUC
    route); simulated μ = 2 scores against the claim at 1 - 0.05/3 were missed in 30 of 300 seeds, μ = 1 scores
    found violated in 0 of 300.
    """
    _, mutated = _audit(tmp_path_factory, "half-noise", 1.0, None)
    _, correct = _audit(tmp_path_factory, None, 1.0, None)
    assert mutated.analytic == correct.analytic and mutated.analytic.epsilon == pytest.approx(4.377, abs=1e-3)
    judged = mutated.verdict
    assert judged.outcome == "violated", judged.reason
    assert "allows" in judged.reason and "the claimed σ = 1 (q = 1, T = 1)" in judged.reason
    assert mutated.bound.epsilon < mutated.analytic.epsilon  # the single (ε, δ) pair is not what refutes it
    assert correct.verdict.outcome == "consistent", correct.verdict.reason


def test_a_mutated_run_is_recorded_reported_first_and_never_resumed_as_a_correct_one(no_clipping_audits, capsys):
    import json

    from dpaudit.campaign import runner
    from dpaudit.cli import main
    from dpaudit.config import Execution
    from dpaudit.reporting import run_report
    from dpaudit.reporting import summary as run_summary

    store, mutated = no_clipping_audits["no-clipping"]
    recorded = json.loads((store.root / "campaign.json").read_text())
    assert recorded["config"]["mutant"] == "no-clipping"
    assert recorded["config_hash"] == mutated.config.canonical_hash()
    numbers = run_report.write_run(mutated, store.root)
    assert next(iter(numbers)) == "planted_bug" and numbers["planted_bug"].startswith("PLANTED BUG, on purpose")
    assert (store.root / "report.md").read_text().splitlines()[0].startswith("**run: PLANTED BUG, on purpose")
    assert '<body>\n<p class="planted-bug"><strong>run: PLANTED BUG' in (store.root / "report.html").read_text()
    assert main(["analyse", str(store.root)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == numbers["planted_bug"]
    correct_config = dataclasses.replace(mutated.config, mutant=None)
    with pytest.raises(UsageError, match="mutant: 'no-clipping' → None"):
        runner.run(correct_config, Execution(device="cpu", workers=1, progress=False), store.root)
    _, correct = no_clipping_audits[None]
    assert run_summary.summary(correct)["planted_bug"] is None


def test_report_of_a_mutant_run_shows_the_violation(no_clipping_audits, tmp_path):
    """The HTML report of a mutant run shows the violation (checked on a Chromium screenshot).

    Its ROC leaves the allowed region (single-run report) and its empirical ε sits above the diagonal (multi-run
    report beside the correct run).
    """
    from dpaudit.reporting import audit_report, run_report
    from tests.test_report_theory import (
        CLOPPER_PEARSON_RGB,
        VIOLATION_RGB,
        _curve_pixels_above_allowed_region,
        _mask,
        _screenshot,
    )

    (mutant_store, mutated), (correct_store, correct) = no_clipping_audits["no-clipping"], no_clipping_audits[None]
    numbers = run_report.write_run(mutated, mutant_store.root)
    assert numbers["verdict"] == "violated"
    assert (mutant_store.root / "report.html").read_text().index("planted") < 2000  # said first
    pixels = _screenshot(mutant_store.root / "report.html", tmp_path / "mutant.png", 1400)
    assert _curve_pixels_above_allowed_region(pixels) > 100
    run_report.write_run(correct, correct_store.root)
    html_path, _ = audit_report.write([mutant_store.root, correct_store.root], tmp_path / "both")
    pixels = _screenshot(html_path, tmp_path / "both.png", 3400)
    markers, shaded = _mask(pixels, CLOPPER_PEARSON_RGB), _mask(pixels, VIOLATION_RGB)
    inside = [
        (y, x)
        for y, x in zip(*np.nonzero(markers))
        if shaded[y, max(0, x - 8) : x].any() and shaded[y, x + 1 : x + 9].any()
    ]
    assert len(inside) > 10  # the mutant's Clopper-Pearson marker sits in the violation half

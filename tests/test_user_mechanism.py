"""A mechanism written outside dpaudit: subclass Mechanism, train it with the engine, bound it through its event."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from accountants import dpsgd
from dpaudit import data, models, seeding
from dpaudit.campaign import plan as campaign_plan
from dpaudit.config import CampaignConfig
from dpaudit.mechanisms import bounds
from dpaudit.mechanisms.base import Mechanism, Step
from dpaudit.mechanisms.dpsgd import dp_sgd
from dpaudit.mechanisms.nonprivate import NonPrivate
from dpaudit.mechanisms.privacy import ZERO_NOISE, PrivacyEvent, SubsampledGaussian, Training
from dpaudit.training import engine, sampling
from tests.claims import analytic_bound

MEMBERS, BATCH, EPOCHS, DELTA = 100, 20, 2, 1e-5  # q = 0.2, T = 2 · 5 = 10


@dataclass(frozen=True)
class ClippedNoisySum(Mechanism):
    """DP-SGD written from the documentation: ``(Σ_i clip_C(g_i) + N(0, σ²C²)) / b`` on Poisson batches.

    Only :class:`Step`'s and the per-example gradients' documented operations are used; the noise is drawn per
    model from its own "noise" stream, tensor by tensor, N(0, (σC/b)²).
    """

    noise_multiplier: float
    clip_norm: float
    name: str = "clipped-noisy-sum"
    parameterization: str = "full"
    per_example: bool = True
    sampling: str = "poisson"

    def setup(self, shapes, randomness) -> list[torch.Generator]:
        return [model.torch("noise") for model in randomness]

    def transform(self, step: Step, generators: list[torch.Generator]) -> dict[str, torch.Tensor]:
        examples, b = step.example_gradients(), step.poisson_batch_size()
        coefficients = step.weights * (self.clip_norm / examples.squared_norms().sqrt()).clamp(max=1.0)
        clipped_sum = examples.weighted_sum(coefficients)
        update = {}
        for name, total in clipped_sum.items():
            noise = torch.empty_like(total)
            for k, generator in enumerate(generators):
                torch.normal(
                    0.0, self.noise_multiplier * self.clip_norm / b, total.shape[1:], generator=generator, out=noise[k]
                )
            update[name] = noise + total / b
        return update

    def privacy(self, training: Training) -> PrivacyEvent:
        # The convention of every noisy mechanism: without noise it claims "not DP", not a Gaussian of σ = 0
        # (which no accountant takes).
        if self.noise_multiplier == 0:
            return ZERO_NOISE
        return SubsampledGaussian(self.noise_multiplier, training.sample_rate, training.steps)


@dataclass(frozen=True)
class MeanGradient(Mechanism):
    """The smallest mechanism: ``transform`` only, every hook and ``privacy`` left at their defaults."""

    name: str = "mean-gradient"
    parameterization: str = "full"
    per_example: bool = False

    def transform(self, step: Step, state) -> dict[str, torch.Tensor]:
        return step.mean_gradients()


@pytest.fixture(scope="module")
def digits():
    return data.digits()


def _train(digits, mechanism: Mechanism) -> dict[str, torch.Tensor]:
    """Four models of a small MLP trained with ``mechanism`` on the first 100 private digits (one left out by two)."""
    torch.manual_seed(0)
    base = models.mlp(64, 10, hidden=(16,)).requires_grad_(False)
    x, y = digits.private.x[:MEMBERS], digits.private.y[:MEMBERS]
    membership = np.ones((4, MEMBERS), dtype=bool)
    membership[::2, -1] = False
    randomness = seeding.shadow_randomness(3, range(4))
    shadow = engine.build(base, mechanism.parameterization, None, randomness, torch.device("cpu"))
    config = sampling.TrainingConfig(epochs=EPOCHS, batch_size=BATCH, lr=0.05)
    layout = sampling.BatchLayout.for_members(MEMBERS, BATCH)
    return engine.train(shadow, mechanism, x, y, membership, randomness, config, layout).trainable


def _training() -> Training:
    poisson = sampling.PoissonLayout.for_members(MEMBERS, BATCH)
    layers = campaign_plan.layer_shapes(models.mlp(64, 10, hidden=(16,)))
    return Training(poisson.sample_rate, EPOCHS * poisson.steps, tuple(layers))


def test_user_mechanism_trains_as_dp_sgd_and_claims_its_bound(digits):
    """The user's DP-SGD trains the models dpaudit's DP-SGD trains, and its event gives the same analytic ε.

    Same Poisson batches and noise draws: the weights agree to float32 rounding of the two summation orders.
    """
    mine, theirs = _train(digits, ClippedNoisySum(1.0, 0.5)), _train(digits, dp_sgd("dp-sgd", 1.0, 0.5))
    for name, tensor in theirs.items():
        torch.testing.assert_close(mine[name], tensor, rtol=0, atol=1e-5 * float(tensor.abs().max()))
    moved = max(float((mine[n] - _train(digits, MeanGradient())[n]).abs().max()) for n in mine)
    assert moved > 1e-2  # the noise and clipping did change the models: the check above compares something

    training = _training()
    assert (training.sample_rate, training.steps) == (0.2, 10)
    bound = bounds.event_bound(ClippedNoisySum(1.0, 0.5).privacy(training), DELTA)
    expected = dpsgd.epsilon(1.0, 0.2, 10, DELTA).epsilon
    assert bound.epsilon == pytest.approx(expected, rel=1e-12) and math.isfinite(expected) and expected > 0
    campaign = CampaignConfig(mechanism="dp-sgd", noise=1.0, clip=0.5, epochs=EPOCHS, batch_size=BATCH)
    assert bound.epsilon == analytic_bound(campaign, MEMBERS, training.layers).epsilon
    profile = bounds.analytic_profile(bound, DELTA)
    assert profile is not None and profile.claim == "the claimed σ = 1 (q = 0.2, T = 10)"
    assert profile.pairs[-1] == (bound.epsilon, pytest.approx(DELTA, rel=1e-2))


def test_default_hooks_leave_the_engine_in_charge_and_claim_nothing(digits):
    """A mechanism with ``transform`` only trains bit for bit as dpaudit's plain SGD; its bound is ε = None."""
    mine, theirs = _train(digits, MeanGradient()), _train(digits, NonPrivate())
    assert all(torch.equal(mine[name], theirs[name]) for name in theirs)
    bound = bounds.event_bound(MeanGradient().privacy(_training()), DELTA)
    assert bound.epsilon is None and not bound.not_dp
    assert bound.reason == "mechanism 'mean-gradient' describes no privacy guarantee (Mechanism.privacy)"


def test_an_event_without_an_accountant_is_refused():
    """An event type dpaudit.mechanisms.bounds has no accountant for is a TypeError naming it, never a silent ε."""

    @dataclass(frozen=True)
    class Laplace:
        scale: float

    with pytest.raises(TypeError, match="no accountant for the privacy event Laplace"):
        bounds.event_bound(Laplace(1.0), DELTA)


def test_the_mechanism_table_and_base_class_load_without_torch():
    """dpaudit.config takes its names from the registry, which (with the base class and events) never imports torch."""
    import subprocess
    import sys

    code = (
        "import sys, dpaudit.config, dpaudit.mechanisms.base, dpaudit.mechanisms.catalogue, dpaudit.mechanisms.privacy;"
        " print(sorted(m for m in ('torch', 'peft') if m in sys.modules), dpaudit.config.TRAINING_MECHANISMS)"
    )
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    names = ("none", "lora-fa", "m1", "m2", "sketch", "dp-sgd", "dp-lora", "dp-lora-fa", "prism")
    assert printed.strip() == f"[] {names}"


def test_a_user_mechanism_object_is_audited_against_its_own_event(tmp_path, single_torch_thread):
    """dpaudit.audit runs a campaign of the user's DP-SGD and bounds it by the event it saved (privacy.json).

    Its analytic ε is the accountant's at the campaign's q and T; the same run read back by `dpaudit analyse`
    reports it too; a changed mechanism parameter refuses to continue the run; the CLI refuses to continue it.
    """
    import dpaudit
    from dpaudit import analysis
    from dpaudit.campaign.store import RunStore
    from dpaudit.cli import main
    from dpaudit.errors import UsageError

    x, y = data.digits().private.x[:200], data.digits().private.y[:200]
    settings = dict(models=4, epochs=1, batch_size=20, out=tmp_path / "run")
    result = dpaudit.audit(models.mlp(64, 10, hidden=(16,)), (x, y), ClippedNoisySum(1.0, 0.5), **settings)
    members = int(RunStore(tmp_path / "run").plan().max_members)
    poisson = sampling.PoissonLayout.for_members(members, 20)
    expected = dpsgd.epsilon(1.0, poisson.sample_rate, poisson.steps, result.config.delta).epsilon
    assert result.config.mechanism == "python:tests.test_user_mechanism.ClippedNoisySum"
    assert result.analytic.epsilon == pytest.approx(expected, rel=1e-12) and math.isfinite(expected)
    assert analysis.analyse(RunStore(tmp_path / "run")).analytic.epsilon == result.analytic.epsilon
    assert (tmp_path / "run" / "privacy.json").is_file()
    with pytest.raises(UsageError, match="mechanism_fingerprint"):
        dpaudit.audit(models.mlp(64, 10, hidden=(16,)), (x, y), ClippedNoisySum(2.0, 0.5), **settings)
    assert main(["resume", str(tmp_path / "run"), "--quiet"]) == 2
    # With no privacy claim (the base class's default), the audit has no bound to hold it to.
    base, other = models.mlp(64, 10, hidden=(16,)), settings | {"out": tmp_path / "m"}
    unclaimed = dpaudit.audit(base, (x, y), MeanGradient(), **other)
    assert unclaimed.analytic.epsilon is None and "describes no privacy guarantee" in unclaimed.analytic.reason

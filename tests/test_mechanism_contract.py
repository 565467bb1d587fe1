"""The contract every mechanism keeps, checked on every catalogue name and on a user's subclass of Mechanism.

1. Its privacy event round-trips through the run directory: the event a campaign writes (privacy.json) is
   ``mechanism.privacy(training)`` at the run's facts, and the analysis bounds exactly that event.
2. Padding is ignored: extra weight-0 slots in a step's batch change no trained weight.
3. A model does not depend on the other models of its chunk: trained alone or with others, its weights are the
   same bits.
4. σ = 0 is not DP: a noisy mechanism without noise claims ``NotDp``, whose bound says "not DP".

Each check is a function that raises AssertionError; the negative controls at the end run checks 2-4 on
mechanisms that break them, so a contract check that stops catching its violation fails here too.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

import dpaudit
from dpaudit import analysis, data, models, seeding
from dpaudit.campaign import resolve, runner
from dpaudit.campaign.store import RunStore
from dpaudit.config import CampaignConfig, Execution
from dpaudit.mechanisms import catalogue, privacy
from dpaudit.mechanisms.base import Mechanism, Step
from dpaudit.mechanisms.bounds import event_bound
from dpaudit.mechanisms.privacy import LayerShape, Training
from dpaudit.training import engine, sampling
from tests.test_user_mechanism import ClippedNoisySum, MeanGradient

USER = "user"  # ClippedNoisySum, DP-SGD written outside dpaudit from the documentation (tests/test_user_mechanism.py)
NAMES = (*catalogue.MECHANISMS, USER)
NOISY = (*catalogue.applying("noise"), USER)
SMALL_NOISE = 0.1  # σ (σ_g for the sketch) of the training checks: the noise is drawn, the gradients still count
RANK, CLIP = 4, 0.5  # rank 4: a multiple of 4, where chunking changes no bit (docs/architecture.md §4)
MEMBERS, BATCH = 100, 20  # the training checks: 5 steps of ~20 examples
LR = 0.05


def _mechanism(name: str, noise: float | None = SMALL_NOISE) -> Mechanism:
    """Catalogue ``name`` as the resolver builds it at its defaults (σ = ``noise`` where it has one, r = RANK).

    ``noise=None``: the default σ too. ``USER``: the user's DP-SGD, σ = ``noise`` (default 1), C = CLIP.
    """
    if name == USER:
        return ClippedNoisySum(1.0 if noise is None else noise, CLIP)
    applies = catalogue.MECHANISMS[name]
    options = {"noise": noise} if noise is not None and "noise" in applies else {}
    return resolve.mechanism(CampaignConfig(mechanism=name, rank=RANK if "rank" in applies else None, **options))


# --- 1. the privacy event round-trips through the run directory ---------------------------------------------------

# The built-in digits model, mlp(64, 10) with hidden layers (128, 128): its adapted layers as the plan sees them.
DIGITS_LAYERS = (LayerShape(128, 64, 1), LayerShape(128, 128, 1), LayerShape(10, 128, 1))
USER_LAYERS = (LayerShape(16, 64, 1), LayerShape(10, 16, 1))  # the user's mlp(64, 10, hidden=(16,))
CAMPAIGN = dict(models=2, epochs=2, batch_size=256, pretrain=False, seed=5)
EXPECTED_EVENT = {  # the event each mechanism claims in that campaign, at its default σ
    "none": privacy.NotDp,
    "lora-fa": privacy.NotDp,
    "m1": privacy.Unknown,  # no multi-step accountant for M1
    "m2": privacy.Unknown,  # M fixed for T = 6 > 1 steps
    "sketch": privacy.GaussianSketch,
    "dp-sgd": privacy.SubsampledGaussian,
    "dp-lora": privacy.SubsampledGaussian,
    "dp-lora-fa": privacy.SubsampledGaussian,
    "prism": privacy.SubsampledGaussian,
    USER: privacy.SubsampledGaussian,
}


@pytest.mark.parametrize("name", NAMES)
def test_the_claimed_event_round_trips_through_the_run_directory(name, tmp_path, single_torch_thread):
    """privacy.json holds ``mechanism.privacy(Training(b/N, epochs·⌈N/b⌉, layers))``; the analysis bounds it.

    N (the largest member count) is the private split plus the one canary of the canary design; q, T and the
    layers are derived here from those facts, not by the plan's code.
    """
    root = tmp_path / "run"
    if name == USER:
        x, y = data.digits().private.x[:700], data.digits().private.y[:700]
        mechanism, layers = _mechanism(USER, noise=None), USER_LAYERS
        private = len(data.from_arrays(x, y).private)
        result = dpaudit.audit(models.mlp(64, 10, hidden=(16,)), (x, y), mechanism, out=root, **CAMPAIGN)
        delta = result.config.delta
    else:
        config = CampaignConfig(mechanism=name, **CAMPAIGN)
        mechanism, layers, private = resolve.mechanism(config), DIGITS_LAYERS, len(data.digits().private)
        runner.run(config, Execution(workers=1, progress=False), root)
        delta = config.delta
    store = RunStore(root)
    members = int(store.plan().max_members)
    assert members == private + 1
    b = CAMPAIGN["batch_size"]
    training = Training(b / members, CAMPAIGN["epochs"] * math.ceil(members / b), layers)

    claimed = mechanism.privacy(training)
    assert isinstance(claimed, EXPECTED_EVENT[name])
    assert privacy.from_record(store.privacy_event()) == claimed
    expected = event_bound(claimed, delta)
    assert analysis.analyse(store).analytic == expected
    if isinstance(claimed, privacy.SubsampledGaussian):  # the analytic ε compared above is a number
        assert math.isfinite(expected.epsilon) and expected.epsilon > 0
    else:
        assert expected.epsilon is None and expected.not_dp == isinstance(claimed, privacy.NotDp)


# --- 2. and 3. training: padding, chunks ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits():
    d = data.digits()
    return d.private.x[:MEMBERS], d.private.y[:MEMBERS]


def _base(dtype: torch.dtype) -> torch.nn.Module:
    base = models.mlp(64, 10, hidden=(16,))
    models.initialise(base, 0)
    return base.to(dtype).requires_grad_(False)


_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}


def _train(
    mechanism: Mechanism, x: np.ndarray, y: np.ndarray, membership: np.ndarray, indices, dtype=torch.float32
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The trained tensors of models ``indices`` (one epoch, the campaign's layout) and the tensors they started from.

    The layout is the campaign's (all rows of ``membership``), whichever models train, as a campaign's chunks do.
    """
    randomness = seeding.shadow_randomness(11, indices)
    shadow = engine.build(
        _base(dtype), mechanism.parameterization, models.LoraSpec(RANK), randomness, torch.device("cpu")
    )
    start = {name: t.clone() for name, t in shadow.trainable.items()}
    config = sampling.TrainingConfig(epochs=1, batch_size=BATCH, lr=LR)
    layout = sampling.BatchLayout.for_members(int(membership.sum(axis=1).max()), BATCH)
    trained = engine.train(
        shadow, mechanism, x.astype(_NUMPY[dtype]), y, membership[list(indices)], randomness, config, layout
    )
    return trained.trainable, start


def _padding_slots(batches: Callable, slots: Callable) -> Callable:
    """``batches`` (shuffled or Poisson) with ``slots(layout)`` extra weight-0 slots appended to every step.

    The extra slots point at real examples (rows 0, 1, …), whose gradients are not zero: only their weight 0 keeps
    them out of the update.
    """

    def padded(membership, randomness, layout, epochs):
        extra = slots(layout)
        for index, weight in batches(membership, randomness, layout, epochs):
            rows = np.broadcast_to(np.arange(extra) % membership.shape[1], (len(index), extra))
            yield np.concatenate([index, rows], axis=1), np.concatenate([weight, np.zeros_like(weight[:, :extra])], 1)

    return padded


def assert_padding_ignored(mechanism: Mechanism, x: np.ndarray, y: np.ndarray) -> None:
    """Two models trained with and without extra padding slots in every step end at the same weights (float64).

    Same randomness, so the same batches and noise draws. Poisson steps get one more block of padding (the
    engine computes a step in fixed-width blocks, :class:`dpaudit.training.sampling.PoissonLayout`): a block of
    weight-0 slots adds exact zeros to every sum, so the weights must be equal bit for bit. Shuffled steps are one
    block, made wider: the batch-mean gradient then reduces over a longer axis, whose summation order (and so
    float64 rounding, ~1e-16 relative per step) may change although every added term is zero; they must agree to
    1e-10 of how far training moved the weights, where one padding row let in moves them by ~1/b of it.
    """
    membership = np.ones((2, len(y)), dtype=bool)
    membership[1, -1] = False
    plain, start = _train(mechanism, x, y, membership, range(2), torch.float64)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine, "poisson_batches", _padding_slots(sampling.poisson_batches, lambda p: p.overflow_width))
        patch.setattr(engine, "shuffled_batches", _padding_slots(sampling.shuffled_batches, lambda layout: 7))
        padded, _ = _train(mechanism, x, y, membership, range(2), torch.float64)
    moved = max(float((plain[name] - start[name]).abs().max()) for name in plain)
    assert moved > 1e-3  # training moved the weights: the comparison below compares something
    for name, tensor in plain.items():
        assert padded[name].dtype == torch.float64
        if mechanism.sampling == "poisson":
            assert torch.equal(padded[name], tensor), f"{name}: padding slots changed the update"
        else:
            torch.testing.assert_close(padded[name], tensor, rtol=0, atol=1e-10 * moved)


def assert_chunk_independent(mechanism: Mechanism, x: np.ndarray, y: np.ndarray) -> None:
    """Model 2 trained with models 0-3 and trained alone (same streams, same layout) ends at the same bits.

    Members differ between models (so do their batch sizes and padding); float32, as campaigns train, at rank 4.
    """
    membership = np.random.default_rng(1).random((4, len(y))) < 0.8
    together, start = _train(mechanism, x, y, membership, range(4))
    alone, _ = _train(mechanism, x, y, membership, [2])
    assert max(float((together[n][2] - start[n][2]).abs().max()) for n in together) > 1e-3  # model 2 trained
    for name, tensor in together.items():
        assert torch.equal(alone[name][0], tensor[2]), f"{name}: model 2 depends on the models trained with it"


@pytest.mark.parametrize("name", NAMES)
def test_padding_slots_change_no_update(name, digits, single_torch_thread):
    assert_padding_ignored(_mechanism(name), *digits)


@pytest.mark.parametrize("name", NAMES)
def test_a_model_does_not_depend_on_its_chunk(name, digits, single_torch_thread):
    assert_chunk_independent(_mechanism(name), *digits)


# --- 4. σ = 0 is not DP -----------------------------------------------------------------------------------------

TRAINING = Training(0.2, 10, USER_LAYERS)


def assert_zero_noise_is_not_dp(mechanism: Mechanism) -> None:
    """The event at σ = 0 is NotDp, and its bound says not DP (no ε)."""
    event = mechanism.privacy(TRAINING)
    assert isinstance(event, privacy.NotDp), f"σ = 0 claims {event}"
    bound = event_bound(event, 1e-5)
    assert bound.not_dp and bound.epsilon is None and "σ = 0" in bound.reason


@pytest.mark.parametrize("name", NOISY)
def test_zero_noise_is_not_dp(name):
    assert_zero_noise_is_not_dp(_mechanism(name, noise=0.0))
    assert not isinstance(_mechanism(name, noise=None).privacy(TRAINING), privacy.NotDp)  # σ > 0 is another claim


# --- negative controls: mechanisms that break the contract fail the checks ---------------------------------------


@dataclasses.dataclass(frozen=True)
class CountsPadding(ClippedNoisySum):
    """Clips and sums every slot of a Poisson step, padding included (forgets ``step.weights``)."""

    def transform(self, step: Step, generators):
        return super().transform(dataclasses.replace(step, weights=torch.ones_like(step.weights)), generators)


@dataclasses.dataclass(frozen=True)
class MeanOverSlots(MeanGradient):
    """Averages a shuffled step over its slots, padding included: the batch mean times examples / slots."""

    def transform(self, step: Step, state):
        share = step.weights.sum(dim=1) / step.weights.shape[1]
        return {name: g * share.view(-1, *[1] * (g.dim() - 1)) for name, g in step.mean_gradients().items()}


@dataclasses.dataclass(frozen=True)
class ChunkNoise(ClippedNoisySum):
    """Draws the whole chunk's noise from one stream, the first model's: a model's noise depends on its position."""

    def setup(self, shapes, randomness):
        shared = randomness[0].torch("noise")
        return [shared] * len(randomness)


@dataclasses.dataclass(frozen=True)
class ClaimsZeroNoise(ClippedNoisySum):
    """Claims the subsampled Gaussian whatever σ is (the convention: σ = 0 is ``NotDp``)."""

    def privacy(self, training: Training) -> privacy.PrivacyEvent:
        return privacy.SubsampledGaussian(self.noise_multiplier, training.sample_rate, training.steps)


def _zero_noise_check(mechanism: Mechanism, *data) -> None:
    assert_zero_noise_is_not_dp(mechanism)


@pytest.mark.parametrize(
    "check,correct,broken,failure",
    [
        (assert_padding_ignored, ClippedNoisySum(SMALL_NOISE, CLIP), CountsPadding(SMALL_NOISE, CLIP), "padding"),
        (assert_padding_ignored, MeanGradient(), MeanOverSlots(), "not close"),
        (assert_chunk_independent, ClippedNoisySum(SMALL_NOISE, CLIP), ChunkNoise(SMALL_NOISE, CLIP), "depends"),
        (_zero_noise_check, ClippedNoisySum(0.0, CLIP), ClaimsZeroNoise(0.0, CLIP), "σ = 0 claims"),
    ],
    ids=["padding-poisson", "padding-shuffled", "chunk", "zero-noise"],
)
def test_the_checks_catch_a_mechanism_that_breaks_the_contract(
    check, correct, broken, failure, digits, single_torch_thread
):
    """The same check passes the correct mechanism and fails, at the contract's assertion, the one with the bug."""
    check(correct, *digits)
    with pytest.raises(AssertionError, match=failure):
        check(broken, *digits)

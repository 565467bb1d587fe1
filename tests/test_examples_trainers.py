"""The example trainers in ``examples/``: deterministic, opacus's maths, each planted bug measured, honest step counts.

Steps are observed from outside through torch's global optimizer step hooks (both trainers step a
``torch.optim.SGD``), so the parameters before and after every step are seen without instrumenting the trainers.
"""

from __future__ import annotations

import copy
import math
import pickle
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from examples.dpsgd_handwritten import BUGS, DpSgdTrainer
from examples.models import mlp
from examples.opacus_trainer import OpacusTrainer, make_trainer, opacus_schedule

pytestmark = [
    pytest.mark.usefixtures("single_torch_thread"),
    # opacus warns that secure mode is off (on purpose: seeded noise) and about full backward hooks on inputs
    pytest.mark.filterwarnings("ignore:Secure RNG turned off"),
    pytest.mark.filterwarnings("ignore:Full backward hook is firing"),
]

Step = tuple[list[torch.Tensor], list[torch.Tensor]]  # every parameter before and after one optimizer step


@contextmanager
def recorded_steps() -> Iterator[list[Step]]:
    steps: list[Step] = []

    def params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        return [p.detach().clone() for group in optimizer.param_groups for p in group["params"]]

    pre = register_optimizer_step_pre_hook(lambda opt, args, kwargs: steps.append((params(opt), [])))
    post = register_optimizer_step_post_hook(lambda opt, args, kwargs: steps[-1][1].extend(params(opt)))
    try:
        yield steps
    finally:
        pre.remove()
        post.remove()


def deltas(steps: list[Step], index: int = 0) -> list[torch.Tensor]:
    """Parameter ``index``'s change at each step."""
    return [after[index] - before[index] for before, after in steps]


def opacus(sigma: float, clip: float, b: int, epochs: int, lr: float, bug: None = None) -> OpacusTrainer:
    return make_trainer(sigma, clip, b, epochs, lr)


TRAINERS = {"opacus": opacus, "handwritten": DpSgdTrainer}


def data(n: int, d: int = 5, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)).astype(np.float32), rng.integers(0, classes, n)


def base_model(d: int = 5, classes: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return mlp((d,), classes)


def one_hot_probe(n: int) -> tuple[nn.Module, np.ndarray, np.ndarray]:
    """Unit-vector examples e_i and a zero linear map: a step changes exactly the columns of its batch's examples.

    An example's first use moves its column by lr · (0.5, -0.5) / divisor (softmax(0) - one-hot(0) = (-0.5, 0.5)).
    """
    model = nn.Linear(n, 2, bias=False)
    nn.init.zeros_(model.weight)
    return model, np.eye(n, dtype=np.float32), np.zeros(n, dtype=np.int64)


def batches_seen(steps: list[Step]) -> list[set[int]]:
    return [set(torch.nonzero(delta.abs().sum(0)).flatten().tolist()) for delta in deltas(steps)]


@pytest.mark.parametrize(
    "kind, bug", [("opacus", None)] + [("handwritten", bug) for bug in (None, *BUGS)], ids=lambda v: str(v)
)
def test_same_seed_same_parameters_other_seed_other_parameters(kind, bug):
    model = base_model()
    x, y = data(20)
    trainer = TRAINERS[kind](1.0, 1.0, 4, 2, 0.1, bug=bug)
    original = copy.deepcopy(model.state_dict())
    unpickled = pickle.loads(pickle.dumps(trainer))  # as a worker process receives it
    assert unpickled == trainer
    first, again, other = trainer(model, x, y, 3), unpickled(model, x, y, 3), trainer(model, x, y, 4)
    assert type(first) is type(model) and first is not model
    assert {k: v.shape for k, v in first.state_dict().items()} == {k: v.shape for k, v in original.items()}
    for key, value in first.state_dict().items():
        assert torch.isfinite(value).all()
        assert torch.equal(value, again.state_dict()[key])
        assert not torch.equal(value, other.state_dict()[key])
        assert not torch.equal(value, original[key])  # it trained
        assert torch.equal(model.state_dict()[key], original[key])  # on a copy


@pytest.mark.parametrize(
    "kind, bug, n, b, epochs",
    [
        ("opacus", None, 20, 4, 2),
        ("opacus", None, 5, 2, 3),
        ("opacus", None, 93, 1, 1),  # 1 / (1 / 93) rounds below 93: opacus makes (and accounts) 92 steps
        ("handwritten", None, 93, 1, 1),
        ("handwritten", None, 21, 4, 2),
        ("handwritten", "shuffle-as-poisson", 21, 4, 2),
    ],
)
def test_claimed_steps_are_the_steps_taken(kind, bug, n, b, epochs):
    trainer = TRAINERS[kind](1.0, 1.0, b, epochs, 0.1, bug=bug)
    x, y = data(n)
    with recorded_steps() as steps:
        if kind == "opacus":
            _, accountant = trainer.train(base_model(), x, y, 0)
            assert accountant.history == [trainer.claim(n)]  # the claim is opacus's own accounting, float for float
        else:
            trainer(base_model(), x, y, 0)
    sigma, q, t = trainer.claim(n)
    assert len(steps) == t
    if kind == "handwritten":
        assert (q, t) == (b / n, epochs * math.ceil(n / b))
    elif (n, b) == (93, 1):
        schedule = opacus_schedule(n, b)
        assert (t, q, schedule.sampled_rate) == (92, 1 / 92, 1 / 93)


def test_opacus_schedule_rounding():
    assert opacus_schedule(20, 4) == opacus_schedule(20, 4).__class__(0.2, 0.2, 5, 4)
    assert opacus_schedule(5, 2).expected_batch_size == 1  # int(5 / 3): normalised by 1, not b = 2
    assert opacus_schedule(49, 1).expected_batch_size == 0  # int(49 * (1 / 49)) = int(0.999...)
    with pytest.raises(ValueError, match="int"):
        make_trainer(1.0, 1.0, 1, 1, 0.1)(base_model(), *data(49), 0)


def test_opacus_epsilon_is_its_accountants():
    trainer = make_trainer(1.0, 1.0, 4, 2, 0.1)
    prv, rdp = trainer.opacus_epsilon(20, 1e-5), trainer.opacus_epsilon(20, 1e-5, accountant="rdp")
    assert 0 < prv < rdp < 10  # RDP's conversion is looser than PRV's numerical composition
    assert make_trainer(2.0, 1.0, 4, 2, 0.1).opacus_epsilon(20, 1e-5) < prv


@pytest.mark.parametrize("kind", TRAINERS)
def test_full_batch_noiseless_step_is_clipped_mean_sgd(kind):
    """σ = 0, q = 1 (b = n), one step: both trainers equal θ - lr · mean_i clip_C(∇ℓ_i), computed here in float64."""
    n, clip, lr = 6, 2.5, 0.5
    x, y = data(n, d=4)
    x[:2] *= 50  # two examples far outside the clipping norm, the rest inside or near it
    model = base_model(d=4)
    reference = copy.deepcopy(model).double()
    params = list(reference.parameters())
    total = [torch.zeros_like(p) for p in params]
    norms = []
    for i in range(n):
        loss = nn.functional.cross_entropy(
            reference(torch.as_tensor(x[i : i + 1]).double()), torch.as_tensor(y[i : i + 1])
        )
        grads = torch.autograd.grad(loss, params)
        norm = torch.sqrt(sum(g.square().sum() for g in grads))
        norms.append(float(norm))
        for acc, g in zip(total, grads):
            acc += g * min(1.0, clip / float(norm))
    assert sum(norm > clip for norm in norms) >= 2 and min(norms) < clip  # clipping binds for some, not all
    trained = TRAINERS[kind](0.0, clip, n, 1, lr)(model, x, y, 0)
    for p, p0, g in zip(trained.parameters(), params, total):
        expected = p0 - lr * g / n
        torch.testing.assert_close(p.double(), expected, atol=2e-6, rtol=1e-5)


def zero_gradient_run(trainer, n: int, d: int = 200) -> list[torch.Tensor]:
    """Per-step updates over -lr of a bias-free linear model on zero inputs: noise / divisor (no data gradient)."""
    torch.manual_seed(0)
    model = nn.Linear(d, 10, bias=False)
    with recorded_steps() as steps:
        trainer(model, np.zeros((n, d), np.float32), np.zeros(n, np.int64), 11)
    return [delta / -trainer.lr for delta in deltas(steps)]


@pytest.mark.parametrize(
    "kind, bug, n, b, divisor",
    [
        ("handwritten", None, 8, 4, 4),
        ("handwritten", None, 5, 2, 2),
        ("handwritten", "half-noise", 8, 4, 8),  # σC / (2b)
        ("opacus", None, 8, 4, 4),
        ("opacus", None, 5, 2, 1),  # opacus divides by int(n · q) = int(5 / 3) = 1, not b
    ],
)
def test_noise_per_step_is_sigma_c_over_divisor(kind, bug, n, b, divisor):
    sigma, clip = 1.5, 0.8
    updates = zero_gradient_run(TRAINERS[kind](sigma, clip, b, 1, 0.1, bug=bug), n)
    for update in updates:  # 2000 entries per step: the spread is known to about ±1.6%
        assert abs(float(update.std()) / (sigma * clip / divisor) - 1) < 0.06
        assert abs(float(update.mean())) < 4 * sigma * clip / divisor / math.sqrt(update.numel())


@pytest.mark.parametrize("bug", [None, "reused-noise"])
def test_reused_noise_adds_the_same_draw_at_every_step(bug):
    first, second, *_ = zero_gradient_run(DpSgdTrainer(1.0, 1.0, 4, 1, 0.1, bug=bug), 8)
    correlation = float(torch.corrcoef(torch.stack([first.flatten(), second.flatten()]))[0, 1])
    if bug:
        torch.testing.assert_close(first, second, rtol=1e-4, atol=1e-6)  # one draw; only float32 rounding differs
    else:
        assert abs(correlation) < 0.1  # independent draws: |r| ~ 1 / sqrt(2000)


@pytest.mark.parametrize("bug", [None, "no-clipping"])
def test_no_clipping_lets_one_example_move_the_weights_by_more_than_c_lr_over_b(bug):
    clip, lr = 1.0, 0.1
    x = np.full((1, 5), 100.0, np.float32)  # gradient norm in the hundreds
    with recorded_steps() as steps:
        DpSgdTrainer(0.0, clip, 1, 1, lr, bug=bug)(base_model(), x, np.zeros(1, np.int64), 0)
    (before, after), *_ = steps
    moved = float(torch.sqrt(sum((a - b).square().sum() for a, b in zip(after, before))))
    if bug:
        assert moved > 50 * clip * lr
    else:
        assert moved == pytest.approx(clip * lr, rel=1e-5)  # clipped to exactly C, divided by b = 1


@pytest.mark.parametrize("kind, bug", [("handwritten", None), ("handwritten", "shuffle-as-poisson"), ("opacus", None)])
def test_batches_are_poisson_or_a_shuffle_each_epoch(kind, bug):
    n, b, epochs = 20, 5, 10
    model, x, y = one_hot_probe(n)
    with recorded_steps() as steps:
        TRAINERS[kind](0.0, 100.0, b, epochs, 0.1, bug=bug)(model, x, y, 5)
    batches = batches_seen(steps)
    assert len(batches) == epochs * 4
    epochs_partitioned = [
        sorted(i for batch in batches[e * 4 : e * 4 + 4] for i in batch) == list(range(n)) for e in range(epochs)
    ]
    sizes = [len(batch) for batch in batches]
    if bug:
        assert all(epochs_partitioned) and set(sizes) == {b}  # each example exactly once per epoch
    else:
        assert not any(epochs_partitioned) and len(set(sizes)) > 2
        rate = sum(sizes) / (n * len(batches))  # 800 Bernoulli(q = 0.25) draws: standard error 0.015
        assert abs(rate - b / n) < 0.06


@pytest.mark.parametrize("kind, bug", [("handwritten", None), ("handwritten", "realised-batch-size"), ("opacus", None)])
def test_noisy_sum_is_divided_by_expected_or_realised_batch_size(kind, bug):
    n, b, lr = 20, 5, 0.1
    model, x, y = one_hot_probe(n)
    with recorded_steps() as steps:
        TRAINERS[kind](0.0, 100.0, b, 3, lr, bug=bug)(model, x, y, 5)
    seen: set[int] = set()
    realised_differs = False
    for batch, delta in zip(batches_seen(steps), deltas(steps)):
        divisor = len(batch) if bug else b
        realised_differs |= len(batch) not in (0, b)
        for i in batch - seen:  # first use: the example's gradient is (-0.5, 0.5) exactly
            torch.testing.assert_close(delta[:, i], torch.tensor([0.5, -0.5]) * lr / divisor)
        seen |= batch
    assert realised_differs and len(seen) > n // 2

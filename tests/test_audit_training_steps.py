"""The training-code audit's step statistics: what a training function that reports its steps is observed by.

The recorder's numbers are checked against a hand computation on a linear model (the cross-entropy gradient of a
linear layer in closed form); the statistics against their formulas; and, on the hand-written DP-SGD, each step
statistic against the planted bug it is made for.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import dpaudit
from dpaudit.config import Execution
from dpaudit.training_audit import observe
from dpaudit.training_audit.observe import STEP_STATISTICS, Observer

SERIAL = Execution(workers=1, progress=False)
X_C, Y_C = np.array([[0.5, -1.0, 2.0]], dtype=np.float32), np.array([1])


def _linear() -> nn.Linear:
    torch.manual_seed(3)
    return nn.Linear(3, 2)


def _updates() -> list[torch.Tensor]:
    """Three updates of the flat (weight, bias) state; the second leaves the bias alone."""
    generator = torch.Generator().manual_seed(7)
    updates = [0.1 * torch.randn(8, generator=generator) for _ in range(3)]
    updates[1][6:] = 0
    return updates


def _apply_and_report(model, x, y, seed, on_step):
    model = copy.deepcopy(model)
    for update in _updates():
        with torch.no_grad():
            model.weight += update[:6].reshape(2, 3)
            model.bias += update[6:]
        on_step(model)
        on_step(model)  # a second call without a step in between is not a step
    return model


def _unit_gradient_by_hand(weight: np.ndarray, bias: np.ndarray, x=X_C[0], y=Y_C[0]) -> np.ndarray:
    """∇ of -log softmax(W x + b)_y over (W, b), flattened as the state is, normalised: (p - e_y) x^T and p - e_y."""
    logits = weight @ x.astype(np.float64) + bias
    p = np.exp(logits - logits.max())
    p /= p.sum()
    p[y] -= 1
    gradient = np.concatenate([np.outer(p, x).ravel(), p])
    return gradient / np.linalg.norm(gradient)


def test_each_step_is_read_as_its_projection_on_the_canary_gradient_and_its_noise_scale():
    start = _linear()
    observer = Observer(start, X_C, Y_C, claim=(1.5, 0.1))
    recorder = observer.steps()
    _apply_and_report(start, None, None, 0, recorder)
    theta = np.concatenate([start.weight.detach().double().numpy().ravel(), start.bias.detach().double().numpy()])
    alignments, scales, differences, previous = [], [], [], None
    for update in _updates():
        delta = update.double().numpy()
        u = _unit_gradient_by_hand(theta[:6].reshape(2, 3), theta[6:])
        alignments.append(-delta @ u)
        scales.append(1.4826 * np.median(np.abs(delta[delta != 0])))
        if previous is not None:  # no data given: ū_t = u_t
            differences.append(-(delta - previous) @ u)
        theta, previous = theta + delta, delta
    # The model holds float32: its updates are rounded at the parameters' magnitude, ~1e-7 · 0.5 / 0.03 relative.
    np.testing.assert_allclose(np.ravel(recorder.alignments), alignments, rtol=1e-5)
    np.testing.assert_allclose(recorder.scales, scales, rtol=1e-5)
    np.testing.assert_allclose(recorder.differences, differences, rtol=1e-5)
    z = np.array(alignments) / np.array(scales)
    sigma, q = 1.5, 0.1
    expected = {
        "step-alignment": z.sum() / np.sqrt(3),
        "step-likelihood": np.log(1 - q + q * np.exp(z / sigma - 1 / (2 * sigma**2))).sum(),
        "step-noise-scale": -np.log(min(scales)),
        "step-difference": np.mean((np.array(differences) / scales[1:]) ** 2),
    }
    found = recorder.statistics((sigma, q))
    assert list(found) == list(STEP_STATISTICS)
    for name in STEP_STATISTICS:
        assert found[name] == pytest.approx([expected[name]], rel=1e-4), name


@pytest.mark.parametrize("batched", [True, False])
def test_each_of_the_one_run_canaries_is_followed_at_every_step(monkeypatch, batched):
    """M canaries: each step projected on each canary's own unit gradient, by vmap or (without it) canary by canary."""
    x_c = np.array([[0.5, -1.0, 2.0], [1.0, 0.3, -0.7], [-2.0, 0.0, 0.4]], dtype=np.float32)
    y_c = np.array([1, 0, 0])
    if not batched:  # a model vmap cannot batch: the same numbers, one canary at a time

        def no_batching_rule(*args, **kwargs):
            raise RuntimeError("vmap: no batching rule")

        monkeypatch.setattr(observe, "vmap", no_batching_rule)
    start = _linear()
    recorder = Observer(start, x_c, y_c, claim=(1.5, 0.1)).steps()
    _apply_and_report(start, None, None, 0, recorder)
    theta = np.concatenate([start.weight.detach().double().numpy().ravel(), start.bias.detach().double().numpy()])
    alignments = []
    for update in _updates():
        delta = update.double().numpy()
        alignments.append(
            [-delta @ _unit_gradient_by_hand(theta[:6].reshape(2, 3), theta[6:], *c) for c in zip(x_c, y_c)]
        )
        theta = theta + delta
    # float32 parameters: errors at ~1e-7 of the updates' scale, so a projection near 0 is compared in absolute terms.
    scale = np.abs(alignments).max()
    np.testing.assert_allclose(np.array(recorder.alignments), alignments, rtol=1e-5, atol=1e-5 * scale)
    found = recorder.statistics((1.5, 0.1))
    # The noise scale and the update difference are the model's: read with one canary only.
    assert set(found) == {"step-alignment", "step-likelihood"}
    z = np.array(alignments) / np.array(recorder.scales)[:, None]
    np.testing.assert_allclose(found["step-alignment"], z.sum(axis=0) / np.sqrt(3), rtol=1e-4, atol=1e-4 * scale)


def test_the_update_difference_is_read_on_the_parameters_no_example_moves():
    # Feature 2 is 0 in every example: no example's gradient reaches the weights W[:, 2]; the canary's does.
    x = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
    x[:, 2] = 0
    observer = Observer(_linear(), X_C, Y_C, data=(x, np.arange(8) % 2))
    free = np.zeros((2, 3), dtype=bool)
    free[:, 2] = True
    np.testing.assert_array_equal(observer.free.numpy(), np.concatenate([free.ravel(), [False, False]]))
    recorder = observer.steps()
    _apply_and_report(_linear(), None, None, 0, recorder)
    theta = torch.cat([p.detach().flatten() for p in _linear().parameters()]).double().numpy()
    updates = [update.double().numpy() for update in _updates()]
    expected = []
    for t in (1, 2):
        before = theta + sum(updates[:t])
        u = _unit_gradient_by_hand(before[:6].reshape(2, 3), before[6:]) * observer.free.numpy()
        expected.append(-(updates[t] - updates[t - 1]) @ u / np.linalg.norm(u))
    np.testing.assert_allclose(recorder.differences, expected, rtol=1e-5)


def test_the_likelihood_ratio_stays_finite_where_the_exponential_would_overflow():
    recorder = Observer(_linear(), X_C, Y_C).steps()
    recorder.alignments = [np.array([1e4]), np.array([-1e4])]  # z = ±1e7
    recorder.scales, recorder.differences = [1e-3, 1e-3], [0.0]
    found = recorder.statistics((0.5, 0.01))
    # log(1 - q + q e^x) → log q + x for large x and → log(1 - q) for very negative x.
    assert found["step-likelihood"] == pytest.approx([np.log(0.01) + 1e7 / 0.5 - 2 + np.log(0.99)], rel=1e-12)
    assert "step-likelihood" not in recorder.statistics(None)


def test_a_trainer_without_on_step_is_observed_by_its_final_model_only(tmp_path):
    start = _linear()
    x = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
    y = np.arange(8) % 2

    def final_only(model, x, y, seed):
        return _apply_and_report(model, x, y, seed, lambda _: None)

    result = dpaudit.audit_training(
        start, final_only, (x, y), claim={"epsilon": 1.0}, out=tmp_path / "a", trials=4, execution=SERIAL
    )
    assert not set(STEP_STATISTICS) & set(result.statistics)
    result = dpaudit.audit_training(
        start, _apply_and_report, (x, y), claim={"epsilon": 1.0}, out=tmp_path / "b", trials=4, execution=SERIAL
    )
    # An (ε, δ) claim has no (σ, q): no likelihood ratio of it.
    assert set(STEP_STATISTICS) - set(result.statistics) == {"step-likelihood"}

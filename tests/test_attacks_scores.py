"""attacks.scores (losses, LiRA confidence, run files) and attacks.canary."""

import mpmath
import numpy as np
import pytest

from attacks import canary, scores


def _exact_signals(logits, label):
    """Cross-entropy and φ of one logit vector in 50-digit arithmetic."""
    mpmath.mp.dps = 50
    exps = [mpmath.exp(mpmath.mpf(float(z))) for z in logits]
    total = mpmath.fsum(exps)
    p_label = exps[label] / total
    loss = -mpmath.log(p_label)
    p_others = mpmath.fsum(e for i, e in enumerate(exps) if i != label) / total
    phi = mpmath.log(p_label) - mpmath.log(p_others)
    return float(loss), float(phi)


def test_signals_match_naive_formulas_for_moderate_logits():
    rng = np.random.default_rng(0)
    logits = rng.normal(0.0, 3.0, (4, 6, 10))
    labels = rng.integers(0, 10, 6)
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    label_index = np.broadcast_to(labels[:, None], (4, 6, 1))
    p_label = np.take_along_axis(probabilities, label_index, axis=-1)[..., 0]

    loss = scores.cross_entropy_loss(logits, labels)
    phi = scores.logit_scaled_confidence(logits, labels)
    assert loss.shape == phi.shape == (4, 6)
    np.testing.assert_allclose(loss, -np.log(p_label), rtol=1e-12)
    np.testing.assert_allclose(phi, np.log(p_label / (1 - p_label)), rtol=1e-9, atol=1e-12)
    log_probability = scores.true_label_log_probability(logits, labels)
    np.testing.assert_allclose(log_probability, np.log(p_label), rtol=1e-12)


@pytest.mark.parametrize(
    "logits, label",
    [
        ([np.log((1 - 1e-12) / 1e-12), 0.0], 0),  # p_y = 1 - 1e-12: naive log(p/(1-p)) loses it
        ([1e4, 0.0, -3.0], 0),  # huge logit: p_y rounds to 1
        ([1e4, 0.0, -3.0], 1),  # huge competing logit: p_y rounds to 0
        ([-800.0, -801.0, -799.5, -2000.0], 2),  # all exp() underflow
        ([5.0, 5.0, 5.0], 1),  # ties
    ],
)
def test_signals_are_finite_and_exact_in_extreme_cases(logits, label):
    loss = scores.cross_entropy_loss([logits], [label])[0]
    phi = scores.logit_scaled_confidence([logits], [label])[0]
    expected_loss, expected_phi = _exact_signals(logits, label)
    assert np.isfinite(loss) and np.isfinite(phi)
    assert loss == pytest.approx(expected_loss, rel=1e-12, abs=1e-300)
    assert phi == pytest.approx(expected_phi, rel=1e-12)


def test_phi_at_one_minus_1e_minus_12_and_astronomical_logits():
    phi = scores.logit_scaled_confidence([[np.log((1 - 1e-12) / 1e-12), 0.0]], [0])[0]
    assert phi == pytest.approx(27.631021115, abs=1e-8)
    assert scores.logit_scaled_confidence([[1e300, -1e300, 0.0]], [0])[0] == 1e300


@pytest.mark.parametrize(
    "logits, labels, message",
    [
        (np.zeros((2, 3, 1)), [0, 0, 0], "at least 2 classes"),
        (np.zeros((2, 3, 4)), [0, 1], r"labels must be integer class indices of shape \(3,\)"),
        (np.zeros((2, 3, 4)), [0.0, 1.0, 2.0], "labels must be integer"),
        (np.zeros((2, 3, 4)), [0, 1, 4], r"labels must lie in \[0, 4\)"),
        (np.full((2, 3, 4), np.nan), [0, 1, 2], "logits contains 24 non-finite"),
        (np.zeros(4), [0], "logits must have shape"),
    ],
)
def test_bad_logits_or_labels_raise_value_error(logits, labels, message):
    with pytest.raises(ValueError, match=message):
        scores.logit_scaled_confidence(logits, labels)


@pytest.mark.parametrize("outputs_shape", [(6, 5), (6, 5, 3)])
def test_run_outputs_round_trip(tmp_path, outputs_shape):
    rng = np.random.default_rng(1)
    outputs = rng.normal(size=outputs_shape).astype(np.float32)
    membership = rng.random((6, 5)) < 0.5
    path = tmp_path / "chunk.npz"
    scores.save_run_outputs(path, outputs, membership)
    loaded = scores.load_run_outputs(path)
    np.testing.assert_array_equal(loaded.outputs, outputs)
    assert loaded.outputs.dtype == np.float32
    np.testing.assert_array_equal(loaded.membership, membership)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chunk.npz"]  # no partial file left


def _write_npz(path, **arrays):
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)


@pytest.mark.parametrize(
    "contents, message",
    [
        (None, "does not exist"),
        (b"not a zip file", "not a readable .npz"),
        ("npy", "holds a single array"),
        ({"outputs": np.zeros((2, 3)), "membership": np.zeros((2, 3), bool)}, "no format_version"),
        (
            {"format_version": np.array(0), "outputs": np.zeros((2, 3)), "membership": np.zeros((2, 3), bool)},
            "format_version 0",
        ),
        ({"format_version": np.array(1), "outputs": np.zeros((2, 3))}, r"lacks \['membership'\]"),
        (
            {"format_version": np.array(1), "outputs": np.zeros((2, 3)), "membership": np.zeros((3, 2), bool)},
            r"membership must have shape \(2, 3\)",
        ),
        (
            {"format_version": np.array(1), "outputs": np.zeros((2, 3)), "membership": np.full((2, 3), 2)},
            "membership must be boolean",
        ),
    ],
)
def test_load_rejects_missing_old_or_mismatched_files(tmp_path, contents, message):
    path = tmp_path / "run.npz"
    if contents == "npy":
        with open(path, "wb") as handle:
            np.save(handle, np.zeros(3))
    elif isinstance(contents, bytes):
        path.write_bytes(contents)
    elif contents is not None:
        _write_npz(path, **contents)
    with pytest.raises(ValueError, match=message) as error:
        scores.load_run_outputs(path)
    assert "run.npz" in str(error.value)


def test_save_rejects_bad_path_or_shapes(tmp_path):
    with pytest.raises(ValueError, match=r"\.npz"):
        scores.save_run_outputs(tmp_path / "run.txt", np.zeros((2, 3)), np.zeros((2, 3), bool))
    with pytest.raises(ValueError, match="membership must have shape"):
        scores.save_run_outputs(tmp_path / "run.npz", np.zeros((2, 3)), np.zeros((2, 4), bool))
    with pytest.raises(ValueError, match="outputs must be a float array"):
        scores.save_run_outputs(tmp_path / "run.npz", np.zeros(3), np.zeros(3, bool))


def test_canary_input_is_seeded_standard_normal():
    first = canary.draw_canary_input((3, 32, 32), np.random.default_rng(5))
    again = canary.draw_canary_input((3, 32, 32), np.random.default_rng(5))
    other = canary.draw_canary_input((3, 32, 32), np.random.default_rng(6))
    assert first.shape == (3, 32, 32)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    assert first.mean() == pytest.approx(0.0, abs=4 / np.sqrt(first.size))
    assert first.std() == pytest.approx(1.0, abs=0.05)
    assert canary.draw_canary_input(7, np.random.default_rng(0)).shape == (7,)


@pytest.mark.parametrize(
    "shape, rng, message",
    [
        ((3, 0), np.random.default_rng(0), "shape"),
        ((), np.random.default_rng(0), "shape"),
        ((2.5,), np.random.default_rng(0), "shape"),
        ((3,), 42, "numpy.random.Generator"),
    ],
)
def test_canary_input_rejects_bad_arguments(shape, rng, message):
    with pytest.raises(ValueError, match=message):
        canary.draw_canary_input(shape, rng)


def test_least_likely_label_is_argmin_with_smallest_index_on_ties():
    assert canary.least_likely_label([0.3, -2.0, 1.0, 5.0]) == 1
    assert canary.least_likely_label([1.0, -4.0, -4.0]) == 1
    for logits, message in [([1.0], "at least 2 classes"), ([[1.0, 2.0]], "1-D"), ([0.0, np.nan], "non-finite")]:
        with pytest.raises(ValueError, match=message):
            canary.least_likely_label(logits)

"""Membership-inference attacks: loss, reference-calibrated ([S] Eq. 16), LiRA and RMIA."""

import numpy as np
import pytest
import scipy.stats

from attacks import designs, lira, loss, metrics, reference, rmia

N_MODELS, N_EXAMPLES = 64, 1000


def _auc(scores, membership):
    return metrics.auc(scores[membership], scores[~membership])


def _synthetic_confidences(shift, seed=0):
    """φ[m, j] = difficulty_j + N(0, 1) + shift_j · IN[m, j]: a known membership effect."""
    keep = designs.all_examples_design(N_MODELS, N_EXAMPLES, seed)
    rng = np.random.default_rng(seed + 1)
    difficulty = rng.normal(0.0, 2.0, N_EXAMPLES)
    noise = rng.normal(0.0, 1.0, (N_MODELS, N_EXAMPLES))
    return difficulty + noise + shift * keep, keep


def _brute_force_lira(phi, keep, m, j, online, fixed_variance):
    others = np.arange(phi.shape[0]) != m

    def fit(group):
        members = others & group[:, j]
        mean = phi[members, j].mean()
        if not fixed_variance:
            return mean, phi[members, j].var(ddof=1)
        residuals, dof = [], 0
        for k in range(phi.shape[1]):
            in_group = others & group[:, k]
            residuals.append(phi[in_group, k] - phi[in_group, k].mean())
            dof += in_group.sum() - 1
        return mean, np.sum(np.concatenate(residuals) ** 2) / dof

    mean_out, var_out = fit(~keep)
    if not online:
        return (phi[m, j] - mean_out) / np.sqrt(var_out)
    mean_in, var_in = fit(keep)
    if fixed_variance:  # one variance pooled over IN and OUT residuals
        dof_in = sum((others & keep[:, k]).sum() - 1 for k in range(phi.shape[1]))
        dof_out = sum((others & ~keep[:, k]).sum() - 1 for k in range(phi.shape[1]))
        var_in = var_out = (var_in * dof_in + var_out * dof_out) / (dof_in + dof_out)

    def log_density(group, mean, variance):
        if group[m, j]:  # the target's own group: fitted on the others
            return scipy.stats.norm.logpdf(phi[m, j], mean, np.sqrt(variance))
        # the other group: fitted without its first member after m in cyclic order (balanced leave-one-out)
        members = np.flatnonzero(group[:, j])
        left_out = next((k for k in members if k > m), members[0])
        rest = phi[members[members != left_out], j]
        if not fixed_variance:
            return scipy.stats.norm.logpdf(phi[m, j], rest.mean(), np.sqrt(rest.var(ddof=1)))
        return scipy.stats.norm.logpdf(phi[m, j], rest.mean(), np.sqrt(variance))

    return log_density(keep, mean_in, var_in) - log_density(~keep, mean_out, var_out)


@pytest.mark.parametrize("fixed_variance", [False, True])
@pytest.mark.parametrize("online", [True, False])
def test_lira_leave_one_out_matches_brute_force(online, fixed_variance):
    keep = designs.all_examples_design(10, 6, seed=2)
    phi = np.random.default_rng(3).normal(5.0, 1.0, (10, 6)) + 2.0 * keep
    attack = lira.lira_online_scores if online else lira.lira_offline_scores
    scores = attack(phi, keep, fixed_variance=fixed_variance)
    expected = np.array(
        [[_brute_force_lira(phi, keep, m, j, online, fixed_variance) for j in range(6)] for m in range(10)]
    )
    np.testing.assert_allclose(scores, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("fixed_variance", [False, True])
def test_online_lira_has_no_membership_bias_without_signal(fixed_variance):
    """No membership signal → AUC 0.5 on average, IN and OUT targets alike.

    Leaving the target out of its own group only (one model fewer there than in the other group) gave 0.343 ± 0.020
    at 8 models (0.417 at 32); averaging the other group's log-density over every left-out model gave 0.523.
    """
    aucs = []
    for seed in range(40):
        rng = np.random.default_rng(seed)
        keep = designs.all_examples_design(8, 200, seed=seed)
        aucs.append(_auc(lira.lira_online_scores(rng.normal(size=(8, 200)), keep, fixed_variance=fixed_variance), keep))
    # 40 AUCs of 1600 scores each: the mean has sd ≈ 0.0023 (AUC's null sd ≈ 0.0144 at 800 + 800, over √40)
    assert np.mean(aucs) == pytest.approx(0.5, abs=0.01)


def test_online_lira_is_near_optimal_and_offline_is_not_better():
    shift = 1.0
    phi, keep = _synthetic_confidences(shift)
    optimal = scipy.stats.norm.cdf(shift / np.sqrt(2))  # equal-variance Gaussians Δ apart
    online = _auc(lira.lira_online_scores(phi, keep), keep)
    offline = _auc(lira.lira_offline_scores(phi, keep), keep)
    fixed = _auc(lira.lira_online_scores(phi, keep, fixed_variance=True), keep)
    # Measured: online 0.750, fixed variance 0.756, offline 0.756, optimum 0.760; raw φ 0.626.
    assert online == pytest.approx(optimal, abs=0.015)
    assert fixed == pytest.approx(optimal, abs=0.01)
    assert offline <= optimal + 0.005
    assert _auc(phi, keep) < 0.65  # per-example difficulty hides membership from raw φ


def test_online_lira_beats_offline_when_the_membership_effect_varies_by_example():
    shift = np.random.default_rng(9).uniform(0.0, 3.0, N_EXAMPLES)
    phi, keep = _synthetic_confidences(shift)
    online = _auc(lira.lira_online_scores(phi, keep), keep)
    offline = _auc(lira.lira_offline_scores(phi, keep), keep)
    # Online weighs each example by its own IN/OUT gap; offline's z-score cannot.
    assert online == pytest.approx(0.848, abs=0.005)
    assert offline == pytest.approx(0.814, abs=0.005)
    assert online > offline + 0.02


def test_lira_floors_zero_variance_and_needs_enough_shadow_models():
    keep = designs.all_examples_design(6, 3, seed=0)
    constant = np.ones((6, 3))
    assert np.all(np.isfinite(lira.lira_online_scores(constant, keep)))
    assert np.all(lira.lira_offline_scores(constant, keep) == 0.0)
    small = designs.all_examples_design(4, 3, seed=0)
    with pytest.raises(ValueError, match="at least 2 IN model"):
        lira.lira_online_scores(np.zeros((4, 3)), small)
    assert lira.lira_online_scores(np.zeros((4, 3)), small, fixed_variance=True).shape == (4, 3)
    with pytest.raises(ValueError, match="membership must have shape"):
        lira.lira_online_scores(np.zeros((6, 3)), keep[:, :2])
    with pytest.raises(ValueError, match="confidences contains"):
        lira.lira_offline_scores(np.full((6, 3), np.nan), keep)
    with pytest.raises(ValueError, match="min_std"):
        lira.lira_online_scores(constant, keep, min_std=0.0)


def test_reference_calibration_removes_example_difficulty():
    keep = designs.all_examples_design(N_MODELS, N_EXAMPLES, seed=4)
    rng = np.random.default_rng(5)
    difficulty = rng.exponential(2.0, N_EXAMPLES)
    target_losses = difficulty + rng.normal(0.0, 0.3, (N_MODELS, N_EXAMPLES)) - 0.3 * keep
    reference_losses = difficulty + rng.normal(0.0, 0.3, N_EXAMPLES)
    calibrated = reference.reference_calibrated_scores(target_losses, reference_losses)
    np.testing.assert_array_equal(calibrated, reference_losses - target_losses)
    per_model = reference.reference_calibrated_scores(target_losses, np.tile(reference_losses, (N_MODELS, 1)))
    np.testing.assert_array_equal(per_model, calibrated)
    # Measured: raw loss AUC 0.564, calibrated 0.693 (optimum with both noises: Φ(0.5) = 0.691).
    assert _auc(loss.loss_scores(target_losses), keep) < 0.6
    assert _auc(calibrated, keep) == pytest.approx(scipy.stats.norm.cdf(0.5), abs=0.02)
    with pytest.raises(ValueError, match="reference_losses must have shape"):
        reference.reference_calibrated_scores(target_losses, reference_losses[:-1])


def _log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


def _rmia_inputs(seed=6, n_models=16, n_examples=300, n_population=200):
    keep = designs.all_examples_design(n_models, n_examples, seed)
    rng = np.random.default_rng(seed)
    difficulty = rng.normal(1.0, 2.0, n_examples)
    population_difficulty = rng.normal(1.0, 2.0, n_population)
    targets = _log_sigmoid(difficulty + rng.normal(0, 1, (n_models, n_examples)) + 1.5 * keep)
    population = _log_sigmoid(population_difficulty + rng.normal(0, 1, (n_models, n_population)))
    return targets, keep, population


@pytest.mark.parametrize("offline_a, gamma", [(None, 1.0), (None, 2.0), (0.3, 1.0), (1.0, 1.0), (0.0, 1.5)])
def test_rmia_matches_brute_force_pairwise_ratios(offline_a, gamma):
    targets, keep, population = _rmia_inputs()
    scores = rmia.rmia_scores(targets, keep, population, gamma=gamma, offline_a=offline_a)
    assert scores.shape == targets.shape
    for m in (0, 7, 15):
        others = np.arange(16) != m
        if offline_a is None:
            p_x = np.exp(targets[others]).mean(axis=0)
            p_z = np.exp(population[others]).mean(axis=0)
        else:
            p_x_out = [np.exp(targets[others & ~keep[:, j], j]).mean() for j in range(300)]
            p_z_out = np.exp(population[others]).mean(axis=0)
            p_x = (1 + offline_a) / 2 * np.array(p_x_out) + (1 - offline_a) / 2
            p_z = (1 + offline_a) / 2 * p_z_out + (1 - offline_a) / 2
        ratio = (np.exp(targets[m]) / p_x)[:, None] / (np.exp(population[m]) / p_z)[None, :]
        np.testing.assert_array_equal(scores[m], (ratio >= gamma).mean(axis=1))


def test_rmia_beats_raw_probability_and_larger_gamma_lowers_scores():
    targets, keep, population = _rmia_inputs(n_models=32, n_examples=600)
    online = rmia.rmia_scores(targets, keep, population)
    # Measured: online RMIA 0.812, raw log-probability 0.683.
    assert _auc(online, keep) > _auc(targets, keep) + 0.08
    assert np.all(rmia.rmia_scores(targets, keep, population, gamma=4.0) <= online)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"gamma": 0.0}, "gamma"),
        ({"offline_a": 1.5}, "offline_a"),
        ({"offline_a": True}, "offline_a"),
        ({"population_log_probabilities": np.zeros((3, 5))}, "population_log_probabilities must"),
        ({"target_log_probabilities": np.full((4, 6), 0.5)}, "log-probabilities"),
        ({"membership": np.ones((4, 6), bool)}, "at least one OUT reference"),
    ],
)
def test_rmia_rejects_bad_arguments(kwargs, message):
    arguments = {
        "target_log_probabilities": np.full((4, 6), -0.5),
        "membership": designs.all_examples_design(4, 6, seed=0),
        "population_log_probabilities": np.full((4, 5), -0.7),
        "offline_a": 0.5,
    } | kwargs
    with pytest.raises(ValueError, match=message):
        rmia.rmia_scores(**arguments)


@pytest.mark.parametrize(
    "attack",
    [
        lambda phi, keep, logp, pop: loss.loss_scores(-logp),
        lambda phi, keep, logp, pop: reference.reference_calibrated_scores(-logp, -logp[0]),
        lambda phi, keep, logp, pop: lira.lira_online_scores(phi, keep),
        lambda phi, keep, logp, pop: lira.lira_offline_scores(phi, keep, fixed_variance=True),
        lambda phi, keep, logp, pop: rmia.rmia_scores(logp, keep, pop, offline_a=0.5),
    ],
    ids=["loss", "reference", "lira_online", "lira_offline_fixed", "rmia_offline"],
)
def test_every_attack_returns_one_finite_score_per_model_and_example(attack):
    phi, keep = _synthetic_confidences(1.0)
    log_probability = _log_sigmoid(phi)
    population = _log_sigmoid(np.random.default_rng(0).normal(0.0, 2.0, (N_MODELS, 50)))
    scores = attack(phi, keep, log_probability, population)
    assert scores.shape == (N_MODELS, N_EXAMPLES)
    assert np.all(np.isfinite(scores))
    assert _auc(scores, keep) > 0.5

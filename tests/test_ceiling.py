"""attacks.ceiling: the vectorised ceiling simulation is the estimators' own bounds, and its numbers at μ = 1."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attacks import ceiling
from attacks import epsilon as epsilon_lib

DELTA = 1e-5
EPSILON_MU_1 = epsilon_lib.gaussian_dp_epsilon(1.0, DELTA)  # 4.377


def test_each_simulated_audit_is_what_the_estimators_certify_on_its_scores():
    """The one-sort counts give the bounds clopper_pearson_epsilon and gdp_epsilon compute audit by audit."""
    mu = ceiling.gdp_mu(EPSILON_MU_1, DELTA)
    assert mu == pytest.approx(1.0, abs=1e-9)
    clopper_pearson, mus = ceiling.simulated_bounds(mu, 300, 200, DELTA, 7, range(2, 6))
    for row, audit in enumerate(range(2, 6)):
        in_scores, out_scores = ceiling.simulated_scores(mu, 300, 200, 7, audit)
        assert clopper_pearson[row] == epsilon_lib.clopper_pearson_epsilon(in_scores, out_scores, DELTA).epsilon
        assert max(mus[row], 0.0) == epsilon_lib.gdp_epsilon(in_scores, out_scores, DELTA).mu_lower


def test_the_ceiling_at_mu_1_rises_with_the_trials_below_the_claim():
    """0.67 of ε at 500 + 500 and 0.75 at 1000 + 1000 at μ = 1, within 3 of the simulation's standard errors."""
    counts = (100, 500, 1000, 5000)
    ceilings = [ceiling.estimator_ceiling(n, n, EPSILON_MU_1, DELTA) for n in counts]
    for expected, at in zip((0.67, 0.75), ceilings[1:3]):
        assert abs(at.gdp - expected) < 3 * at.gdp_error
        assert 0.002 < at.gdp_error < 0.02
    gdp = [at.gdp for at in ceilings]
    clopper_pearson = [at.clopper_pearson for at in ceilings]
    assert gdp == sorted(gdp) and clopper_pearson == sorted(clopper_pearson) and gdp[-1] < 1
    assert all(cp < share for cp, share in zip(clopper_pearson, gdp))  # CP certifies less of a GDP mechanism


def test_the_ceiling_does_not_depend_on_how_the_audits_are_batched(monkeypatch):
    at = ceiling.estimator_ceiling(200, 150, 6.0, DELTA, seed=3)
    assert at.gdp > 0
    monkeypatch.setattr(ceiling, "_BATCH_SCORES", 7 * 350)  # 7 audits a batch: 101 = 14 · 7 + 3
    ceiling.estimator_ceiling.cache_clear()
    assert ceiling.estimator_ceiling(200, 150, 6.0, DELTA, seed=3) == at
    assert ceiling.estimator_ceiling(200, 150, 6.0, DELTA, seed=4) != at


def test_trials_for_ratio_is_the_fewest_trials_whose_ceiling_reaches_it(monkeypatch):
    trials = ceiling.trials_for_ratio(0.7, EPSILON_MU_1, DELTA)
    assert trials is not None and 500 < trials < 1000
    assert ceiling.estimator_ceiling(trials, trials, EPSILON_MU_1, DELTA).gdp >= 0.7
    half = trials // 2
    assert ceiling.estimator_ceiling(half, half, EPSILON_MU_1, DELTA).gdp < 0.7
    monkeypatch.setattr(ceiling, "MAX_TRIALS", 256)
    assert ceiling.trials_for_ratio(0.7, EPSILON_MU_1, DELTA) is None  # more than MAX_TRIALS


@pytest.mark.parametrize("ratio", [0.0, 1.0, -0.5, math.nan])
def test_trials_for_ratio_refuses_a_ratio_outside_0_1(ratio):
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        ceiling.trials_for_ratio(ratio, EPSILON_MU_1, DELTA)


@pytest.mark.parametrize("n_in, epsilon", [(0, 1.0), (10, 0.0), (10, math.inf), (10, math.nan)])
def test_the_ceiling_refuses_undefined_inputs(n_in, epsilon):
    with pytest.raises(ValueError):
        ceiling.estimator_ceiling(n_in, 10, epsilon, DELTA)


def test_the_simulated_scores_are_seeded_and_more_trials_extend_fewer():
    fewer, more = ceiling.simulated_scores(1.0, 5, 4, 0, 1), ceiling.simulated_scores(1.0, 8, 6, 0, 1)
    assert np.array_equal(fewer[0], more[0][:5]) and np.array_equal(fewer[1], more[1][:4])
    assert not np.array_equal(fewer[0], ceiling.simulated_scores(1.0, 5, 4, 0, 2)[0])

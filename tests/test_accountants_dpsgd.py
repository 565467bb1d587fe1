"""Subsampled-Gaussian accountant: cross-checked against opacus (PRV, RDP) and exact identities."""

import itertools
import math
import subprocess
import sys

import numpy as np
import pytest

from accountants import dpsgd, gaussian

GRID = list(itertools.product((0.001, 0.01, 0.1), (0.6, 1.0, 2.0), (100, 10000)))


@pytest.fixture(scope="module")
def opacus_accountants():
    accountants = pytest.importorskip("opacus.accountants")
    return accountants.PRVAccountant, accountants.RDPAccountant


@pytest.mark.parametrize("sample_rate, sigma, steps", GRID)
def test_agrees_with_opacus_prv_and_never_exceeds_rdp(opacus_accountants, sample_rate, sigma, steps):
    prv_class, rdp_class = opacus_accountants
    ours = dpsgd.epsilon(sigma, sample_rate, steps, 1e-5).epsilon
    prv = prv_class()
    prv.history = [(sigma, sample_rate, steps)]
    # PRV's eps_error is absolute: make it 1% of eps so the comparison is relative.
    theirs = prv.get_epsilon(1e-5, eps_error=0.01 * ours)
    assert ours == pytest.approx(theirs, rel=0.05)
    rdp = rdp_class()
    rdp.history = [(sigma, sample_rate, steps)]
    # RDP conversion is a looser upper bound: a tight accountant must not exceed it.
    assert ours <= 1.05 * rdp.get_epsilon(1e-5)


def test_full_batch_equals_composed_gaussian():
    # q = 1: T Gaussian steps with multiplier sigma are one Gaussian with mu = sqrt(T)/sigma.
    for sigma, steps, delta in [(1.0, 10, 1e-5), (3.0, 100, 1e-6), (0.8, 1, 1e-3)]:
        ours = dpsgd.epsilon(sigma, 1.0, steps, delta).epsilon
        exact = gaussian.epsilon(delta, math.sqrt(steps), sigma).epsilon
        assert ours == pytest.approx(exact, rel=0.01)
        assert ours >= exact - 1e-9  # the PLD is pessimistic


def test_delta_inverts_epsilon():
    eps = dpsgd.epsilon(1.0, 0.02, 500, 1e-5).epsilon
    assert dpsgd.delta(1.0, 0.02, 500, eps).delta == pytest.approx(1e-5, rel=0.05)


def test_delta_is_never_negative_where_the_accountant_rounds_below_zero():
    # At these inputs dp_accounting returns δ(2.63) = -2.2e-15, a sum of truncated tails rounded below 0.
    (bound,) = dpsgd.delta_curve(1.5, 0.009930915371329879, 2020, [2.639720312056761])
    assert bound.delta == 0.0


def test_profile_non_increasing_in_epsilon_and_sigma_over_random_points():
    # 8 random (q, T, sigma) x 25 eps = 200 points: delta(eps) falls with eps and with sigma, i.e.
    # eps(delta) falls with delta and with sigma.
    rng = np.random.default_rng(7)
    epsilons = np.linspace(0.5, 6.0, 25)
    for _ in range(8):
        sample_rate, steps = float(rng.uniform(0.005, 0.2)), int(rng.integers(1, 300))
        sigma = float(rng.uniform(0.7, 2.0))
        low = np.array([b.delta for b in dpsgd.delta_curve(sigma, sample_rate, steps, epsilons)])
        high = np.array([b.delta for b in dpsgd.delta_curve(1.25 * sigma, sample_rate, steps, epsilons)])
        # dp_accounting truncates tails at ~1e-15 of mass: below that delta is noise.
        assert np.all(np.diff(low) <= 1e-14) and np.all(np.diff(high) <= 1e-14)
        assert np.all(high <= low + 1e-14)
    first, second = (dpsgd.epsilon(1.0, 0.05, 50, d).epsilon for d in (1e-7, 1e-4))
    assert first >= second >= dpsgd.epsilon(1.5, 0.05, 50, 1e-4).epsilon


def test_calibration_reaches_target():
    sigma = dpsgd.calibrate_noise_multiplier(3.0, 0.01, 1000, 1e-5)
    assert dpsgd.epsilon(sigma, 0.01, 1000, 1e-5).epsilon <= 3.0
    assert dpsgd.epsilon(sigma * 0.98, 0.01, 1000, 1e-5).epsilon > 3.0


def test_replace_one_is_looser_than_add_remove():
    add_remove = dpsgd.epsilon(1.0, 0.01, 1000, 1e-5).epsilon
    replace_one = dpsgd.epsilon(1.0, 0.01, 1000, 1e-5, neighbouring="replace-one").epsilon
    assert replace_one > add_remove


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: dpsgd.epsilon(0.0, 0.01, 10, 1e-5), "noise_multiplier"),
        (lambda: dpsgd.epsilon(1.0, 0.0, 10, 1e-5), "sample_rate"),
        (lambda: dpsgd.epsilon(1.0, 1.5, 10, 1e-5), "sample_rate"),
        (lambda: dpsgd.epsilon(1.0, 0.01, 0, 1e-5), "steps"),
        (lambda: dpsgd.epsilon(1.0, 0.01, 10, 1.0), "delta"),
        (lambda: dpsgd.delta(1.0, 0.01, 10, -1.0), "epsilon"),
        (lambda: dpsgd.calibrate_noise_multiplier(-1.0, 0.01, 10, 1e-5), "target_epsilon"),
    ],
)
def test_impossible_inputs_raise_value_error_naming_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_importing_the_accountant_does_not_load_torch():
    code = "import sys, accountants.dpsgd, accountants.wishart, accountants.sketch; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"

"""Gaussian mechanism: exact profile, classical calibration, RDP and the [S] Sec. 4 conversions."""

import math

import numpy as np
import pytest
from scipy import integrate, stats

from accountants import gaussian

RNG_SEED = 20240611


def test_exact_profile_matches_paper_value():
    # docs/theory.md §2.1 / [W] Fig. 2: Delta/sigma = 1, delta = 1e-5 gives eps ~ 4.38.
    assert gaussian.epsilon(1e-5, 1.0, 1.0).epsilon == pytest.approx(4.38, rel=0.02)
    assert gaussian.epsilon(1e-5, 1.0, 1.0).epsilon == pytest.approx(4.377178, abs=1e-5)


def test_exact_profile_equals_hockey_stick_integral():
    # delta(eps) = int (p - e^eps q)_+ for p = N(mu, 1), q = N(0, 1).
    for eps, mu in [(0.0, 1.0), (0.5, 1.0), (2.0, 3.0), (1.0, 0.3)]:
        integrand = lambda x, eps=eps, mu=mu: max(stats.norm.pdf(x, mu) - math.exp(eps) * stats.norm.pdf(x), 0.0)  # noqa: E731
        direct, _ = integrate.quad(integrand, -20, 20 + mu, limit=400, points=[eps / mu + mu / 2])
        assert gaussian.delta_for_mu(eps, mu) == pytest.approx(direct, rel=1e-7, abs=1e-13)


def test_profile_is_stable_far_in_the_tail():
    # The naive difference Phi(a) - e^eps Phi(b) underflows/overflows here; the stable form stays > 0.
    value = gaussian.delta_for_mu(800.0, 30.0)
    assert 0 < value < 1e-20
    assert gaussian.delta_for_mu(1.0, 0.0) == 0.0


def test_epsilon_inverts_delta():
    for delta in (1e-12, 1e-5, 0.1):
        for sigma in (0.3, 1.0, 7.0):
            bound = gaussian.epsilon(delta, 1.0, sigma)
            reached = gaussian.delta(bound.epsilon, 1.0, sigma).delta
            if bound.epsilon > 0:
                assert reached == pytest.approx(delta, rel=1e-6)
            else:  # delta(0) = 2 Phi(mu/2) - 1 is already below the target
                assert reached <= delta
    assert gaussian.epsilon(0.1, 1.0, 7.0).epsilon == 0.0


def test_calibrate_sigma_inverts_epsilon():
    sigma = gaussian.calibrate_sigma(2.0, 1e-6, 3.0)
    assert gaussian.epsilon(1e-6, 3.0, sigma).epsilon == pytest.approx(2.0, rel=1e-8)


def test_classical_calibration_formula_and_domain():
    sigma = gaussian.classical_sigma(0.5, 1e-5, 2.0)
    assert sigma == pytest.approx(2.0 * math.sqrt(2 * math.log(1.25e5)) / 0.5)
    bound = gaussian.classical_epsilon(1e-5, 2.0, sigma)
    assert bound.epsilon == pytest.approx(0.5)
    # Classical calibration is valid, hence never below the exact epsilon.
    assert bound.epsilon >= gaussian.epsilon(1e-5, 2.0, sigma).epsilon
    with pytest.raises(ValueError, match="epsilon"):
        gaussian.classical_sigma(1.5, 1e-5, 1.0)
    outside = gaussian.classical_epsilon(1e-5, 1.0, 1.0)
    assert not outside.valid and math.isinf(outside.epsilon) and "eps < 1" in outside.reason


def test_privacy_loss_tail_is_two_sided_gaussian_tail_and_dominates_profile():
    for eps, mu in [(0.5, 1.0), (3.0, 2.0), (0.1, 0.2)]:
        loss = stats.norm(mu**2 / 2, mu)
        assert gaussian.privacy_loss_tail(eps, mu) == pytest.approx(loss.sf(eps) + loss.cdf(-eps), rel=1e-10)
        assert gaussian.privacy_loss_tail(eps, mu) >= gaussian.delta_for_mu(eps, mu)
    assert gaussian.privacy_loss_tail_epsilon(1e-5, 1.0) == pytest.approx(4.766, abs=1e-3)


def test_rdp_conversion_is_valid_and_close():
    # Prop. 4.3 gives an upper bound on the exact epsilon, within a modest factor for the Gaussian.
    for delta in (1e-3, 1e-5, 1e-9):
        for sigma in (0.5, 1.0, 4.0, 30.0):
            exact = gaussian.epsilon(delta, 1.0, sigma).epsilon
            converted = gaussian.rdp_epsilon(delta, 1.0, sigma).epsilon
            assert exact <= converted <= 1.3 * exact + 1e-3


def test_rdp_conversion_matches_closed_form_optimum():
    # For eps(alpha) = alpha rho the Prop. 4.3 objective is minimised numerically; compare with a fine scan.
    rho, delta = 0.02, 1e-6
    orders = np.linspace(1.001, 400, 400000)
    scan = np.min(orders * rho + (np.log(1 / delta) - np.log(orders)) / (orders - 1) + np.log1p(-1 / orders))
    value, _ = gaussian.rdp_to_dp(delta, lambda a: np.asarray(a) * rho)
    assert value == pytest.approx(scan, rel=1e-6)


def test_tcdp_conversion_branches():
    rho, delta = 0.01, 1e-5
    log_inv = math.log(1 / delta)
    # First branch: log(1/delta) <= (omega-1)^2 rho.
    omega = 1 + math.sqrt(log_inv / rho) + 1
    assert gaussian.tcdp_to_dp(delta, rho, omega) == pytest.approx(rho + 2 * math.sqrt(rho * log_inv))
    # Second branch.
    assert gaussian.tcdp_to_dp(delta, rho, 5.0) == pytest.approx(rho * 5 + log_inv / 4)
    # The two branches meet at log(1/delta) = (omega-1)^2 rho.
    boundary = 1 + math.sqrt(log_inv / rho)
    left = gaussian.tcdp_to_dp(delta, rho, boundary * (1 + 1e-9))
    right = gaussian.tcdp_to_dp(delta, rho, boundary * (1 - 1e-9))
    assert left == pytest.approx(right, rel=1e-6)
    with pytest.raises(ValueError, match="omega"):
        gaussian.tcdp_to_dp(delta, rho, 1.0)


def test_monotonicity_properties_over_random_points():
    rng = np.random.default_rng(RNG_SEED)
    for _ in range(250):
        sigma = float(np.exp(rng.uniform(-2, 3)))
        eps_a, eps_b = np.sort(rng.uniform(0, 10, 2))
        delta_a, delta_b = np.sort(np.exp(rng.uniform(math.log(1e-12), math.log(0.5), 2)))
        # delta(eps) non-increasing in eps; eps(delta) non-increasing in delta; eps non-increasing in sigma.
        assert gaussian.delta(eps_a, 1.0, sigma).delta >= gaussian.delta(eps_b, 1.0, sigma).delta
        assert gaussian.epsilon(delta_a, 1.0, sigma).epsilon >= gaussian.epsilon(delta_b, 1.0, sigma).epsilon
        assert gaussian.epsilon(delta_a, 1.0, sigma).epsilon >= gaussian.epsilon(delta_a, 1.0, 1.1 * sigma).epsilon


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: gaussian.epsilon(0.0, 1.0, 1.0), "delta"),
        (lambda: gaussian.epsilon(1.0, 1.0, 1.0), "delta"),
        (lambda: gaussian.epsilon(1e-5, 1.0, 0.0), "sigma"),
        (lambda: gaussian.epsilon(1e-5, 1.0, -1.0), "sigma"),
        (lambda: gaussian.epsilon(1e-5, 0.0, 1.0), "sensitivity"),
        (lambda: gaussian.delta(-1.0, 1.0, 1.0), "epsilon"),
        (lambda: gaussian.delta(math.nan, 1.0, 1.0), "epsilon"),
        (lambda: gaussian.calibrate_sigma(1.0, 2.0, 1.0), "delta"),
        (lambda: gaussian.rdp_epsilon(1e-5, 1.0, 0.0), "sigma"),
    ],
)
def test_impossible_inputs_raise_value_error_naming_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()

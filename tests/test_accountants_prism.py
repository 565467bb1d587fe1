"""[P] intrinsic noise energy (Thm 3.1, Eq. 21) and factor-space energy (Prop. 2.2, Cor. 2.3)."""

import math

import numpy as np
import pytest

from accountants import prism


def _tangent_projection(a, b, g):
    """[P] Eq. 13: P(G) = Pi_A G + G Pi_B - Pi_A G Pi_B (docs/theory.md §1.6), written here independently."""
    pi_a = a @ np.linalg.pinv(a.T @ a) @ a.T
    pi_b = b @ np.linalg.pinv(b.T @ b) @ b.T
    return pi_a @ g + g @ pi_b - pi_a @ g @ pi_b


def test_intrinsic_energy_closed_form():
    expected = 1.2 * 0.5 / 64 * math.sqrt(16 * (768 + 512 - 16))
    assert prism.intrinsic_noise_energy(1.2, 0.5, 64, 768, 512, 16) == pytest.approx(expected)


def test_intrinsic_energy_matches_monte_carlo_of_tangent_noise():
    # E |P(Xi)|_F^2 = r (m + n - r) for any full-rank factors (Thm 3.1); sum of 4000 chi2_{r(m+n-r)}/N.
    rng = np.random.default_rng(31)
    m, n, r, draws = 12, 9, 3, 4000
    a, b = rng.standard_normal((m, r)) * 5, rng.standard_normal((n, r)) * 0.1  # a badly scaled gauge
    energy = np.mean([np.sum(_tangent_projection(a, b, rng.standard_normal((m, n))) ** 2) for _ in range(draws)])
    dim = r * (m + n - r)
    assert abs(energy - dim) < 4 * math.sqrt(2 * dim / draws)  # chi2 sd = sqrt(2 dim)
    assert prism.intrinsic_noise_energy(1.0, 1.0, 1.0, m, n, r) == pytest.approx(math.sqrt(dim))


def test_factor_energy_matches_monte_carlo():
    rng = np.random.default_rng(32)
    m, n, r, tau, draws = 10, 7, 2, 0.3, 20000
    a, b = rng.standard_normal((m, r)), rng.standard_normal((n, r))
    expected = prism.factor_noise_energy(tau, m, n, r, np.linalg.norm(a), np.linalg.norm(b))
    xi_a = rng.standard_normal((draws, m, r)) * tau
    xi_b = rng.standard_normal((draws, n, r)) * tau
    first = np.sum((xi_a @ b.T + a @ np.swapaxes(xi_b, 1, 2)) ** 2, axis=(1, 2))
    bilinear = np.sum((xi_a @ np.swapaxes(xi_b, 1, 2)) ** 2, axis=(1, 2))
    assert abs(first.mean() - expected.first_order) < 4 * first.std() / math.sqrt(draws)
    assert abs(bilinear.mean() - expected.bilinear) < 4 * bilinear.std() / math.sqrt(draws)
    assert expected.effective == pytest.approx(math.sqrt(expected.first_order + expected.bilinear))


def test_factor_energy_is_unbounded_along_the_gauge_but_prism_is_not():
    # Cor. 2.3: (cA, B/c) keeps Z but the first-order energy m|B|^2/c^2 + n c^2 |A|^2 blows up.
    energies = [prism.factor_noise_energy(0.1, 64, 32, 4, c * 1.0, 1.0 / c).first_order for c in (1e-3, 1, 1e3)]
    assert energies[0] > 1e4 * energies[1] and energies[2] > 1e4 * energies[1]


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: prism.intrinsic_noise_energy(0.0, 1.0, 64, 10, 10, 2), "noise_multiplier"),
        (lambda: prism.intrinsic_noise_energy(1.0, 1.0, 0.0, 10, 10, 2), "batch_size"),
        (lambda: prism.intrinsic_noise_energy(1.0, 1.0, 64, 10, 10, 11), "r"),
        (lambda: prism.factor_noise_energy(0.0, 10, 10, 2, 1.0, 1.0), "tau"),
        (lambda: prism.factor_noise_energy(1.0, 10, 10, 2, -1.0, 1.0), "a_frobenius"),
    ],
)
def test_impossible_inputs_raise_value_error_naming_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()

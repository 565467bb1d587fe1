"""[S] Lemma 7.1 / 7.2 RDP, Cor. 7.3 tCDP and their conversions; conditional on lambda_bar, beta, C."""

import math

import numpy as np
import pytest

from accountants import gaussian, sketch

LORA = dict(
    lr=1e-3,
    smoothness=1.0,
    batch_size=64,
    lambda_min=1e4,
    sigma_g=1.0,
    grad_bound=1.0,
    steps=100,
    rank=16,
    layers=12,
    tau=768,
)


def test_rdp_curve_matches_equation_12():
    gamma, rank, tau, layers = 50.0, 8, 4, 3
    for order in (1.5, 10.0, 49.0):
        bracket = order * math.log(1 - 1 / gamma) - math.log(1 - order / gamma)
        expected = rank * layers * tau / (2 * (order - 1)) * bracket
        assert sketch.rdp_curve(order, gamma, rank, tau, layers) == pytest.approx(expected, rel=1e-10)
    assert math.isinf(sketch.rdp_curve(50.0, gamma, rank, tau)) and math.isinf(sketch.rdp_curve(1.0, gamma, rank, tau))
    # Large Gamma: the bracket is ~ alpha (alpha - 1) / (2 Gamma^2); log1p keeps it accurate.
    assert sketch.rdp_curve(3.0, 1e7, 1, 1) == pytest.approx(3.0 / (2 * 1e14), rel=1e-6)


def test_lora_gamma_is_lemma71_gamma_with_the_lora_bounds():
    # [S] D.2: sigma_A^2 = 1/r, B_F = T C, B_S = (2C/b) ((1+eta beta)^T - 1)/(eta beta).
    eta, beta, b, lam, sg, c, t, r = 1e-2, 2.0, 32, 5.0, 0.3, 0.7, 50, 8
    norm_bound = t * c
    sensitivity = 2 * c / b * ((1 + eta * beta) ** t - 1) / (eta * beta)
    direct = sketch.gamma_sketch(lam, sg, 1 / math.sqrt(r), norm_bound, sensitivity)
    assert sketch.gamma_lora(eta, beta, b, lam, sg, c, t, r) == pytest.approx(direct, rel=1e-12)


def test_corollary73_first_branch_is_the_papers_closed_form():
    delta = 1e-5
    bound = sketch.corollary73(delta, **LORA)
    gamma, k = bound.details["gamma"], LORA["rank"] * LORA["layers"] * LORA["tau"]
    assert math.log(1 / delta) <= (2 * gamma / 5 - 1) ** 2 * k / (2 * gamma**2)  # first branch applies
    closed = k / (2 * gamma**2) + math.sqrt(2 * k * math.log(1 / delta)) / gamma
    assert bound.epsilon == pytest.approx(closed, rel=1e-12)


def test_tcdp_line_dominates_rdp_curve_on_its_range_over_random_points():
    # Cor. 7.3's claim: eps(alpha) <= alpha r L tau / (2 Gamma^2) for alpha in (1, 2 Gamma / 5).
    rng = np.random.default_rng(21)
    for _ in range(250):
        gamma = float(2.5 + 10 ** rng.uniform(-3, 3))
        orders = np.linspace(1 + 1e-6, 2 * gamma / 5, 50)
        assert np.all(sketch.rdp_curve(orders, gamma, 1, 1) <= orders / (2 * gamma**2) * (1 + 1e-9))


def test_rdp_conversion_is_at_most_tcdp_conversion_and_monotone_over_random_points():
    rng = np.random.default_rng(22)
    for _ in range(250):
        params = dict(
            LORA,
            lambda_min=float(10 ** rng.uniform(3, 6)),
            sigma_g=float(rng.uniform(0, 3)),
            steps=int(rng.integers(10, 300)),
        )
        delta_small, delta_large = np.sort(10 ** rng.uniform(-10, -2, 2))
        rdp = sketch.lemma72(delta_small, **params)
        tcdp = sketch.corollary73(delta_small, **params)
        if tcdp.valid:  # both convert (a relaxation of) the same RDP curve; the direct one is tighter
            assert rdp.epsilon <= tcdp.epsilon * (1 + 1e-9)
        if rdp.valid:
            assert sketch.lemma72(delta_large, **params).epsilon <= rdp.epsilon + 1e-9
            noisier = dict(params, sigma_g=params["sigma_g"] + 0.5)
            assert sketch.lemma72(delta_small, **noisier).epsilon <= rdp.epsilon + 1e-9


def test_bounds_are_flagged_conditional():
    for bound in (
        sketch.lemma72(1e-5, **LORA),
        sketch.corollary73(1e-5, **LORA),
        sketch.lemma71(1e-5, 1.0, 1.0, 1.0, 1.0, 0.01, 8, 4),
    ):
        assert bound.valid and bound.is_conditional and bound.neighbouring == "replace-one"
    assert any("lambda_min" in c for c in sketch.lemma72(1e-5, **LORA).conditional_on)


def test_gamma_conditions_give_inf_with_reason():
    small = dict(LORA, lambda_min=10.0, sigma_g=0.0)
    assert sketch.gamma_lora(**{k: v for k, v in small.items() if k not in ("layers", "tau")}) < 1
    for bound in (sketch.lemma72(1e-5, **small), sketch.corollary73(1e-5, **small)):
        assert not bound.valid and math.isinf(bound.epsilon) and "Gamma" in bound.reason and bound.is_conditional
    between = sketch.lemma71(1e-5, 2.0, 0.0, 1.0, 1.0, 1.0, 8, 4)  # Gamma = 2/2 = 1: not > 1
    assert not between.valid


def test_lemma71_single_sketch_rdp_conversion_matches_generic_conversion():
    bound = sketch.lemma71(1e-6, 1.0, 1.0, 1.0, 1.0, 0.01, 8, 4)
    value, _ = gaussian.rdp_to_dp(1e-6, lambda a: sketch.rdp_curve(a, 100.0, 8, 4), max_order=100.0)
    assert bound.epsilon == pytest.approx(value, rel=1e-9)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: sketch.lemma72(0.0, **LORA), "delta"),
        (lambda: sketch.lemma72(1e-5, **dict(LORA, lr=0.0)), "lr"),
        (lambda: sketch.lemma72(1e-5, **dict(LORA, sigma_g=-1.0)), "sigma_g"),
        (lambda: sketch.lemma72(1e-5, **dict(LORA, grad_bound=0.0)), "grad_bound"),
        (lambda: sketch.corollary73(1e-5, **dict(LORA, rank=0)), "rank"),
        (lambda: sketch.lemma71(1e-5, 1.0, 1.0, 0.0, 1.0, 0.01, 8, 4), "sigma_a"),
    ],
)
def test_impossible_inputs_raise_value_error_naming_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()

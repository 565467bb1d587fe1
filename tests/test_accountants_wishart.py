"""[W] bounds: paper values, identities, Monte-Carlo cross-checks and validity properties.

Statistical checks use fixed seeds; confidence bands are empirical-Bernstein (finite-sample valid).
Where many points are checked against a band, the band is at level 1 - 1e-4 per point, so with 250
points the family-wise error rate is at most 2.5% (and, seeds being fixed, the outcome is deterministic).
"""

import math

import numpy as np
import pytest
from scipy import integrate, stats

from accountants import gaussian, wishart
from accountants._montecarlo import SampledMixture, SortedLosses

POINTS = 250
STRICT = 1 - 1e-4


# ------------------------------------------------------------------------------------------ paper values


def test_theorem1_reproduces_paper_example():
    bound = wishart.theorem1(rho=0.9999, d=400, r=16, delta_prime=1e-3)
    assert bound.epsilon == pytest.approx(5.87, rel=0.02)
    assert bound.delta == pytest.approx(0.003, rel=0.02)


@pytest.mark.parametrize("r, theorem5, mixture", [(8, 0.64, 0.26), (128, 1.47, 0.96)])
def test_m2_bounds_reproduce_spec_values(r, theorem5, mixture):
    # d = 2000, delta = 1e-5, |Delta V|/sigma = 1, s = 1 (docs/theory.md §2.7, [W] Fig. 2).
    assert wishart.theorem5_epsilon(1e-5, 1.0, 1.0, 2000, r, 1).epsilon == pytest.approx(theorem5, rel=0.02)
    assert wishart.m2_mixture_epsilon(1e-5, 1.0, 1.0, 2000, r).epsilon == pytest.approx(mixture, rel=0.02)


# ------------------------------------------------------------------------------------------ Theorem 1


def test_support_escape_closed_form_equals_paper_expectation():
    # [W] Eq. 17: E_{x ~ chi2_r}[Phi(-rho sqrt x / sqrt(1-rho^2))] equals the Student-t CDF we use.
    for rho, r in [(0.3, 1), (0.9, 4), (0.99, 16), (-0.5, 7)]:
        c = rho / math.sqrt(1 - rho**2)
        integrand = lambda x, c=c, r=r: stats.norm.cdf(-c * math.sqrt(x)) * stats.chi2.pdf(x, r)  # noqa: E731
        expectation, _ = integrate.quad(integrand, 0, np.inf)
        assert wishart.theorem1(0.9999, 400, 16, 1e-3).details["support_escape"] < 1e-30
        assert wishart._support_escape(rho, r) == pytest.approx(expectation, rel=1e-7, abs=1e-15)


def test_theorem1_condition_failure_gives_inf_with_reason():
    bound = wishart.theorem1(rho=0.2, d=100, r=4, delta_prime=1e-3)
    assert not bound.valid and math.isinf(bound.epsilon) and "rho > K" in bound.reason


def test_theorem1_epsilon_and_delta_are_inverse():
    bound = wishart.theorem1_epsilon(0.01, 0.999, 200, 8)
    assert bound.details["delta_prime"] == pytest.approx((0.01 - bound.details["support_escape"]) / 3)
    back = wishart.theorem1_delta(bound.epsilon, 0.999, 200, 8)
    assert back.delta == pytest.approx(0.01, rel=1e-6)


# ------------------------------------------------------------------------------------------ exact vector profile


def _direct_losses(rho, d, r, samples, rng):
    """Privacy losses from explicit y = M v and the density of [W] Lemma 9 with exponent (r-d-1)/2."""
    v = np.zeros(d)
    v[0] = 1.0
    v_prime = np.zeros(d)
    v_prime[0], v_prime[1] = rho, math.sqrt(1 - rho**2)
    z = rng.standard_normal((samples, d, r)) / math.sqrt(r)
    y = np.einsum("nij,nkj,k->ni", z, z, v)
    vy, vpy, yy = y @ v, y @ v_prime, np.sum(y**2, axis=1)
    inside = vpy > 0
    exponent = (r - d - 1) / 2

    def log_density(proj):
        return exponent * np.log(proj) - r * yy[inside] / (2 * proj)

    return log_density(vy[inside]) - log_density(vpy[inside]), int(np.sum(~inside))


def test_lemma8_loss_matches_explicit_projection():
    # Profiles from Lemma 8's (A, B) and from explicit y = Mv with Lemma 9's density agree within their bands.
    rho, d, r = 0.9, 6, 2
    losses, atoms = _direct_losses(rho, d, r, 200000, np.random.default_rng(1))
    direct = SortedLosses(losses, atoms, confidence=0.999)
    profile = wishart.vector_profile(rho, d, r, samples=200000, seed=2, confidence=0.999)
    for eps in (0.0, 0.5, 1.0, 2.0, 4.0):
        _, lo, hi = (x[0] for x in direct.bands(np.array([eps])))
        sampled = profile.delta(eps)
        assert sampled.delta_interval[0] <= hi and lo <= sampled.delta_interval[1]
        assert lo <= sampled.delta <= hi


def test_corrected_density_exponent_is_a_likelihood_ratio():
    # E_{y~P}[e^{-L(y)} ; y in supp Q] = Q(supp P) = 1 - P(A <= 0) by symmetry. With the printed
    # exponent (r-d+1)/2 of [W] Eq. 25 the loss would change by 2 ln A and this identity would fail.
    rho, d, r = 0.6, 8, 3
    losses, _ = _direct_losses(rho, d, r, 200000, np.random.default_rng(3))
    ratio = np.exp(-losses)
    mean = ratio.sum() / 200000
    error = 4 * ratio.std() / math.sqrt(200000)
    assert abs(mean - (1 - wishart._support_escape(rho, r))) < error


def test_profile_inversion_is_consistent_with_its_delta():
    profile = wishart.vector_profile(0.99, 100, 8, samples=100000, seed=4)
    bound = profile.epsilon(0.05)
    assert profile.delta(bound.epsilon).delta == pytest.approx(0.05, rel=1e-6)
    lo, hi = bound.epsilon_interval
    assert lo <= bound.epsilon <= hi
    assert profile.delta(lo).delta_interval[0] <= 0.05 <= profile.delta(hi).delta_interval[1]


def test_profile_below_support_escape_is_inapplicable():
    profile = wishart.vector_profile(0.1, 50, 1, samples=20000, seed=5)
    assert profile.losses.atoms / profile.losses.n > 0.4  # A <= 0 often when rho is small and r = 1
    bound = profile.epsilon(0.2)
    assert not bound.valid and "P(A <= 0)" in bound.reason


def test_theorem1_dominates_exact_profile_over_random_points():
    # Validity: eps of Thm 1 >= the lower confidence limit of the exact profile's eps at Thm 1's delta.
    rng = np.random.default_rng(11)
    checked = 0
    while checked < POINTS:
        d = int(rng.integers(3, 500))
        r = int(rng.integers(1, d + 1))
        rho = float(1 - 10 ** rng.uniform(-6, -0.5))
        bound = wishart.theorem1(rho, d, r, float(10 ** rng.uniform(-4, -1.5)))
        if not bound.valid:
            continue
        exact = wishart.vector_profile(rho, d, r, samples=4000, seed=checked, confidence=STRICT).epsilon(bound.delta)
        assert bound.epsilon >= exact.epsilon_interval[0]
        checked += 1


def test_vector_bounds_monotone_over_random_points():
    rng = np.random.default_rng(17)
    for seed in range(POINTS):
        d = int(rng.integers(3, 500))
        r = int(rng.integers(1, d + 1))
        rho = float(1 - 10 ** rng.uniform(-6, -0.5))
        delta_a, delta_b = np.sort(10 ** rng.uniform(-4, -0.5, 2))
        eps_a, eps_b = np.sort(rng.uniform(0, 5, 2))
        theorem1 = [wishart.theorem1_epsilon(delta, rho, d, r).epsilon for delta in (delta_a, delta_b)]
        assert theorem1[0] >= theorem1[1]
        assert wishart.theorem1_delta(eps_a, rho, d, r).delta >= wishart.theorem1_delta(eps_b, rho, d, r).delta
        profile = wishart.vector_profile(rho, d, r, samples=2000, seed=seed)
        assert profile.epsilon(delta_a).epsilon >= profile.epsilon(delta_b).epsilon
        assert profile.delta(eps_a).delta >= profile.delta(eps_b).delta


# ------------------------------------------------------------------------------------------ M2: Thm 5 and mixture


def _revealed_projection_profile(mu, d, r, samples, rng):
    """Exact profile of the release (M, M(V + Xi)) by explicit Haar subspaces (QR of Gaussian matrices)."""
    q, _ = np.linalg.qr(rng.standard_normal((samples, d, r)))
    captured = np.sum(q[:, 0, :] ** 2, axis=1)  # |P_M e_1|^2
    return SampledMixture(mu * np.sqrt(captured), gaussian.delta_for_mu, confidence=STRICT)


def test_theorem5_and_mixture_dominate_revealed_projection_profile_over_random_points():
    rng = np.random.default_rng(12)
    for _ in range(POINTS):
        d = int(rng.integers(2, 25))
        r = int(rng.integers(1, d))
        sigma = float(10 ** rng.uniform(-0.7, 0.7))
        eps = float(rng.uniform(0.0, 3.0))
        reference = _revealed_projection_profile(1 / sigma, d, r, 2000, rng)
        lower, upper = (float(x[0]) for x in reference.bands(np.array([eps]))[1:])
        mixture = wishart.m2_mixture_delta(eps, 1.0, sigma, d, r).delta
        theorem5 = wishart.theorem5_delta(eps, 1.0, sigma, d, r, 1).delta
        # The mixture bound is the exact profile of the revealed release; Thm 5 bounds it from above.
        assert lower <= mixture <= upper
        assert theorem5 >= lower and theorem5 >= mixture - 1e-12


def test_mixture_is_tighter_than_theorem5_and_gaussian_over_random_points():
    rng = np.random.default_rng(13)
    for _ in range(POINTS):
        d = int(rng.integers(10, 5000))
        r = int(rng.integers(1, d))
        sigma = float(10 ** rng.uniform(-0.5, 1))
        delta = float(10 ** rng.uniform(-9, -2))
        mixture = wishart.m2_mixture_epsilon(delta, 1.0, sigma, d, r).epsilon
        assert mixture <= wishart.theorem5_epsilon(delta, 1.0, sigma, d, r, 1).epsilon + 1e-6
        assert mixture <= gaussian.epsilon(delta, 1.0, sigma).epsilon + 1e-6


def test_multistep_mixture_reduces_to_the_one_step_quadrature_from_above():
    # One layer at T = 1 is m2_mixture_epsilon's rank-1 profile; rounding X up to its grid cell keeps it above.
    for r in (8, 128):
        exact = wishart.m2_mixture_epsilon(1e-5, 1.0, 1.0, 2000, r).epsilon
        coarse = wishart.m2_mixture_multistep_epsilon(1e-5, 1.0, 1.0, [2000], r, 1).epsilon
        fine = wishart.m2_mixture_multistep_epsilon(1e-5, 1.0, 1.0, [2000], r, 1, grid=20000).epsilon
        assert exact <= fine <= coarse <= exact * 1.02


def test_multistep_mixture_matches_sampled_haar_projections():
    # X = sum_t max_l |P_{M_tl} e_1|^2 from explicit Haar subspaces (QR), two layers, T = 3: the sampled profile's
    # band at the bound's epsilon contains delta (the grid's rounding up is far inside the band at 20000 samples).
    rng = np.random.default_rng(15)
    dims, r, steps, sigma, delta = (6, 10), 2, 3, 0.8, 1e-2
    captured = np.zeros(20000)
    for _ in range(steps):
        per_layer = [np.sum(np.linalg.qr(rng.standard_normal((20000, d, r)))[0][:, 0, :] ** 2, axis=1) for d in dims]
        captured += np.max(per_layer, axis=0)
    reference = SampledMixture(np.sqrt(captured) / sigma, gaussian.delta_for_mu, confidence=STRICT)
    bound = wishart.m2_mixture_multistep_epsilon(delta, 1.0, sigma, dims, r, steps)
    _, lower, upper = (float(x[0]) for x in reference.bands(np.array([bound.epsilon])))
    assert lower <= delta <= upper


def test_multistep_mixture_is_below_theorem5_f2_at_the_tightness_campaign():
    # experiments/audit_tightness.py's m2 cells: digits' MLP (d_in = 64, 128, 128), r = 8, sigma = 2, T = 4, q = 1.
    mixture = wishart.m2_mixture_multistep_epsilon(1e-5, 1.0, 2.0, [64, 128, 128], 8, 4).epsilon
    theorem5 = wishart.m2_multistep_epsilon(1e-5, 1.0, 2.0, 64, 8, 3, 1.0, 4).epsilon
    assert mixture == pytest.approx(1.498, abs=0.005)
    assert mixture < theorem5 == pytest.approx(3.141, abs=0.005)
    assert mixture < gaussian.epsilon_for_mu(1e-5, 1.0)
    # Each extra layer or step can only raise it.
    assert wishart.m2_mixture_multistep_epsilon(1e-5, 1.0, 2.0, [64], 8, 4).epsilon < mixture
    assert wishart.m2_mixture_multistep_epsilon(1e-5, 1.0, 2.0, [64, 128, 128], 8, 3).epsilon < mixture


def test_m2_monotonicity_over_random_points():
    rng = np.random.default_rng(14)
    for _ in range(POINTS):
        d = int(rng.integers(10, 3000))
        r = int(rng.integers(1, d))
        s = int(rng.integers(1, min(d, 50) + 1))
        sigma = float(10 ** rng.uniform(-0.5, 1))
        delta_a, delta_b = np.sort(10 ** rng.uniform(-9, -2, 2))
        eps_a, eps_b = np.sort(rng.uniform(0, 5, 2))
        for bound_epsilon in (
            lambda dl, sg, d=d, r=r, s=s: wishart.theorem5_epsilon(dl, 1.0, sg, d, r, s).epsilon,
            lambda dl, sg, d=d, r=r: wishart.m2_mixture_epsilon(dl, 1.0, sg, d, r).epsilon,
        ):
            base = bound_epsilon(delta_a, sigma)
            assert bound_epsilon(delta_b, sigma) <= base + 1e-9
            assert bound_epsilon(delta_a, 1.1 * sigma) <= base + 1e-9
        assert (
            wishart.theorem5_delta(eps_a, 1.0, sigma, d, r, s).delta
            >= wishart.theorem5_delta(eps_b, 1.0, sigma, d, r, s).delta - 1e-12
        )
        assert (
            wishart.m2_mixture_delta(eps_a, 1.0, sigma, d, r).delta
            >= wishart.m2_mixture_delta(eps_b, 1.0, sigma, d, r).delta - 1e-12
        )


def test_theorem5_delta_at_optimal_alpha_matches_epsilon_search():
    bound = wishart.theorem5_epsilon(1e-5, 1.0, 1.0, 2000, 8, 1)
    alpha = bound.details["alpha"]
    at_alpha = wishart.theorem5_delta(bound.epsilon, 1.0, 1.0, 2000, 8, 1, alpha=alpha)
    assert at_alpha.delta == pytest.approx(1e-5, rel=1e-6)
    assert wishart.theorem5_delta(bound.epsilon, 1.0, 1.0, 2000, 8, 1).delta <= 1e-5 * (1 + 1e-6)


def test_theorem5_needs_r_below_d():
    bound = wishart.theorem5_epsilon(1e-5, 1.0, 1.0, 20, 20, 1)
    assert not bound.valid and "Lemma 17" in bound.reason
    # With r = d the projection keeps everything: the mixture bound is the plain Gaussian.
    assert wishart.m2_mixture_epsilon(1e-5, 1.0, 1.0, 20, 20).epsilon == pytest.approx(4.3772, abs=1e-4)


def test_captured_energy_laws():
    rng = np.random.default_rng(15)
    # One direction: Beta(r/2, (d-r)/2) ([W] Lemma 17), checked by KS at level 1e-3.
    single = wishart.captured_energy(rng, 50, 5, 1, 20000)[:, 0]
    assert stats.kstest(single, stats.beta(2.5, 22.5).cdf).pvalue > 1e-3
    # All d directions: the energies sum to r exactly (trace of the projector).
    full = wishart.captured_energy(rng, 12, 5, 12, 300)
    assert np.allclose(full.sum(axis=1), 5.0)
    # Both code paths (s <= r and s > r) against explicit QR, two-sample KS per coordinate.
    for d, r, s in [(20, 6, 3), (20, 3, 6)]:
        fast = wishart.captured_energy(rng, d, r, s, 4000)
        q, _ = np.linalg.qr(rng.standard_normal((4000, d, r)))
        explicit = np.sum(q[:, :s, :] ** 2, axis=2)
        for j in range(s):
            assert stats.ks_2samp(fast[:, j], explicit[:, j]).pvalue > 1e-3


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")  # reference converges to 1e-7 regardless
def test_mixture_quadrature_matches_adaptive_quadrature():
    # E f(B) = int_0^1/2 f(F^-1(u)) du + int_0^1/2 f(F^-1(1 - v)) dv, adaptively, tails resolved by break points.
    for eps, mu, d, r in [(0.3, 1.0, 2000, 8), (2.0, 5.0, 30, 12), (5.0, 0.5, 400, 1), (0.1, 20.0, 50, 49)]:
        law = stats.beta(r / 2, (d - r) / 2)
        f = lambda b, eps=eps, mu=mu: gaussian.delta_for_mu(eps, mu * math.sqrt(b))  # noqa: E731
        tails = list(10.0 ** -np.arange(1, 16))
        quad = dict(points=tails, limit=500, epsabs=0, epsrel=1e-10)
        lower, _ = integrate.quad(lambda u, f=f, law=law: f(law.ppf(u)), 0, 0.5, **quad)
        upper, _ = integrate.quad(lambda v, f=f, law=law: f(law.isf(v)), 0, 0.5, **quad)
        assert wishart.m2_mixture_delta(eps, 1.0, 1 / mu, d, r).delta == pytest.approx(lower + upper, rel=1e-7)


def test_sampled_mixture_agrees_with_rank_one_quadrature():
    quadrature = wishart.m2_mixture_epsilon(1e-2, 1.0, 1.0, 200, 8)
    sampled = wishart.m2_mixture_epsilon(1e-2, 1.0, 1.0, 200, 8, [1.0, 1e-9], samples=20000, seed=3)
    assert sampled.epsilon_interval[0] <= quadrature.epsilon <= sampled.epsilon_interval[1]
    # Spreading the same Frobenius norm over directions concentrates mu_M: the bound does not get worse.
    spread = wishart.m2_mixture_epsilon(1e-2, 1.0, 1.0, 200, 8, [1.0, 1.0, 1.0, 1.0], samples=20000, seed=3)
    assert spread.epsilon_interval[0] <= quadrature.epsilon


def test_multistep_reduces_to_gaussian_for_one_full_batch_step():
    bound = wishart.m2_multistep_epsilon(1e-5, 1.0, 2.0, 500, 4, 1, sample_rate=1.0, steps=1, delta_projection=2e-6)
    alpha = bound.details["alpha"]
    assert wishart._failure_probability(alpha, 500, 4, 1) == pytest.approx(2e-6, rel=1e-6)
    exact = gaussian.epsilon(1e-5 - 2e-6, math.sqrt(alpha), 2.0).epsilon
    assert bound.epsilon == pytest.approx(exact, rel=0.01) and bound.epsilon >= exact - 1e-9
    optimised = wishart.m2_multistep_epsilon(1e-5, 1.0, 2.0, 500, 4, 1, sample_rate=1.0, steps=1)
    assert optimised.epsilon <= bound.epsilon * 1.001


# ------------------------------------------------------------------------------------------ M1


def test_lemma14_gamma_formula_and_coverage():
    d, r, s, beta = 30, 10, 3, 0.2
    g = math.sqrt(2 * math.log(2 / beta))
    gamma = wishart.lemma14_gamma(beta, d, r, s)
    assert gamma == pytest.approx((math.sqrt(d) + math.sqrt(3) + g) * (math.sqrt(3) + g) / r)
    # P(|M_par u| > Gamma) <= beta: simulate M_par = Z P_H Z^T with H = rowspan(U^T Z), U = first s axes.
    rng = np.random.default_rng(16)
    z = rng.standard_normal((20000, d, r)) / math.sqrt(r)
    basis, _ = np.linalg.qr(np.swapaxes(z[:, :s, :], 1, 2))  # orthonormal basis of H, shape (n, r, s)
    z_par = z @ basis
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    norms = np.linalg.norm(z_par @ np.einsum("nis,i->ns", z_par, u)[..., None], axis=(1, 2))
    exceed = int(np.sum(norms > gamma))
    assert stats.binom.cdf(exceed, 20000, beta) < 1 - 1e-4  # not significantly above beta


def test_lemma2_is_theorem1_on_the_residual_and_trivial_cases():
    bound = wishart.lemma2_residual(0.999, 300, 40, 10, 3e-3)
    instance = wishart.theorem1(0.999, 290, 30, 1e-3)
    assert bound.epsilon == pytest.approx(instance.epsilon)
    assert bound.delta == pytest.approx(instance.details["support_escape"] + 3e-3)
    assert wishart.lemma2_residual(0.5, 300, 40, 50, 1e-3).epsilon == 0.0  # q = r - min(s, r) = 0
    assert wishart.lemma2_residual(0.5, 300, 40, 10, 1e-3, beta_perp=0.0).delta == 0.0
    with pytest.raises(ValueError, match="beta_perp"):
        wishart.lemma2_residual(0.5, 30, 4, 30, 1e-3)


def test_theorem4_composes_its_parts_and_flags_classical_outside_range():
    args = (0.05, 1.0, 500, 64, 4, 0.999)
    bound = wishart.theorem4(*args, 1e-6, 2e-6, 3e-6)
    correlated = wishart.lemma15_correlated(0.05, 1.0, 500, 64, 4, 1e-6, 2e-6)
    residual = wishart.lemma2_residual(0.999, 500, 64, 4, 3e-6)
    assert bound.epsilon == pytest.approx(correlated.epsilon + residual.epsilon)
    assert bound.delta == pytest.approx(1e-6 + 2e-6 + residual.delta)
    classical = wishart.theorem4(0.5, 0.1, 500, 64, 4, 0.999, 1e-6, 2e-6, 3e-6, calibration="classical")
    assert not classical.valid and "eps < 1" in classical.reason
    assert wishart.theorem4(*args, 1e-6, 2e-6, 3e-6, calibration="classical").epsilon >= bound.epsilon


def test_theorem4_epsilon_spends_at_most_delta_and_beats_an_even_split():
    delta = 1e-5
    best = wishart.theorem4_epsilon(delta, 0.05, 1.0, 500, 64, 4, 0.999)
    spent = best.details["delta_parallel"] + best.details["delta_s"] + best.details["delta_perp"]
    assert spent <= delta
    escape = wishart._support_escape(0.999, 60)
    even = wishart.theorem4(0.05, 1.0, 500, 64, 4, 0.999, *([(delta - escape) / 3 * 0.999] * 3))
    assert best.epsilon <= even.epsilon


def test_theorem3_composition():
    one = wishart.theorem4(0.01, 1.0, 500, 64, 4, 0.999999, 1e-7, 1e-7, 1e-7)
    chain = wishart.theorem3(3, one)
    assert chain.epsilon == pytest.approx(3 * one.epsilon)
    assert chain.delta == pytest.approx(3 * math.exp(2 * one.epsilon) * one.delta)
    vacuous = wishart.theorem3(3, wishart.theorem4(0.05, 1.0, 500, 64, 4, 0.999, 1e-7, 1e-7, 1e-7))
    assert not vacuous.valid and "vacuous" in vacuous.reason
    solved = wishart.theorem3_epsilon(1e-3, 2, 0.01, 1.0, 500, 64, 4, 0.999999)
    assert solved.valid
    assert solved.details["delta_one"] * 2 * math.exp(solved.details["epsilon_one"]) <= 1e-3


# ------------------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: wishart.theorem1(0.9, 10, 11, 1e-3), "r"),
        (lambda: wishart.theorem1(1.5, 10, 2, 1e-3), "rho"),
        (lambda: wishart.theorem1(-1.0, 10, 2, 1e-3), "rho"),
        (lambda: wishart.theorem1(0.9, 10, 2, 0.0), "delta_prime"),
        (lambda: wishart.theorem1_epsilon(1.0, 0.9, 10, 2), "delta"),
        (lambda: wishart.vector_profile_epsilon(0.01, 0.9, 10, 20), "r"),
        (lambda: wishart.vector_profile_epsilon(0.01, 2.0, 10, 2), "rho"),
        (lambda: wishart.vector_profile_delta(-1.0, 0.9, 10, 2), "epsilon"),
        (lambda: wishart.theorem5_epsilon(1e-5, 1.0, 0.0, 100, 8, 1), "sigma"),
        (lambda: wishart.theorem5_epsilon(1e-5, 1.0, -1.0, 100, 8, 1), "sigma"),
        (lambda: wishart.theorem5_epsilon(1e-5, 1.0, 1.0, 100, 200, 1), "r"),
        (lambda: wishart.theorem5_epsilon(0.0, 1.0, 1.0, 100, 8, 1), "delta"),
        (lambda: wishart.theorem5_delta(1.0, 1.0, 1.0, 100, 8, 1, alpha=1.5), "alpha"),
        (lambda: wishart.theorem5_delta(1.0, 1.0, 1.0, 100, 8, 101), "s"),
        (lambda: wishart.m2_mixture_epsilon(1e-5, 1.0, 0.0, 100, 8), "sigma"),
        (lambda: wishart.m2_mixture_epsilon(1.5, 1.0, 1.0, 100, 8), "delta"),
        (lambda: wishart.m2_mixture_epsilon(1e-5, 1.0, 1.0, 10, 80), "r"),
        (lambda: wishart.m2_mixture_epsilon(1e-5, 1.0, 1.0, 10, 8, [1.0, -1.0]), "singular_values"),
        (lambda: wishart.m2_multistep_epsilon(1e-5, 1.0, 0.0, 100, 8, 1, 0.01, 10), "sigma"),
        (lambda: wishart.m2_multistep_epsilon(1e-5, 1.0, 1.0, 100, 8, 1, 0.0, 10), "sample_rate"),
        (lambda: wishart.theorem4(0.1, 0.0, 100, 8, 2, 0.9, 1e-6, 1e-6, 1e-6), "sigma"),
        (lambda: wishart.theorem4(0.1, 1.0, 100, 108, 2, 0.9, 1e-6, 1e-6, 1e-6), "r"),
        (lambda: wishart.theorem4(0.1, 1.0, 100, 8, 2, 1.9, 1e-6, 1e-6, 1e-6), "rho"),
        (lambda: wishart.theorem4(0.1, 1.0, 100, 8, 2, 0.9, 0.0, 1e-6, 1e-6), "delta_parallel"),
        (lambda: wishart.theorem4(3.0, 1.0, 100, 8, 2, 0.9, 1e-6, 1e-6, 1e-6), "sensitivity"),
        (lambda: wishart.theorem4_epsilon(2.0, 0.1, 1.0, 100, 8, 2, 0.9), "delta"),
        (lambda: wishart.lemma14_gamma(0.1, 10, 2, 11), "s"),
    ],
)
def test_impossible_inputs_raise_value_error_naming_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()

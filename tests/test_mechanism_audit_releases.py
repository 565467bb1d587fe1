"""Release samplers and neighbouring pairs (dpaudit.release_audit.releases): constructions, exact reductions, seeds.

Statistical checks use fixed seeds; each states its false-alarm rate for correct code.
"""

import argparse
import json
import math
import re
from dataclasses import dataclass

import numpy as np
import pytest
from scipy import integrate, special, stats

from accountants.result import REPLACE_ONE, Bound
from accountants.validation import InvalidArgument
from dpaudit.cli import build_parser, main
from dpaudit.release_audit import kinds, releases
from dpaudit.release_audit.audit import audit, log_likelihood_ratio


def test_aligned_unit_vectors_have_the_alignment():
    pair = releases.aligned_unit_vectors(50, 0.37, seed=4)
    assert np.linalg.norm(pair.v) == pytest.approx(1, abs=1e-12)
    assert np.linalg.norm(pair.v_prime) == pytest.approx(1, abs=1e-12)
    assert pair.rho == pytest.approx(0.37, abs=1e-12)
    assert pair.sensitivity == pytest.approx(math.sqrt(2 * (1 - 0.37)), abs=1e-12)


def test_one_column_change_has_the_parameters_of_definition_4():
    pair = releases.one_column_change(20, 4, beta_perp=0.6, rho_parallel=0.8, rho_perp=0.9, seed=1)
    rest = pair.V[:, :3]
    projector = rest @ np.linalg.pinv(rest)
    a, a_prime = projector @ pair.V[:, 3], projector @ pair.V_prime[:, 3]
    b, b_prime = pair.V[:, 3] - a, pair.V_prime[:, 3] - a_prime
    assert pair.changed_columns == (3,)
    assert np.allclose(np.linalg.norm(pair.V, axis=0), 1) and np.allclose(np.linalg.norm(pair.V_prime, axis=0), 1)
    assert (np.linalg.norm(b), np.linalg.norm(b_prime)) == pytest.approx((0.6, 0.6), abs=1e-12)
    assert a @ a_prime / (np.linalg.norm(a) * np.linalg.norm(a_prime)) == pytest.approx(0.8, abs=1e-12)
    assert b @ b_prime / (np.linalg.norm(b) * np.linalg.norm(b_prime)) == pytest.approx(0.9, abs=1e-12)
    assert pair.span_dimension == 3
    assert pair.column_sensitivity == pytest.approx(np.linalg.norm(pair.V - pair.V_prime), abs=1e-12)


def test_low_rank_change_has_rank_and_frobenius_norm():
    pair = releases.low_rank_change(30, 5, rank=2, frobenius_norm=0.7, seed=3)
    assert pair.difference_rank == 2
    assert pair.frobenius_distance == pytest.approx(0.7, abs=1e-12)
    assert pair.difference_singular_values == pytest.approx([0.7 / math.sqrt(2)] * 2, abs=1e-12)


def test_tight_sketch_pair_removes_a_column_along_the_smallest_eigenvector():
    pair = releases.sketch_pair(4, 10, norm_bound=3.0, sensitivity=0.5, lambda_min=1.0, seed=2)
    values, vectors = np.linalg.eigh(pair.Q @ pair.Q.T)
    column = pair.Q[:, pair.column]
    assert pair.lambda_min == pytest.approx(1.0, abs=1e-12)
    assert abs(column @ vectors[:, 0]) == pytest.approx(0.5, abs=1e-12)  # c = B_S u_min
    assert (pair.norm_bound, pair.sensitivity) == pytest.approx((3.0, 0.5), abs=1e-12)
    assert pair.gram_sensitivity == pytest.approx(0.25, abs=1e-12)  # B_C = B_S^2
    assert pair.lambda_min_neighbour == pytest.approx(0.75, abs=1e-12)
    assert np.count_nonzero(np.any(pair.Q != pair.Q_prime, axis=0)) == 1


@pytest.mark.parametrize(
    "build,message",
    [
        (lambda: releases.aligned_unit_vectors(10, 1.5), "rho must be in"),
        (lambda: releases.one_column_change(4, 4, 1.0, 1.0, 0.9), "d must be >= n + 1"),
        (lambda: releases.one_column_change(10, 2, 0.5, 0.9, 0.9), "rho_parallel"),
        (lambda: releases.one_column_change(10, 1, 0.5, 1.0, 0.9), "beta_perp must be 1"),
        (lambda: releases.low_rank_change(10, 3, 4, 1.0), "rank must be <= min(d, n)"),
        (lambda: releases.sketch_pair(4, 10, 1.0, 0.5, 1.0), "norm_bound^2"),
        (lambda: releases.sketch_pair(4, 10, 3.0, 1.0, 1.0), "sensitivity^2"),
        (lambda: releases.sketch_pair(4, 4, 3.0, 0.5, 1.0), "m must be >= n + 1"),
        (lambda: releases.WishartVector(releases.vectors_at_distance(5, 0.5), 2), "unit vector"),
        (
            lambda: releases.GaussianMechanism(releases.vectors_at_distance(5, 0.5), 0.0),
            "sigma must be in [1e-75, 1e+75]",
        ),
        (lambda: releases.GaussianSketchRelease(releases.sketch_pair(4, 10, 3.0, 0.5, 1.0), 4, 1.0, -1.0), "sigma_g"),
    ],
)
def test_bad_parameters_raise_naming_the_parameter(build, message):
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        build()


def test_sampling_is_reproducible_from_the_seed():
    mechanism = releases.WishartVector(releases.aligned_unit_vectors(20, 0.9), 4)
    first = mechanism.sample(np.random.default_rng([7, 1]), 5, "V")
    again = mechanism.sample(np.random.default_rng([7, 1]), 5, "V")
    other = mechanism.sample(np.random.default_rng([7, 2]), 5, "V")
    assert np.array_equal(first, again) and not np.allclose(first, other)
    with pytest.raises(ValueError, match="side must be"):
        mechanism.sample(np.random.default_rng(0), 5, "W")


@pytest.mark.parametrize(
    "mechanism",
    [
        releases.GaussianMechanism(releases.vectors_at_distance(6, 1.0, seed=1), 0.7),
        releases.WishartVector(releases.aligned_unit_vectors(12, 0.6, seed=3), 3),
        releases.GaussianSketchRelease(releases.sketch_pair(3, 6, 2.0, 0.3, 1.0, seed=2), 4, 0.5, 0.1),
    ],
    ids=["gaussian", "wishart-vector", "sketch"],
)
def test_statistic_drawn_from_its_law_matches_full_releases(mechanism):
    """Two-sample Kolmogorov-Smirnov on every statistic column and on L, 20000 draws each side.

    One test per column and side at level 1e-3, so correct code fails a case with probability <= ~1%;
    at these seeds every p-value exceeds 0.05.
    """
    for index, side in enumerate(("V", "V'")):
        direct = mechanism.sample_statistic(np.random.default_rng([11, index]), 20_000, side)
        full = mechanism.sample_statistic(np.random.default_rng([12, index]), 20_000, side, full_releases=True)
        for column in range(direct.shape[1]):
            assert stats.ks_2samp(direct[:, column], full[:, column]).pvalue > 1e-3
        losses = [log_likelihood_ratio(mechanism, x) for x in (direct, full)]
        finite = [x[np.isfinite(x)] for x in losses]
        assert stats.ks_2samp(*finite).pvalue > 1e-3


def _lemma9_log_density(s: np.ndarray, squared_norm: np.ndarray, d: int, r: int) -> np.ndarray:
    """Log density of ``y = M v`` at ``v^T y = s``, ``|y|^2 = squared_norm`` ([W] Lemma 9, sigma^2 = 1/r, s > 0).

    Written independently of dpaudit from the proof of Lemma 9 (``S = v^T y ~ sigma^2 chi2_r`` and
    ``y_perp | S ~ N(0, sigma^2 S I_{d-1})``): ``log C + (r-d-1)/2 log s - |y|^2 / (2 sigma^2 s)`` with
    ``C = 1 / (2^{r/2} Gamma(r/2) sigma^{d+r-1} (2 pi)^{(d-1)/2})``. The paper prints the exponent (r-d+1)/2
    (docs/theory.md §2.4) and ``sigma^{d-r-1}`` in C; the constant cancels in the likelihood ratio.
    """
    sigma2 = 1.0 / r
    log_c = -(
        r / 2 * math.log(2)
        + special.gammaln(r / 2)
        + (d + r - 1) / 2 * math.log(sigma2)
        + (d - 1) / 2 * math.log(2 * math.pi)
    )
    return log_c + (r - d - 1) / 2 * np.log(s) - squared_norm / (2 * sigma2 * s)


def test_vector_likelihood_ratio_is_the_lemma9_density_ratio():
    mechanism = releases.WishartVector(releases.aligned_unit_vectors(9, 0.7, seed=5), 3)
    y = mechanism.sample(np.random.default_rng(3), 2000, "V")
    s, s_prime, squared_norm = y @ mechanism.pair.v, y @ mechanism.pair.v_prime, np.sum(y**2, axis=1)
    inside = s_prime > 0
    expected = _lemma9_log_density(s[inside], squared_norm[inside], 9, 3) - _lemma9_log_density(
        s_prime[inside], squared_norm[inside], 9, 3
    )
    losses = log_likelihood_ratio(mechanism, mechanism.statistic(y))
    assert np.all(s > 0) and np.all(np.isposinf(losses[~inside]))
    assert np.allclose(losses[inside], expected, rtol=1e-9, atol=1e-9)
    assert (~inside).mean() > 0.01  # rho = 0.7, r = 3: the support escape P(A <= 0) is about 3%


@pytest.mark.parametrize("d,r", [(2, 2), (3, 2), (5, 3)])
def test_lemma9_density_with_the_corrected_exponent_is_the_law_of_m_v(d, r):
    """The corrected density integrates to 1 and has E[v^T y] = E[v^T M v] = 1.

    The printed exponent (density times s, then renormalised) has mean E[S^2]/E[S] = 1 + 2/r instead. Integrated
    over s = v^T y > 0 and rho = |y_perp| (polar in R^{d-1}), with rho = u sqrt(s) so that quadrature sees no spike
    at s -> 0.
    """
    sphere = 2 * math.pi ** ((d - 1) / 2) / special.gamma((d - 1) / 2)

    def moment(power: int) -> float:
        def integrand(u, s):
            rho = u * math.sqrt(s)
            log_density = _lemma9_log_density(np.array(s), np.array(s * s + rho * rho), d, r)
            return sphere * rho ** (d - 2) * math.sqrt(s) * s**power * math.exp(float(log_density))

        return integrate.dblquad(integrand, 0, np.inf, 0, np.inf, epsabs=1e-11, epsrel=1e-9)[0]

    total, mean, second = moment(0), moment(1), moment(2)
    assert total == pytest.approx(1.0, abs=1e-7)
    assert mean == pytest.approx(1.0, abs=1e-7)
    assert second / mean == pytest.approx(1 + 2 / r, abs=1e-6)


def test_matrix_statistic_is_invariant_under_rotations_fixing_the_pair():
    mechanism = releases.NoisyProjectionM2Release(
        releases.one_column_change(12, 3, 0.8, 0.9, 0.7, seed=2), 4, sigma=0.3
    )
    releases_v = mechanism.sample(np.random.default_rng(1), 50, "V")
    basis = mechanism.pair.span_basis()
    complement = np.linalg.svd(np.eye(12) - basis @ basis.T)[0][:, : 12 - basis.shape[1]]
    rotation = np.linalg.qr(np.random.default_rng(2).standard_normal((complement.shape[1],) * 2))[0]
    orthogonal = basis @ basis.T + complement @ rotation @ complement.T
    assert np.allclose(orthogonal @ orthogonal.T, np.eye(12), atol=1e-12)
    assert np.allclose(mechanism.statistic(orthogonal @ releases_v), mechanism.statistic(releases_v), atol=1e-10)
    assert basis.shape[1] == 4  # span(V) + span(V'): n + 1 for a one-column change
    assert mechanism.statistic(releases_v).shape == (50, 4 * 3 + 6)


# ---------------------------------------------------------------------------------------------- a new release kind


@dataclass(frozen=True, eq=False)
class _LaplaceRelease(releases._Release):
    """Toy release ``x + Lap(scale)`` with ``x = 0`` under V and ``x = sensitivity`` under V'; statistic: y itself.

    ``L = (|y - sensitivity| - |y|) / scale``, bounded by ``eps0 = sensitivity / scale`` (pure DP), and the exact
    profile ``delta(eps) = 1 - e^{(eps - eps0)/2}`` on ``[0, eps0]``, so ``eps(delta) = eps0 + 2 ln(1 - delta)``.
    ``claimed`` plays an accountant's claimed eps (default eps0, the true pure-DP guarantee).
    """

    sensitivity: float
    scale: float
    claimed: float | None = None

    def _elements_per_draw(self) -> int:
        return 1

    def _sample(self, rng, count, side):
        return (0.0 if side == "V" else self.sensitivity) + rng.laplace(0.0, self.scale, (count, 1))

    def statistic(self, releases: np.ndarray) -> np.ndarray:
        return releases


def _laplace_arguments(p):
    p.add_argument("--sensitivity", type=float, default=1.0, help="|x - x'| (default: 1)")
    p.add_argument("--scale", type=float, default=1.0, help="Laplace scale b (default: 1)")
    p.add_argument("--claimed-epsilon", type=float, default=None, help="eps an accountant claims (default: Delta/b)")


def _laplace_bound(release: _LaplaceRelease, delta: float, epsilon: float, source: str) -> Bound:
    inputs = dict(delta=delta, sensitivity=release.sensitivity, scale=release.scale)
    return Bound(epsilon=epsilon, delta=delta, neighbouring=REPLACE_ONE, source=source, inputs=inputs)


_LAPLACE = kinds.ReleaseKind(
    _LaplaceRelease,
    "laplace",
    "toy Laplace mechanism x + Lap(b) on a pair at distance --sensitivity",
    _laplace_arguments,
    lambda args: _LaplaceRelease(args.sensitivity, args.scale, args.claimed_epsilon),
    describe=lambda m: dict(sensitivity=m.sensitivity, scale=m.scale),
    analytic_bounds=lambda m, delta, seed: (
        _laplace_bound(
            m, delta, m.sensitivity / m.scale if m.claimed is None else m.claimed, "claimed pure DP (Delta/b)"
        ),
    ),
    # |y - Delta| - |y| = Delta - 2 clip(y, 0, Delta), exact at the atoms L = +-eps0: written as the difference, the
    # rounding of |y - Delta| - |y| differs between V's draws and V''s (coarser near 0) and a threshold test on it
    # "certifies" eps ~ 4 (Mironov's floating-point attack on the Laplace mechanism, in the audit's own scores).
    log_likelihood_ratio=lambda m, t: (m.sensitivity - 2 * np.clip(t[:, 0], 0.0, m.sensitivity)) / m.scale,
    exact_profile=lambda m, delta, samples, seed, confidence: _laplace_bound(
        m, delta, m.sensitivity / m.scale + 2 * math.log1p(-delta), "Laplace exact profile"
    ),
)


@pytest.fixture
def laplace_kind():
    """The toy Laplace release, registered through the release table only, and removed again afterwards."""
    kind = kinds.register(_LAPLACE)
    yield kind
    del kinds.RELEASES[_LaplaceRelease]


def test_a_release_registered_in_the_table_alone_is_audited_with_its_exact_likelihood_ratio(laplace_kind):
    """The table is all the audit needs: exact-LR attack, exact profile, both routes (CP <= exact fails w.p. 5%)."""
    exact = 1 + 2 * math.log1p(-1e-3)
    result = audit(_LaplaceRelease(1.0, 1.0), delta=1e-3, samples=20_000, seed=0)
    assert result.mechanism == "laplace" and result.parameters == dict(sensitivity=1.0, scale=1.0)
    assert result.attack == "exact likelihood ratio log p(y)/q(y)"
    assert result.exact_profile.epsilon == pytest.approx(exact)
    assert result.clopper_pearson.epsilon <= exact
    low, high = result.profile.epsilon[1:]
    assert low <= exact <= high
    assert result.outcome == "consistent"
    with pytest.raises(InvalidArgument, match="registered already"):
        kinds.register(laplace_kind)


def test_a_release_registered_in_the_table_alone_is_a_command_of_audit_mechanism(laplace_kind, capsys):
    """``dpaudit audit-mechanism laplace`` exists, takes the entry's options, and refutes an eps claimed too small."""
    assert main(["audit-mechanism", "laplace", "--samples", "20000", "--scale", "2"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("audit-mechanism laplace: sensitivity=1  scale=2\n")
    assert "verdict: CONSISTENT" in text
    assert main(["audit-mechanism", "laplace", "--samples", "20000", "--claimed-epsilon", "0.5", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["mechanism"] == "laplace" and summary["verdict"] == "violated"
    assert summary["epsilon_lower_bound"] > 0.5


def test_the_release_table_drives_audit_mechanism_and_the_audit():
    """Every registered release is a subcommand under its name, in the table's order, and nothing else is."""
    parser = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    audit_mechanism = next(a for a in parser.choices["audit-mechanism"]._actions if a.dest == "mechanism")
    assert list(audit_mechanism.choices) == [kind.name for kind in kinds.RELEASES.values()]
    assert [kind.name for kind in kinds.RELEASES.values()] == [
        *("gaussian", "wishart-vector", "wishart-m1", "wishart-m2", "sketch", "projection")
    ]

"""The releases dpaudit audits directly, one table keyed by the release's type (``dpaudit audit-mechanism``).

A :class:`ReleaseKind` is everything the audit and the command line know about one release of
:mod:`dpaudit.release_audit.releases`: its name (on the command line and in results), its command-line options and
how they build the release with its pair, the attack that scores it (its exact log-likelihood ratio, a support
certificate, or else a learned distinguisher), its analytic bounds, its exact privacy profile where one is known,
and the parameters an audit reports. :mod:`dpaudit.release_audit.audit` and ``dpaudit audit-mechanism`` dispatch
through :data:`RELEASES` and name no release themselves: a new release is its sampler in ``releases`` and one
entry, registered with :func:`register` (the built-in ones are listed at the end of this module).

The formulas behind each entry are those of :mod:`dpaudit.release_audit.audit` (module docstring). numpy/scipy only.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from accountants import gaussian, sketch, wishart
from accountants import validation as check
from accountants._numeric import solve_decreasing
from accountants.result import REPLACE_ONE, Bound, inapplicable
from accountants.validation import InvalidArgument
from dpaudit.release_audit import releases
from dpaudit.release_audit.releases import (
    GaussianMechanism,
    GaussianSketchRelease,
    MatrixProjection,
    NoisyProjectionM1,
    NoisyProjectionM2Release,
    OneColumnChange,
    WishartVector,
)

# ---------------------------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class SupportCertificate:
    """An attack that separates the supports: the event ``{defect(release, T) <= tolerance}`` holds under V only.

    Attributes:
      statistic: what the event tests, as the audit names it (e.g. ``"symmetry of V^T Y"``).
      attack: the audit's one-line description of the attack.
      defect: ``(release, statistic) -> defects``, one per draw of the release statistic.
      tolerance: the largest defect inside the event.
    """

    statistic: str
    attack: str
    defect: Callable[[Any, np.ndarray], np.ndarray]
    tolerance: float


@dataclass(frozen=True)
class ReleaseKind:
    """One release the audit accepts: its names, its command line, and its analyses.

    Attributes:
      release: the sampler class (its instances hold their neighbouring pair).
      name: the name in ``dpaudit audit-mechanism <name>`` and in the audit's results.
      description: the command's help and description.
      add_arguments: ``(parser) -> None``, the release's own options of ``dpaudit audit-mechanism <name>`` (the
        audit's options, ``--samples``, ``--delta``, ``--seed``, ..., are added for every release).
      build: ``(parsed arguments) -> release``, drawing its pair from ``--seed``.
      describe: ``release -> parameters`` the audit reports (measured from the arrays).
      analytic_bounds: ``(release, delta, seed) -> bounds`` at ``delta``; ``seed`` (an integer) is for the ones
        computed by Monte Carlo.
      log_likelihood_ratio: ``(release, statistic) -> L``, the exact ``log p(y)/q(y)`` from the release statistic
        (``+inf`` outside the neighbour's support, ``-inf`` outside V's), or None when the density is not known.
      exact_profile: ``(release, delta, samples, seed, confidence) -> Bound | None``, the exact eps(delta) where
        known (``samples``, ``seed`` and ``confidence`` are for a Monte-Carlo profile), or None.
      support: the support certificate the audit uses when there is no exact likelihood ratio, or None.

    The audit's attack is the exact likelihood ratio when there is one, else the support certificate, else a
    learned distinguisher trained on draws of the release's ``statistic``.
    """

    release: type
    name: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    build: Callable[[argparse.Namespace], Any]
    describe: Callable[[Any], dict[str, Any]]
    analytic_bounds: Callable[[Any, float, int], tuple[Bound, ...]]
    log_likelihood_ratio: Callable[[Any, np.ndarray], np.ndarray] | None = None
    exact_profile: Callable[[Any, float, int, int, float], Bound | None] | None = None
    support: SupportCertificate | None = None


# The releases the audit accepts, in the order `dpaudit audit-mechanism --help` lists them.
RELEASES: dict[type, ReleaseKind] = {}


def register(kind: ReleaseKind) -> ReleaseKind:
    """Add ``kind`` to :data:`RELEASES` (its type and its name must be new); returns it."""
    if kind.release in RELEASES or kind.name in {k.name for k in RELEASES.values()}:
        raise InvalidArgument(f"a release {kind.release.__name__} or named {kind.name!r} is registered already")
    RELEASES[kind.release] = kind
    return kind


def kind_of(release) -> ReleaseKind | None:
    """The entry of ``release``'s type, or of the closest registered class it derives from; None if none."""
    return next((RELEASES[cls] for cls in type(release).__mro__ if cls in RELEASES), None)


def named(name: str) -> ReleaseKind:
    """The entry called ``name``."""
    return next(kind for kind in RELEASES.values() if kind.name == name)


def _relabel(bound: Bound, source: str, **details) -> Bound:
    return dataclasses.replace(bound, source=source, details=dict(bound.details, **details))


# ---------------------------------------------------------------------------------------------- gaussian


def _gaussian_arguments(p):
    p.add_argument("--d", type=int, default=8, help="dimension of the release (default: 8)")
    p.add_argument("--sensitivity", type=float, default=1.0, help="|v - v'| (default: 1)")
    p.add_argument("--sigma", type=float, default=1.0, help="noise std (default: 1); mu = sensitivity / sigma")


def _gaussian_loss(mechanism: GaussianMechanism, statistic: np.ndarray) -> np.ndarray:
    """``L = (|v'|^2 - |v|^2 - 2T) / (2 sigma^2)``, ``T = <y, v' - v>``."""
    pair = mechanism.pair
    offset = pair.v_prime @ pair.v_prime - pair.v @ pair.v
    return (offset - 2 * statistic[:, 0]) / (2 * mechanism.sigma**2)


# ---------------------------------------------------------------------------------------------- wishart vector


def _vector_arguments(p):
    p.add_argument("--d", type=int, default=400, help="dimension (default: 400)")
    p.add_argument("--r", type=int, default=16, help="projection rank (default: 16)")
    p.add_argument("--rho", type=float, default=0.9999, help="alignment <v, v'> (default: 0.9999)")


def _vector_loss(mechanism: WishartVector, statistic: np.ndarray) -> np.ndarray:
    """[W] Lemma 9 with the exponent ``(r-d-1)/2`` (docs/theory.md §2.4), ``T = (v^T y, v'^T y, |y|^2)``."""
    return _wishart_vector_loss(statistic, mechanism.pair.d, mechanism.r)


def _wishart_vector_loss(statistic: np.ndarray, d: int, r: int) -> np.ndarray:
    own, other, squared_norm = statistic.T
    if np.any((own <= 0) & (other <= 0)):
        raise ValueError("a release with v^T y <= 0 and v'^T y <= 0 lies in neither support: not a Wishart release")
    inside = (own > 0) & (other > 0)
    s, s_prime, q = own[inside], other[inside], squared_norm[inside]
    losses = np.where(own > 0, np.inf, -np.inf)
    losses[inside] = (r - d - 1) / 2 * (np.log(s) - np.log(s_prime)) - r * q / 2 * (1 / s - 1 / s_prime)
    return losses


# ---------------------------------------------------------------------------------------------- matrix releases


def _one_column_arguments(p, d, n, r, rho_perp):
    p.add_argument("--d", type=int, default=d, help=f"rows of V (default: {d})")
    p.add_argument("--n", type=int, default=n, help=f"columns (records) of V (default: {n})")
    p.add_argument("--r", type=int, default=r, help=f"projection rank (default: {r})")
    p.add_argument(
        "--beta-perp", type=float, default=1.0, help="norm of the changed column outside span(V_-j) (default: 1)"
    )
    p.add_argument("--rho-parallel", type=float, default=1.0, help="alignment inside span(V_-j) (default: 1)")
    p.add_argument(
        "--rho-perp", type=float, default=rho_perp, help=f"alignment outside span(V_-j) (default: {rho_perp})"
    )


def _one_column_pair(args: argparse.Namespace) -> OneColumnChange:
    return releases.one_column_change(args.d, args.n, args.beta_perp, args.rho_parallel, args.rho_perp, args.seed)


def _matrix_parameters(mechanism) -> dict[str, Any]:
    pair = mechanism.pair
    parameters = dict(
        d=pair.d,
        n=pair.n,
        r=mechanism.r,
        changed_columns=len(pair.changed_columns),
        difference_rank=pair.difference_rank,
        frobenius_distance=pair.frobenius_distance,
    )
    if isinstance(mechanism, (NoisyProjectionM1, NoisyProjectionM2Release)):
        parameters["sigma"] = mechanism.sigma
    if isinstance(pair, OneColumnChange):
        parameters.update(
            beta_perp=pair.beta_perp,
            rho_parallel=pair.rho_parallel,
            rho_perp=pair.rho_perp,
            span_dimension=pair.span_dimension,
            column_sensitivity=pair.column_sensitivity,
        )
    return parameters


def _m1_arguments(p):
    _one_column_arguments(p, d=32, n=2, r=16, rho_perp=0.99)
    p.add_argument("--sigma", type=float, default=0.5, help="noise std sigma_G (default: 0.5)")
    p.add_argument("--training-samples", type=int, default=None, help="training draws per input (default: --samples)")


def _m1_bounds(mechanism: NoisyProjectionM1, delta: float, seed: int) -> tuple[Bound, ...]:
    calibrations: tuple[wishart.GaussianCalibration, ...] = ("classical", "exact")
    return tuple(_m1_theorem3(mechanism, delta, calibration) for calibration in calibrations)


def _m1_theorem3(mechanism: NoisyProjectionM1, delta: float, calibration: wishart.GaussianCalibration) -> Bound:
    """[W] Thm 3 (Thm 4 per column, Lemma 2, Lemma 14/15) with the Gaussian part calibrated as named."""
    pair = mechanism.pair
    source = f"[W] Thm 3 ({calibration} Gaussian calibration of Eq. 3)"
    if not isinstance(pair, OneColumnChange):
        return inapplicable(
            source, REPLACE_ONE, "[W] Thm 3 needs a one-column adjacency chain ([W] Def. 4)", delta=delta
        )
    bound = wishart.theorem3_epsilon(
        delta,
        len(pair.changed_columns),
        pair.column_sensitivity,
        mechanism.sigma,
        pair.d,
        mechanism.r,
        pair.span_dimension,
        pair.rho_perp,
        pair.beta_perp,
        calibration,
    )
    return _relabel(bound, source)


def _m2_arguments(p):
    p.add_argument("--d", type=int, default=32, help="rows of V (default: 32)")
    p.add_argument("--n", type=int, default=2, help="columns of V (default: 2)")
    p.add_argument("--r", type=int, default=4, help="projection rank (default: 4)")
    p.add_argument("--rank", type=int, default=1, help="rank s of Delta V (default: 1)")
    p.add_argument("--frobenius", type=float, default=0.5, help="|Delta V|_F (default: 0.5)")
    p.add_argument("--sigma", type=float, default=0.5, help="noise std sigma_G (default: 0.5)")
    p.add_argument("--training-samples", type=int, default=None, help="training draws per input (default: --samples)")


def _m2_bounds(mechanism: NoisyProjectionM2Release, delta: float, seed: int) -> tuple[Bound, ...]:
    pair, sigma = mechanism.pair, mechanism.sigma
    singular_values = pair.difference_singular_values
    rank_one = singular_values.size == 1
    baseline = gaussian.epsilon(delta, pair.frobenius_distance, sigma)
    return (
        wishart.theorem5_epsilon(delta, pair.frobenius_distance, sigma, pair.d, mechanism.r, pair.difference_rank),
        wishart.m2_mixture_epsilon(
            delta,
            pair.frobenius_distance,
            sigma,
            pair.d,
            mechanism.r,
            None if rank_one else singular_values.tolist(),
            seed=seed,
        ),
        _relabel(baseline, "Gaussian mechanism on V + Xi, M as post-processing (docs/theory.md §2.1)"),
    )


# ---------------------------------------------------------------------------------------------- sketch


def _sketch_arguments(p):
    p.add_argument("--n", type=int, default=4, help="rows of Q (default: 4)")
    p.add_argument("--m", type=int, default=16, help="columns of Q (default: 16)")
    p.add_argument("--r", type=int, default=8, help="sketch dimension (default: 8)")
    p.add_argument("--sigma-a", type=float, default=None, help="std of A (default: 1/sqrt(r), LoRA's [S] Sec. 7)")
    p.add_argument("--sigma-g", type=float, default=0.0, help="std of the added noise Z (default: 0)")
    p.add_argument("--norm-bound", type=float, default=2.0, help="B_F = |Q|_F (default: 2)")
    p.add_argument("--sensitivity", type=float, default=0.2, help="B_S = norm of the removed column (default: 0.2)")
    p.add_argument("--lambda-min", type=float, default=1.0, help="lambda_min(Q Q^T) (default: 1)")
    p.add_argument(
        "--direction",
        choices=releases.SKETCH_DIRECTIONS,
        default="smallest",
        help="eigenvector the removed column points along; smallest = [S]'s tight case (default)",
    )


def _sketch(args: argparse.Namespace) -> GaussianSketchRelease:
    pair = releases.sketch_pair(
        args.n, args.m, args.norm_bound, args.sensitivity, args.lambda_min, args.direction, args.seed
    )
    sigma_a = 1 / math.sqrt(check.count("--r", args.r)) if args.sigma_a is None else args.sigma_a
    return GaussianSketchRelease(pair, args.r, sigma_a, args.sigma_g)


def _sketch_parameters(mechanism: GaussianSketchRelease) -> dict[str, Any]:
    pair = mechanism.pair
    return dict(
        n=pair.n,
        m=pair.m,
        r=mechanism.r,
        sigma_a=mechanism.sigma_a,
        sigma_g=mechanism.sigma_g,
        norm_bound=pair.norm_bound,
        sensitivity=pair.sensitivity,
        lambda_min=pair.lambda_min,
        lambda_min_neighbour=pair.lambda_min_neighbour,
        gram_sensitivity=pair.gram_sensitivity,
        direction=pair.direction,
    )


def _sketch_loss(mechanism: GaussianSketchRelease, statistic: np.ndarray) -> np.ndarray:
    """``L = -T/2 - (r/2) ln(det Sigma_V / det Sigma_V')``, ``T = sum_k y_k^T D y_k`` ([S] App. D.1)."""
    log_det_ratio = np.linalg.slogdet(mechanism.covariance("V"))[1] - np.linalg.slogdet(mechanism.covariance("V'"))[1]
    return -statistic[:, 0] / 2 - mechanism.r / 2 * log_det_ratio


def _sketch_lemma71(mechanism: GaussianSketchRelease, delta: float) -> tuple[Bound, Bound]:
    """[S] Lemma 7.1 as stated, and in the one-column form of [S] App. D.1 that the paper calls tight.

    As stated: ``B_C = 2 B_F B_S`` and lambda_bar bounding the Gram matrices of both inputs (the lemma's
    assumption must hold for every dataset, so that both orders of the Renyi divergence are covered),
    ``tau = rank(Delta Sigma) = 1``. One-column form: ``B_C = |Q Q^T - Q' Q'^T|_F = B_S^2``, ``tau = 1`` and
    ``lambda_bar = lambda_min(Q Q^T)`` of the dataset holding the column, the first argument of the divergence in
    the proof (Eq. 45 uses lambda_min(Sigma_1) only).
    """
    pair = mechanism.pair
    common = (mechanism.sigma_g, mechanism.sigma_a, pair.norm_bound, pair.sensitivity, mechanism.r)
    stated = sketch.lemma71(delta, min(pair.lambda_min, pair.lambda_min_neighbour), *common, tau=1)
    one_column = sketch.lemma71(delta, pair.lambda_min, *common, tau=1, gram_sensitivity=pair.gram_sensitivity)
    return (
        stated,
        _relabel(one_column, "[S] Lemma 7.1, one-column form (App. D.1: B_C = B_S^2, tau = 1) + [S] Prop. 4.3"),
    )


def _probability_above(weight: float, offset: float, epsilon: float, r: int) -> float:
    """``P((weight K - offset)/2 > epsilon)`` for ``K ~ chi2_r``."""
    threshold = (2 * epsilon + offset) / weight
    return float(stats.chi2.sf(threshold, r) if weight > 0 else stats.chi2.cdf(threshold, r))


def _sketch_profile_delta(epsilon: float, ratio: float, r: int) -> float:
    """Exact delta(eps) of the sketch when ``Sigma_V'^{-1} Sigma_V`` has one eigenvalue ``ratio != 1`` (tau = 1).

    Along that direction the r columns are ``N(0, s_V)`` vs ``N(0, s_V')``, ``ratio = s_V/s_V'``: under V,
    ``L = ((ratio - 1) K - r ln ratio)/2``; under V', ``L = ((1 - 1/ratio) K - r ln ratio)/2``, ``K ~ chi2_r``.
    ``delta = max(P(L > eps) - e^eps Q(L > eps), Q(-L > eps) - e^eps P(-L > eps))``.
    """
    under_v, under_v_prime, offset = ratio - 1, 1 - 1 / ratio, r * math.log(ratio)
    forward = _probability_above(under_v, offset, epsilon, r) - math.exp(epsilon) * _probability_above(
        under_v_prime, offset, epsilon, r
    )
    backward = _probability_above(-under_v_prime, -offset, epsilon, r) - math.exp(epsilon) * _probability_above(
        -under_v, -offset, epsilon, r
    )
    return max(forward, backward, 0.0)


def _sketch_profile(
    mechanism: GaussianSketchRelease, delta: float, samples: int, seed: int, confidence: float
) -> Bound | None:
    """With a rank-one covariance change, the chi-square closed form of :func:`_sketch_profile_delta`; else None."""
    ratios = np.linalg.eigvals(np.linalg.solve(mechanism.covariance("V'"), mechanism.covariance("V"))).real
    changed = ratios[np.abs(ratios - 1) > 1e-10]
    if changed.size != 1:
        return None
    source = "[S] Eq. 1 sketch, exact profile (rank-one covariance change, chi-square closed form)"
    value = solve_decreasing(
        lambda e: math.log(max(_sketch_profile_delta(e, changed[0], mechanism.r), 1e-320)),
        math.log(delta),
        0.0,
        1.0,
    )
    return Bound(
        epsilon=value,
        delta=delta,
        neighbouring=REPLACE_ONE,
        source=source,
        inputs=dict(delta=delta, r=mechanism.r),
        details=dict(variance_ratio=float(changed[0])),
    )


# ---------------------------------------------------------------------------------------------- projection

# Relative symmetry defect below which V^T Y counts as symmetric. Float64 rounding of the sums behind
# Y = Z (Z^T V) leaves about 1e-15 (1e-14 at d = 400, r = 64). Under V' the defect is a continuous variable of
# scale |Delta V| with a bounded density at 0, so P(defect <= 1e-11) is about 1e-11 / |Delta V| per draw.
_SYMMETRY_TOLERANCE = 1e-11


def symmetry_defect(mechanism: MatrixProjection, statistic: np.ndarray) -> np.ndarray:
    """``|V^T Y - Y^T V|_F / |V^T Y|_F`` from the invariant statistic (``V^T Y = (W^T V)^T (W^T Y)``).

    0 up to rounding for every ``Y = M V`` (``V^T M V`` is symmetric); for ``Y = M V'`` it is
    ``|V^T M V' - V'^T M V|_F / |V^T M V'|_F``, non-zero with probability 1 when n >= 2 ([W] Lemma 11).
    """
    projected = np.einsum(
        "kn,ckm->cnm", mechanism.pair.span_basis().T @ mechanism.pair.V, mechanism.projected_release(statistic)
    )
    defect = np.linalg.norm(projected - projected.transpose(0, 2, 1), axis=(1, 2))
    return defect / np.maximum(np.linalg.norm(projected, axis=(1, 2)), np.finfo(float).tiny)


def _proposition2(mechanism: MatrixProjection, delta: float) -> Bound:
    return inapplicable(
        "[W] Prop. 2",
        REPLACE_ONE,
        "the noise-free matrix projection is not (eps, delta)-DP for any "
        "eps and delta < 1: M V and M V' have disjoint supports",
        delta=delta,
        inputs=dict(d=mechanism.pair.d, n=mechanism.pair.n, r=mechanism.r),
    )


def _lora_claim(mechanism: MatrixProjection, delta: float) -> Bound:
    """[S]'s guarantee for noise-free LoRA-FA, whose release ``V^T A^T A`` is this projection (docs/theory.md §1.2).

    [S] Lemma 7.2's proof calls the released weights ``W_0 - eta (G A^T + Z) A`` a post-processing of the
    sketch ``G A^T + Z`` and applies Lemma 7.1 to it. Here ``Q = V^T`` (rows are the records' gradients),
    ``sigma_A^2 = 1/r`` (A = Z^T), ``sigma_g = 0``, lambda_bar over both Gram matrices, ``B_C = 2 B_F B_S``.
    """
    pair = mechanism.pair
    gram_change = pair.V.T @ pair.V - pair.V_prime.T @ pair.V_prime
    values = np.linalg.eigvalsh(gram_change)
    tau = max(int(np.count_nonzero(np.abs(values) > 1e-10 * max(np.abs(values).max(), 1e-300))), 1)
    lambda_bar = min(np.linalg.eigvalsh(pair.V.T @ pair.V)[0], np.linalg.eigvalsh(pair.V_prime.T @ pair.V_prime)[0])
    norm_bound = max(np.linalg.norm(pair.V), np.linalg.norm(pair.V_prime))
    claim = sketch.lemma71(
        delta,
        max(float(lambda_bar), 0.0),
        0.0,
        1 / math.sqrt(mechanism.r),
        float(norm_bound),
        pair.frobenius_distance,
        mechanism.r,
        tau,
    )
    return _relabel(
        claim, "[S] Lemma 7.1 as applied to LoRA-FA's release by [S] Lemma 7.2 (sigma_g = 0) + [S] Prop. 4.3"
    )


# ---------------------------------------------------------------------------------------------- the built-in releases

for _kind in (
    ReleaseKind(
        GaussianMechanism,
        "gaussian",
        "Gaussian mechanism v + N(0, sigma^2 I) on a pair at distance --sensitivity",
        _gaussian_arguments,
        lambda args: GaussianMechanism(releases.vectors_at_distance(args.d, args.sensitivity, args.seed), args.sigma),
        describe=lambda m: dict(d=m.pair.d, sensitivity=m.pair.sensitivity, sigma=m.sigma, mu=m.mu),
        analytic_bounds=lambda m, delta, seed: (
            gaussian.classical_epsilon(delta, m.pair.sensitivity, m.sigma),
            gaussian.rdp_epsilon(delta, m.pair.sensitivity, m.sigma),
        ),
        log_likelihood_ratio=_gaussian_loss,
        exact_profile=lambda m, delta, samples, seed, confidence: gaussian.epsilon(delta, m.pair.sensitivity, m.sigma),
    ),
    ReleaseKind(
        WishartVector,
        "wishart-vector",
        "[W] vector release M v, unit vectors with alignment --rho (Thm 1)",
        _vector_arguments,
        lambda args: WishartVector(releases.aligned_unit_vectors(args.d, args.rho, args.seed), args.r),
        describe=lambda m: dict(d=m.pair.d, r=m.r, rho=m.pair.rho),
        analytic_bounds=lambda m, delta, seed: (wishart.theorem1_epsilon(delta, m.pair.rho, m.pair.d, m.r),),
        log_likelihood_ratio=_vector_loss,
        exact_profile=lambda m, delta, samples, seed, confidence: wishart.vector_profile_epsilon(
            delta, m.pair.rho, m.pair.d, m.r, samples=samples, seed=seed, confidence=confidence
        ),
    ),
    ReleaseKind(
        NoisyProjectionM1,
        "wishart-m1",
        "[W] M1: M V + Xi on a one-column change ([W] Def. 4; Thm 3/4)",
        _m1_arguments,
        lambda args: NoisyProjectionM1(_one_column_pair(args), args.r, args.sigma),
        describe=_matrix_parameters,
        analytic_bounds=_m1_bounds,
    ),
    ReleaseKind(
        NoisyProjectionM2Release,
        "wishart-m2",
        "[W] M2: M (V + Xi) on a rank-s change of Frobenius norm --frobenius (Thm 5, mixture bound)",
        _m2_arguments,
        lambda args: NoisyProjectionM2Release(
            releases.low_rank_change(args.d, args.n, args.rank, args.frobenius, args.seed), args.r, args.sigma
        ),
        describe=_matrix_parameters,
        analytic_bounds=_m2_bounds,
    ),
    ReleaseKind(
        GaussianSketchRelease,
        "sketch",
        "[S] Gaussian sketch Q A^T + Z, Q' = Q minus one column ([S] Lemma 7.1)",
        _sketch_arguments,
        _sketch,
        describe=_sketch_parameters,
        analytic_bounds=lambda m, delta, seed: _sketch_lemma71(m, delta),
        log_likelihood_ratio=_sketch_loss,
        exact_profile=_sketch_profile,
    ),
    ReleaseKind(
        MatrixProjection,
        "projection",
        "[W] noise-free matrix release M V on a one-column change (Prop. 2; [S]'s LoRA claim)",
        lambda p: _one_column_arguments(p, d=32, n=2, r=8, rho_perp=0.999),
        lambda args: MatrixProjection(_one_column_pair(args), args.r),
        describe=_matrix_parameters,
        analytic_bounds=lambda m, delta, seed: (_proposition2(m, delta), _lora_claim(m, delta)),
        support=SupportCertificate(
            "symmetry of V^T Y",
            "support certificate: symmetry defect of V^T Y ([W] Prop. 2, Lemma 11)",
            symmetry_defect,
            _SYMMETRY_TOLERANCE,
        ),
    ),
):
    register(_kind)

"""``dpaudit audit-mechanism <mechanism>``: audit a mechanism's release directly and set the audit beside the bounds.

Draws the release ``--samples`` times under each input of a neighbouring pair (V, V'), scores every draw with the
best attack available (exact likelihood ratio, learned distinguisher, or support certificate) and prints: the
analytic bounds with their names, the exact (or mixture) profile where available, the empirical epsilon lower
bound with its confidence, the estimated privacy profile, and the verdict (see :mod:`dpaudit.release_audit.audit`).
numpy/scipy only until the handler runs (scikit-learn for M1/M2).
"""

from __future__ import annotations

import argparse
import math

from dpaudit.cli.arguments import add_json, add_seed
from dpaudit.formatting import json_text, short_number

_RELEASE_HELP = {
    "gaussian": "Gaussian mechanism v + N(0, sigma^2 I) on a pair at distance --sensitivity",
    "wishart-vector": "[W] vector release M v, unit vectors with alignment --rho (Thm 1)",
    "wishart-m1": "[W] M1: M V + Xi on a one-column change ([W] Def. 4; Thm 3/4)",
    "wishart-m2": "[W] M2: M (V + Xi) on a rank-s change of Frobenius norm --frobenius (Thm 5, mixture bound)",
    "sketch": "[S] Gaussian sketch Q A^T + Z, Q' = Q minus one column ([S] Lemma 7.1)",
    "projection": "[W] noise-free matrix release M V on a one-column change (Prop. 2; [S]'s LoRA claim)",
}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "audit-mechanism",
        help="audit a mechanism by sampling its release directly",
        description=__doc__.splitlines()[0],
    )
    kinds = parser.add_subparsers(dest="mechanism", required=True, metavar="<mechanism>")
    for name, help_text in _RELEASE_HELP.items():
        sub = kinds.add_parser(name, help=help_text, description=help_text)
        _ARGUMENTS[name](sub)
        sub.add_argument("--samples", type=int, default=100_000, help="releases scored per input (default: 100000)")
        sub.add_argument("--delta", type=float, default=1e-3, help="delta of every epsilon (default: 1e-3)")
        sub.add_argument("--confidence", type=float, default=0.95, help="confidence of the audit (default: 0.95)")
        add_seed(sub, "seed of the pair and of every draw (default: 0)")
        sub.add_argument(
            "--full-releases",
            action="store_true",
            help="score full releases instead of drawing the release statistic from its exact law",
        )
        add_json(sub, "print JSON instead of text")
        sub.set_defaults(func=run)


def _gaussian_arguments(p):
    p.add_argument("--d", type=int, default=8, help="dimension of the release (default: 8)")
    p.add_argument("--sensitivity", type=float, default=1.0, help="|v - v'| (default: 1)")
    p.add_argument("--sigma", type=float, default=1.0, help="noise std (default: 1); mu = sensitivity / sigma")


def _vector_arguments(p):
    p.add_argument("--d", type=int, default=400, help="dimension (default: 400)")
    p.add_argument("--r", type=int, default=16, help="projection rank (default: 16)")
    p.add_argument("--rho", type=float, default=0.9999, help="alignment <v, v'> (default: 0.9999)")


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


def _m1_arguments(p):
    _one_column_arguments(p, d=32, n=2, r=16, rho_perp=0.99)
    p.add_argument("--sigma", type=float, default=0.5, help="noise std sigma_G (default: 0.5)")
    p.add_argument("--training-samples", type=int, default=None, help="training draws per input (default: --samples)")


def _m2_arguments(p):
    p.add_argument("--d", type=int, default=32, help="rows of V (default: 32)")
    p.add_argument("--n", type=int, default=2, help="columns of V (default: 2)")
    p.add_argument("--r", type=int, default=4, help="projection rank (default: 4)")
    p.add_argument("--rank", type=int, default=1, help="rank s of Delta V (default: 1)")
    p.add_argument("--frobenius", type=float, default=0.5, help="|Delta V|_F (default: 0.5)")
    p.add_argument("--sigma", type=float, default=0.5, help="noise std sigma_G (default: 0.5)")
    p.add_argument("--training-samples", type=int, default=None, help="training draws per input (default: --samples)")


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
        choices=("smallest", "largest"),
        default="smallest",
        help="eigenvector the removed column points along; smallest = [S]'s tight case (default)",
    )


def _projection_arguments(p):
    _one_column_arguments(p, d=32, n=2, r=8, rho_perp=0.999)


_ARGUMENTS = {
    "gaussian": _gaussian_arguments,
    "wishart-vector": _vector_arguments,
    "wishart-m1": _m1_arguments,
    "wishart-m2": _m2_arguments,
    "sketch": _sketch_arguments,
    "projection": _projection_arguments,
}


def build_mechanism(args: argparse.Namespace):
    """The release sampler with its pair, from the parsed arguments (pairs are drawn from ``--seed``)."""
    from accountants import validation as check
    from dpaudit.release_audit import releases

    kind, seed = args.mechanism, args.seed
    if kind == "gaussian":
        return releases.GaussianMechanism(releases.vectors_at_distance(args.d, args.sensitivity, seed), args.sigma)
    if kind == "wishart-vector":
        return releases.WishartVector(releases.aligned_unit_vectors(args.d, args.rho, seed), args.r)
    if kind == "wishart-m2":
        return releases.NoisyProjectionM2Release(
            releases.low_rank_change(args.d, args.n, args.rank, args.frobenius, seed), args.r, args.sigma
        )
    if kind == "sketch":
        sketch = releases.sketch_pair(
            args.n, args.m, args.norm_bound, args.sensitivity, args.lambda_min, args.direction, seed
        )
        sigma_a = 1 / math.sqrt(check.count("--r", args.r)) if args.sigma_a is None else args.sigma_a
        return releases.GaussianSketchRelease(sketch, args.r, sigma_a, args.sigma_g)
    pair = releases.one_column_change(args.d, args.n, args.beta_perp, args.rho_parallel, args.rho_perp, seed)
    if kind == "wishart-m1":
        return releases.NoisyProjectionM1(pair, args.r, args.sigma)
    return releases.MatrixProjection(pair, args.r)


def run(args: argparse.Namespace) -> int:
    from dpaudit.release_audit.audit import audit

    result = audit(
        build_mechanism(args),
        delta=args.delta,
        samples=args.samples,
        seed=args.seed,
        confidence=args.confidence,
        training_samples=getattr(args, "training_samples", None),
        full_releases=args.full_releases,
    )
    if args.json:
        print(json_text(result.to_dict()), end="")
    else:
        print(format_audit(result))
    return 0


# ---------------------------------------------------------------------------------------------- text


def _band(low: float, high: float) -> str:
    return f"[{short_number(low)}, {short_number(high)}]"


def format_audit(result) -> str:
    """The audit as text: settings, bounds, exact profile, audited epsilon (both routes), profile, verdict."""
    parameters = "  ".join(
        f"{k}={short_number(v) if isinstance(v, float) else v}" for k, v in result.parameters.items()
    )
    lines = [
        f"audit-mechanism {result.mechanism}: {parameters}",
        f"delta = {result.delta:g}, {result.samples} releases per input, seed {result.seed}, "
        f"confidence {result.confidence:.0%}",
        f"attack: {result.attack}",
        "",
        f"analytic bounds at delta = {result.delta:g}",
    ]
    for comparison in result.comparisons:
        bound = comparison.bound
        note = f"   {bound.confidence:.0%} CI {_band(*bound.epsilon_interval)}" if bound.epsilon_interval else ""
        note += "" if bound.valid else f"   ({bound.reason})"
        note += f"   conditional on: {'; '.join(bound.conditional_on)}" if bound.conditional_on else ""
        label = "exact profile" if bound is result.exact_profile else "bound"
        lines.append(f"  {label:<13} eps = {short_number(bound.epsilon):>9}   {bound.source}{note}")
    cp, gdp = result.clopper_pearson, result.gaussian_dp
    lines += [
        "",
        "audit",
        f"  (a) Clopper-Pearson eps lower bound: {short_number(cp.epsilon)} at {cp.confidence:.0%} confidence "
        f"(most these draws can certify: {short_number(cp.max_certifiable_epsilon)}; threshold "
        f"{type(cp.strategy).__name__})",
        f"      Gaussian-DP route: {short_number(gdp.epsilon)}"
        " (assumes a Gaussian tradeoff curve; not used in verdicts)",
        f"  attack AUC {result.auc:.4f}, {result.confidence:.0%} CI {_band(*result.auc_interval)}",
    ]
    if result.profile is not None:
        estimate, low, high = result.profile.epsilon
        check = result.profile.change_of_measure
        lines.append(
            f"  (b) estimated profile: eps({result.delta:g}) = {short_number(estimate)}, "
            f"{result.confidence:.0%} band {_band(low, high)}"
        )
        for source, epsilon, (delta_hat, delta_low, delta_high) in result.profile.delta_at:
            lines.append(
                f"      delta_hat({short_number(epsilon)}) = {delta_hat:.3g} {_band(delta_low, delta_high)}"
                f"   at the eps of {source}"
            )
        lines.append(
            f"      likelihood-ratio check: E_P[e^-L; L>0] = {check.forward_mean:.4f} vs Q(L>0) = "
            f"{check.forward_expected:.4f} (z = {check.forward_z:.1f}); E_Q[e^L; L<0] = "
            f"{check.backward_mean:.4f} vs P(L<0) = {check.backward_expected:.4f} "
            f"(z = {check.backward_z:.1f})"
        )
    if result.support is not None:
        support = result.support
        lines.append(
            f"  support evidence ({support.statistic}): largest defect under V {support.largest_under_v:.2g}, "
            f"smallest under V' {support.smallest_under_v_prime:.2g} (tolerance {support.tolerance:g}); "
            f"{support.in_event_under_v}/{support.draws} vs {support.in_event_under_v_prime}/{support.draws} "
            "draws in the event"
        )
    lines += ["", f"verdict: {result.outcome.upper()}: {result.reason}"]
    for comparison in result.comparisons:
        looseness = f" [bound / exact = {comparison.ratio_to_exact:.3g}]" if comparison.ratio_to_exact else ""
        lines.append(f"  {comparison.outcome:<12} {comparison.reason}{looseness}")
    return "\n".join(lines)

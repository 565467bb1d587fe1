"""``dpaudit audit-mechanism <mechanism>``: audit a mechanism's release directly and set the audit beside the bounds.

Draws the release ``--samples`` times under each input of a neighbouring pair (V, V'), scores every draw with the
best attack available (exact likelihood ratio, learned distinguisher, or support certificate) and prints: the
analytic bounds with their names, the exact (or mixture) profile where available, the empirical epsilon lower
bound with its confidence, the estimated privacy profile, and the verdict (see :mod:`dpaudit.release_audit.audit`).
numpy/scipy only until the handler runs (scikit-learn for M1/M2).
"""

from __future__ import annotations

import argparse

from dpaudit.cli.arguments import add_json, add_seed
from dpaudit.formatting import json_text, short_number
from dpaudit.release_audit.kinds import RELEASES, named


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "audit-mechanism",
        help="audit a mechanism by sampling its release directly",
        description=__doc__.splitlines()[0],
    )
    kinds = parser.add_subparsers(dest="mechanism", required=True, metavar="<mechanism>")
    for kind in RELEASES.values():
        sub = kinds.add_parser(kind.name, help=kind.description, description=kind.description)
        kind.add_arguments(sub)
        sub.add_argument("--samples", type=int, default=100_000, help="releases scored per input (default: 100000)")
        sub.add_argument("--delta", type=float, default=1e-3, help="delta of every epsilon (default: 1e-3)")
        sub.add_argument("--confidence", type=float, default=0.95, help="confidence of the audit (default: 0.95)")
        add_seed(sub, "seed of the pair and of every draw (default: 0)")
        sub.add_argument(
            "--full-releases",
            action="store_true",
            help="score full releases instead of drawing the release statistic from its exact law",
        )
        sub.add_argument(
            "--max-random-numbers",
            type=int,
            help="refuse an audit that would draw more random numbers (default: 2^33, about ten minutes of one core)",
        )
        add_json(sub, "print JSON instead of text")
        sub.set_defaults(func=run)


def build_mechanism(args: argparse.Namespace):
    """The release sampler with its pair, from the parsed arguments (pairs are drawn from ``--seed``)."""
    return named(args.mechanism).build(args)


def run(args: argparse.Namespace) -> int:
    from dpaudit.release_audit.audit import audit

    limit = {} if args.max_random_numbers is None else {"max_random_numbers": args.max_random_numbers}
    result = audit(
        build_mechanism(args),
        delta=args.delta,
        samples=args.samples,
        seed=args.seed,
        confidence=args.confidence,
        training_samples=getattr(args, "training_samples", None),
        full_releases=args.full_releases,
        **limit,
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

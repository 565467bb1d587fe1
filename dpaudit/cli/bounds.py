"""``dpaudit bounds <name>``: analytic (eps, delta) bounds for a mechanism's parameters, with a Gaussian baseline.

Each bound prints eps for every ``--delta`` given (or delta for every ``--epsilon``), one row per
bound, and ``--json`` prints the same rows as JSON. Only numpy/scipy/dp-accounting load here.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from accountants.validation import InvalidArgument
from dpaudit.cli.arguments import add_json, add_seed
from dpaudit.errors import UsageError
from dpaudit.formatting import json_text, short_number


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bounds",
        help="analytic privacy bounds (eps for delta, or delta for eps)",
        description="Analytic (eps, delta) bounds for a mechanism's parameters, with a Gaussian baseline: "
        "eps at each --delta, or delta at each --epsilon; --json for machine-readable rows.",
    )
    names = parser.add_subparsers(dest="bound", required=True, metavar="<name>")
    for name, entry in _BOUNDS.items():
        sub = names.add_parser(name, help=entry.help, description=entry.help)
        entry.add_arguments(sub)
        query = sub.add_mutually_exclusive_group(required=True)
        query.add_argument("--delta", type=float, nargs="+", help="report eps at each of these delta")
        if entry.epsilon_query:
            query.add_argument("--epsilon", type=float, nargs="+", help="report delta at each of these eps")
        add_json(sub, "print JSON instead of a table")
        sub.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        bounds, extra = _BOUNDS[args.bound].compute(args)
    except InvalidArgument as error:
        raise InvalidArgument(_named_as_option(str(error), args)) from None
    if args.json:
        print(json_text(dict(bound=args.bound, bounds=[b.to_dict() for b in bounds], **extra)), end="")
    else:
        print(_table(bounds, by_delta=args.delta is not None))
        for key, value in extra.items():
            print(f"{key}: {value}")
    return 0


def _named_as_option(message: str, args: argparse.Namespace) -> str:
    """An accountant's message about its argument ``sample_rate`` names the option the user typed, --sample-rate."""
    first = message.split(" ", 1)[0]
    if first in vars(args):
        return f"--{first.replace('_', '-')}{message[len(first) :]}"
    return message


# ---------------------------------------------------------------------------------------------- table


def _note(bound) -> str:
    notes = []
    if not bound.valid:
        notes.append(f"invalid: {bound.reason}")
    interval = bound.epsilon_interval or bound.delta_interval
    if interval is not None:
        notes.append(f"{bound.confidence:.0%} CI [{short_number(interval[0])}, {short_number(interval[1])}]")
    if bound.conditional_on:
        notes.append("conditional on: " + "; ".join(bound.conditional_on))
    return "  ".join(notes)


def _table(bounds, by_delta: bool) -> str:
    header = ("delta", "epsilon", "bound", "notes") if by_delta else ("epsilon", "delta", "bound", "notes")
    rows = [
        (
            (short_number(b.delta), short_number(b.epsilon))
            if by_delta
            else (short_number(b.epsilon), short_number(b.delta))
        )
        + (b.source, _note(b))
        for b in bounds
    ]
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *rows]]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def _queries(args):
    """(targets, is_delta): the values asked for."""
    return (args.delta, True) if args.delta is not None else (args.epsilon, False)


# ---------------------------------------------------------------------------------------------- gaussian


def _gaussian_arguments(p):
    p.add_argument("--sensitivity", type=float, default=1.0, help="l2 sensitivity Delta (default: 1)")
    p.add_argument("--sigma", type=float, required=True, help="noise standard deviation")


def _gaussian(args):
    from accountants import gaussian

    targets, by_delta = _queries(args)
    if not by_delta:
        return [gaussian.delta(e, args.sensitivity, args.sigma) for e in targets], {}
    return [
        b
        for d in targets
        for b in (
            gaussian.epsilon(d, args.sensitivity, args.sigma),
            gaussian.classical_epsilon(d, args.sensitivity, args.sigma),
            gaussian.rdp_epsilon(d, args.sensitivity, args.sigma),
        )
    ], {}


# ---------------------------------------------------------------------------------------------- dpsgd


def _dpsgd_arguments(p):
    p.add_argument("--noise-multiplier", type=float, required=True, help="sigma: noise std / clipping norm")
    p.add_argument("--sample-rate", type=float, required=True, help="Poisson sampling rate q")
    p.add_argument("--steps", type=int, required=True, help="number of steps T")


def _no_subsampling_baseline(targets, by_delta, noise_multiplier, steps):
    """T Gaussian steps without subsampling: mu = sqrt(T) / sigma (Gaussian baseline)."""
    from accountants import gaussian
    from accountants.result import ADD_REMOVE

    sigma = noise_multiplier / math.sqrt(steps)
    query = gaussian.epsilon if by_delta else gaussian.delta
    return [
        dataclasses.replace(
            query(t, 1.0, sigma, neighbouring=ADD_REMOVE),
            source="Gaussian baseline: T steps without subsampling (exact profile)",
        )
        for t in targets
    ]


def _dpsgd(args):
    from accountants import dpsgd

    targets, by_delta = _queries(args)
    q, sigma, steps = args.sample_rate, args.noise_multiplier, args.steps
    if by_delta:
        ours = [b for d in targets for b in (dpsgd.epsilon(sigma, q, steps, d), dpsgd.rdp_epsilon(sigma, q, steps, d))]
    else:
        ours = list(dpsgd.delta_curve(sigma, q, steps, targets))
    return ours + _no_subsampling_baseline(targets, by_delta, sigma, steps), {}


# ---------------------------------------------------------------------------------------------- wishart


def _vector_arguments(p):
    p.add_argument("--rho", type=float, required=True, help="minimum alignment <v, v'> of neighbouring outputs")
    p.add_argument("--d", type=int, required=True, help="dimension")
    p.add_argument("--r", type=int, required=True, help="projection rank")
    p.add_argument("--samples", type=int, default=10**6, help="Monte-Carlo draws for the exact profile")
    add_seed(p)


def _vector(args):
    from accountants import wishart

    targets, by_delta = _queries(args)
    profile = wishart.vector_profile(args.rho, args.d, args.r, samples=args.samples, seed=args.seed)
    if by_delta:
        return [
            b for d in targets for b in (wishart.theorem1_epsilon(d, args.rho, args.d, args.r), profile.epsilon(d))
        ], _NO_GAUSSIAN
    return [
        b for e in targets for b in (wishart.theorem1_delta(e, args.rho, args.d, args.r), profile.delta(e))
    ], _NO_GAUSSIAN


_NO_GAUSSIAN = {"gaussian baseline": "none (the mechanism adds no Gaussian noise)"}


def _m1_arguments(p):
    p.add_argument("--sensitivity", type=float, required=True, help="Delta_v = |v_j - v'_j| for unit columns")
    p.add_argument("--sigma", type=float, required=True, help="noise std sigma_G")
    p.add_argument("--d", type=int, required=True)
    p.add_argument("--r", type=int, required=True)
    p.add_argument("--s", type=int, required=True, help="dim span(V_-j), the other columns")
    p.add_argument("--rho-perp", type=float, required=True, help="alignment of the parts outside span(V_-j)")
    p.add_argument("--beta-perp", type=float, default=1.0, help="norm of those parts (0: none)")
    p.add_argument("--k", type=int, default=1, help="number of changed columns (Thm 3 chain)")
    p.add_argument(
        "--calibration",
        choices=("exact", "classical"),
        default="exact",
        help="Gaussian step of Lemma 15: exact profile, or [W] Eq. 3 (valid for eps < 1)",
    )


def _m1(args):
    from accountants import gaussian, wishart
    from accountants import validation as check

    # the baseline takes sqrt(d) and divides by r before Thm 3 checks them
    d, r, k = check.count("--d", args.d), check.count("--r", args.r), check.count("--k", args.k)
    baseline_sensitivity = (math.sqrt(d) + math.sqrt(r)) ** 2 / r * math.sqrt(k) * args.sensitivity
    bounds = []
    for d in args.delta:
        bounds.append(
            wishart.theorem3_epsilon(
                d,
                args.k,
                args.sensitivity,
                args.sigma,
                args.d,
                args.r,
                args.s,
                args.rho_perp,
                args.beta_perp,
                args.calibration,
            )
        )
        bounds.append(
            dataclasses.replace(
                gaussian.epsilon(d, baseline_sensitivity, args.sigma),
                source="Gaussian baseline [W] Eq. 5 (exact profile)",
            )
        )
    return bounds, {
        "gaussian baseline": "[W] Eq. 5 treats M as fixed: sensitivity |M| sqrt(k) Delta_v with "
        "|M| ~ (sqrt d + sqrt r)^2 / r (a typical value, not a bound)"
    }


def _m2_arguments(p):
    p.add_argument("--sensitivity", type=float, required=True, help="|Delta V|_F")
    p.add_argument("--sigma", type=float, required=True, help="noise std sigma_G")
    p.add_argument("--d", type=int, required=True)
    p.add_argument("--r", type=int, required=True)
    p.add_argument("--s", type=int, default=1, help="min(n, d) or rank(Delta V) for Thm 5 (default: 1)")
    p.add_argument(
        "--singular-values",
        type=float,
        nargs="+",
        default=None,
        help="spectrum of Delta V for the mixture bound (default: rank 1)",
    )
    p.add_argument("--samples", type=int, default=20000, help="Haar subspaces sampled when rank > 1")
    add_seed(p)
    p.add_argument("--sample-rate", type=float, default=None, help="with --steps: multi-step accounting (App. F.2)")
    p.add_argument("--steps", type=int, default=None)


def _m2(args):
    from accountants import dpsgd, gaussian, wishart

    targets, by_delta = _queries(args)
    if (args.sample_rate is None) != (args.steps is None):
        raise UsageError("--sample-rate and --steps go together (multi-step accounting, [W] App. F.2)")
    if args.sample_rate is not None and not by_delta:
        raise UsageError("multi-step accounting (--sample-rate, --steps) reports eps: use --delta")
    common = (args.sensitivity, args.sigma, args.d, args.r)
    mixture = dict(singular_values=args.singular_values, samples=args.samples, seed=args.seed)
    bounds = []
    for t in targets:
        if not by_delta:
            bounds += [
                wishart.theorem5_delta(t, *common, args.s),
                wishart.m2_mixture_delta(t, *common, **mixture),
                gaussian.delta(t, args.sensitivity, args.sigma),
            ]
            continue
        bounds += [
            wishart.theorem5_epsilon(t, *common, args.s),
            wishart.m2_mixture_epsilon(t, *common, **mixture),
            gaussian.epsilon(t, args.sensitivity, args.sigma),
            gaussian.tail_epsilon(t, args.sensitivity, args.sigma),
        ]
        if args.sample_rate is not None:
            bounds += [
                wishart.m2_multistep_epsilon(t, *common, args.s, args.sample_rate, args.steps),
                dpsgd.epsilon(args.sigma / args.sensitivity, args.sample_rate, args.steps, t),
            ]
    return bounds, {}


# ---------------------------------------------------------------------------------------------- sketch


def _sketch_arguments(p):
    p.add_argument("--rank", type=int, required=True, help="LoRA rank r")
    p.add_argument("--layers", type=int, default=1, help="number of adapted layers L")
    p.add_argument("--tau", type=int, required=True, help="tau <= n, the rank of the Gram change ([S] Cor. 7.3: n)")
    p.add_argument("--lr", type=float, required=True, help="learning rate eta")
    p.add_argument("--smoothness", type=float, required=True, help="smoothness beta of the loss (assumed)")
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument(
        "--lambda-min",
        type=float,
        required=True,
        help="lower bound on lambda_min(G G^T) of the cumulative gradient (measured)",
    )
    p.add_argument("--sigma-g", type=float, default=0.0, help="std of the noise added to B's gradient sum")
    p.add_argument("--grad-bound", type=float, required=True, help="per-example gradient norm bound C (measured)")
    p.add_argument("--steps", type=int, required=True)


def _sketch(args):
    from accountants import sketch

    lora = (
        args.lr,
        args.smoothness,
        args.batch_size,
        args.lambda_min,
        args.sigma_g,
        args.grad_bound,
        args.steps,
        args.rank,
        args.layers,
        args.tau,
    )
    bounds = [b for d in args.delta for b in (sketch.lemma72(d, *lora), sketch.corollary73(d, *lora))]
    return bounds, _NO_GAUSSIAN


# ---------------------------------------------------------------------------------------------- prism


def _prism_arguments(p):
    _dpsgd_arguments(p)
    p.add_argument("--clip", type=float, default=1.0, help="clipping threshold C")
    p.add_argument("--batch-size", type=float, required=True, help="expected batch size b")
    p.add_argument("--m", type=int, required=True, help="rows of Z = A B^T")
    p.add_argument("--n", type=int, required=True, help="columns of Z")
    p.add_argument("--r", type=int, required=True, help="LoRA rank")
    p.add_argument("--a-norm", type=float, default=None, help="|A|_F, for the factor-space (DP-LoRA) energy")
    p.add_argument("--b-norm", type=float, default=None, help="|B|_F, for the factor-space (DP-LoRA) energy")


def _prism(args):
    from accountants import prism

    extra = {
        "intrinsic noise energy [P] Eq. 21": prism.intrinsic_noise_energy(
            args.noise_multiplier, args.clip, args.batch_size, args.m, args.n, args.r
        )
    }
    scale = args.noise_multiplier * args.clip / args.batch_size  # all three checked > 0 just above
    if (args.a_norm is None) != (args.b_norm is None):
        raise UsageError("--a-norm and --b-norm go together (factor-space energy, [P] Prop. 2.2)")
    bounds, _ = _dpsgd(args)
    if args.a_norm is not None:
        energy = prism.factor_noise_energy(scale, args.m, args.n, args.r, args.a_norm, args.b_norm)
        extra["factor-space noise energy [P] Prop. 2.2"] = energy.effective
    return bounds, extra


@dataclass(frozen=True)
class _Command:
    """One ``dpaudit bounds <name>``: its help, its options, and the bounds (with extra lines) it reports."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    compute: Callable[[argparse.Namespace], tuple[list, dict]]
    epsilon_query: bool = True  # whether --epsilon (delta at each eps) is offered besides --delta


_BOUNDS = {
    "gaussian": _Command(
        "Gaussian mechanism: exact profile, classical calibration, RDP", _gaussian_arguments, _gaussian
    ),
    "dpsgd": _Command(
        "Poisson-subsampled Gaussian composed T times (DP-SGD, DP-LoRA, DP-LoRA-FA)", _dpsgd_arguments, _dpsgd
    ),
    "wishart-vector": _Command(
        "[W] vector projection y = Mv: Thm 1 and the exact profile (Monte Carlo)",
        _vector_arguments,
        _vector,
    ),
    "wishart-m1": _Command(
        "[W] M1 = MV + Xi: Thm 4 (one column) and Thm 3 (k columns)", _m1_arguments, _m1, epsilon_query=False
    ),
    "wishart-m2": _Command("[W] M2 = M(V + Xi): Thm 5, the mixture bound, App. F.2 multi-step", _m2_arguments, _m2),
    "sketch": _Command(
        "[S] noisy LoRA-FA as a Gaussian sketch: Lemma 7.2 (RDP) and Cor. 7.3 (tCDP), conditional",
        _sketch_arguments,
        _sketch,
        epsilon_query=False,
    ),
    "prism": _Command(
        "[P] PRISM: DP-SGD accounting (Thm 3.4) and the intrinsic noise energy (Eq. 21)",
        _prism_arguments,
        _prism,
    ),
}

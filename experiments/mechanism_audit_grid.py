"""Theorems vs exact profiles vs direct mechanism audits over a grid of (d, r, sigma, rho), side by side.

For every grid point the mechanism's release is sampled under a neighbouring pair and audited
(:func:`dpaudit.release_audit.audit.audit`); one CSV row per point holds every analytic epsilon that applies
([W] Thm 1, Thm 3 in both calibrations, Thm 5, the M2 mixture bound, the Gaussian baseline, [S] Lemma 7.1 as
stated and in its one-column form, [S]'s claim for noise-free LoRA-FA), the exact profile's epsilon where one
exists, and the audited epsilon by both routes: (b) the estimated profile with its band (exact likelihood ratios)
and (a) the Clopper-Pearson lower bound. Pairs: unit vectors with alignment rho (vector release); a one-column
change ``v_j -> v'_j`` with ``<v_j, v'_j> = rho`` orthogonal to the other columns ([W] Def. 4 with
beta_perp = 1, rho_perp = rho) for M1, M2 and the projection, so that ``|Delta V|_F = sqrt(2 (1 - rho))``;
the tight zero-out pair of [S] Lemma 7.1 for the sketch.

Writes ``mechanism_audit_grid.csv`` and ``mechanism_audit_grid.png`` to ``--out`` and prints the headline
findings (loosest theorem, violations, the sketch with sigma_g = 0).

    python experiments/mechanism_audit_grid.py --out experiments/results/            # CPU scale, about a minute
    python experiments/mechanism_audit_grid.py --paper-scale                      # 10^6 draws, larger grid
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import _common  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from dpaudit.release_audit import releases  # noqa: E402
from dpaudit.release_audit.audit import audit

# Bound source (prefix) -> CSV column, in the order the columns appear.
BOUND_COLUMNS = (
    ("[W] Thm 1", "thm1"),
    ("[W] Thm 3 (classical", "thm3_classical"),
    ("[W] Thm 3 (exact", "thm3"),
    ("[W] Thm 5", "thm5"),
    ("M2 mixture", "mixture"),
    ("Gaussian mechanism on V + Xi", "gaussian_baseline"),
    ("[S] Lemma 7.1 + ", "lemma71"),
    ("[S] Lemma 7.1, one-column", "lemma71_one_column"),
    ("[S] Lemma 7.1 as applied to LoRA-FA", "lemma71_lora_claim"),
    ("[W] Prop. 2", "prop2"),
)
COLUMNS = (
    "mechanism",
    "d",
    "n",
    "r",
    "sigma",
    "rho",
    "sensitivity",
    "delta",
    "samples",
    *(column for _, column in BOUND_COLUMNS),
    "exact",
    "audit_profile",
    "audit_profile_low",
    "audit_profile_high",
    "audit_cp",
    "audit_gdp",
    "auc",
    "outcome",
    "violated",
    "seconds",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=_common.DEFAULT_OUT, help="output folder")
    parser.add_argument(
        "--paper-scale",
        action="store_true",
        help="10^6 draws for exact likelihood ratios, 10^5 for the others, a larger grid",
    )
    parser.add_argument("--delta", type=float, default=1e-3, help="delta of every epsilon (default: 1e-3)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not 0 < args.delta < 1:
        parser.error("--delta must be in (0, 1)")
    return args


def grid(paper_scale: bool):
    """(mechanism kind, parameters, release sampler, draws per side) for every grid point."""
    exact_draws, learned_draws, projection_draws = (
        (10**6, 10**5, 10**5) if paper_scale else (2 * 10**5, 2 * 10**4, 10**4)
    )
    vector = (
        itertools.product((100, 400, 1000), (4, 16, 64, 256), (0.999, 0.9999, 0.99999))
        if paper_scale
        else itertools.product((100, 400), (16, 64), (0.999, 0.9999))
    )
    for d, r, rho in vector:
        mechanism = releases.WishartVector(releases.aligned_unit_vectors(d, rho), r)
        yield "wishart-vector", dict(d=d, r=r, rho=rho), mechanism, exact_draws
    noisy = {
        "wishart-m1": (
            itertools.product((32, 64), (8, 32), (0.5, 1.0), (0.9, 0.99))
            if paper_scale
            else itertools.product((32,), (8, 32), (0.5, 1.0), (0.99,))
        ),
        "wishart-m2": (
            itertools.product((32, 64), (2, 8), (0.25, 0.5, 1.0), (0.9, 0.99))
            if paper_scale
            else itertools.product((32,), (2, 8), (0.5, 1.0), (0.9, 0.99))
        ),
    }
    for kind, points in noisy.items():
        release = releases.NoisyProjectionM1 if kind == "wishart-m1" else releases.NoisyProjectionM2Release
        for d, r, sigma, rho in points:
            mechanism = release(releases.one_column_change(d, 2, 1.0, 1.0, rho), r, sigma)
            yield kind, dict(d=d, n=2, r=r, sigma=sigma, rho=rho), mechanism, learned_draws
    for r, sigma_g, sensitivity in itertools.product((8, 64), (0.0, 0.1), (0.1, 0.2)):
        mechanism = releases.GaussianSketchRelease(
            releases.sketch_pair(4, 32, 2.0, sensitivity, 1.0), r, 1 / math.sqrt(r), sigma_g
        )
        yield "sketch", dict(d=32, n=4, r=r, sigma=sigma_g, sensitivity=sensitivity), mechanism, exact_draws
    for r, rho in itertools.product((8, 16), (0.999, 0.9999)):
        mechanism = releases.MatrixProjection(releases.one_column_change(32, 2, 1.0, 1.0, rho), r)
        yield "projection", dict(d=32, n=2, r=r, rho=rho), mechanism, projection_draws


def row(kind: str, parameters: dict, result, seconds: float) -> dict:
    values = dict.fromkeys(COLUMNS, "")
    values.update(parameters, mechanism=kind, delta=result.delta, samples=result.samples, seconds=round(seconds, 2))
    for name in ("sensitivity", "frobenius_distance"):  # B_S of the sketch, |Delta V|_F of the matrix pairs
        values["sensitivity"] = result.parameters.get(name, values["sensitivity"])
    for bound in result.bounds:
        column = next(column for prefix, column in BOUND_COLUMNS if bound.source.startswith(prefix))
        values[column] = bound.epsilon
    if result.exact_profile is not None:
        values["exact"] = result.exact_profile.epsilon
    if result.profile is not None:
        values["audit_profile"], values["audit_profile_low"], values["audit_profile_high"] = result.profile.epsilon
    values.update(
        audit_cp=result.clopper_pearson.epsilon,
        audit_gdp=result.gaussian_dp.epsilon,
        auc=result.auc,
        outcome=result.outcome,
        violated="; ".join(c.bound.source for c in result.comparisons if c.outcome == "violated"),
    )
    return values


def write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def _number(value) -> float:
    return float(value) if value != "" else math.nan


def _ratios(rows: list[dict], column: str, reference: str) -> np.ndarray:
    """Bound / reference eps over the rows where both are finite and the reference is > 0.

    ``reference``: ``"exact"`` (the exact profile), or ``"audited"`` (route b where available, else route a).
    """
    values = []
    for r in rows:
        if reference == "exact":
            denominator = _number(r["exact"])
        else:
            denominator = _number(r["audit_profile"] if r["audit_profile"] != "" else r["audit_cp"])
        value = _number(r[column])
        if math.isfinite(value) and math.isfinite(denominator) and denominator > 0:
            values.append(value / denominator)
    return np.array(values)


def _median_ratio(rows: list[dict], column: str, reference: str) -> float:
    ratios = _ratios(rows, column, reference)
    return float(np.median(ratios)) if ratios.size else -math.inf


def plot(path: Path, rows: list[dict], delta: float) -> None:
    kinds = list(dict.fromkeys(r["mechanism"] for r in rows))
    figure, axes = plt.subplots(len(kinds), 1, figsize=(12, 3.2 * len(kinds)), squeeze=False)
    markers = dict(zip((c for _, c in BOUND_COLUMNS), "^v<>sDph*"))
    for axis, kind in zip(axes[:, 0], kinds):
        chosen = [r for r in rows if r["mechanism"] == kind]
        x = np.arange(len(chosen))
        for _, column in BOUND_COLUMNS:
            values = np.array([_number(r[column]) for r in chosen])
            if np.any(np.isfinite(values)):
                axis.scatter(x, values, marker=markers[column], label=column)
        exact = np.array([_number(r["exact"]) for r in chosen])
        if np.any(np.isfinite(exact)):
            axis.scatter(x, exact, marker="o", facecolors="none", edgecolors="k", s=80, label="exact profile")
        profile = np.array([_number(r["audit_profile"]) for r in chosen])
        if np.any(np.isfinite(profile)):
            low = profile - np.array([_number(r["audit_profile_low"]) for r in chosen])
            high = np.array([_number(r["audit_profile_high"]) for r in chosen]) - profile
            axis.errorbar(x, profile, yerr=[low, high], fmt="x", color="tab:red", label="audit (b): profile")
        axis.scatter(
            x,
            [_number(r["audit_cp"]) for r in chosen],
            marker="_",
            s=200,
            color="tab:green",
            label="audit (a): Clopper-Pearson",
        )
        axis.set_yscale("log")
        labels = [
            ", ".join(
                f"{k}={r[k]:.3g}" if k == "sensitivity" else f"{k}={r[k]:g}"
                for k in ("d", "r", "sigma", "rho", "sensitivity")
                if r[k] != ""
            )
            for r in chosen
        ]
        axis.set_xticks(x, labels, rotation=30, ha="right", fontsize=7)
        axis.set_title(
            f"{kind}: epsilon at delta = {delta:g}"
            + ("  (not DP: every point)" if all(r["outcome"] == "not DP" for r in chosen) else "")
        )
        axis.legend(fontsize=7, ncol=3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def headline(rows: list[dict]) -> list[str]:
    """Looseness of each bound (vs the exact profile, and vs the audit), violations, the sketch with sigma_g = 0."""
    lines = []
    for _, column in sorted(BOUND_COLUMNS, key=lambda item: -_median_ratio(rows, item[1], "exact")):
        exact, audited = (_ratios(rows, column, reference) for reference in ("exact", "audited"))
        if exact.size or audited.size:
            versus_exact = (
                f"median {np.median(exact):7.3g}, max {exact.max():7.3g} ({exact.size} points)"
                if exact.size
                else "no exact profile"
            )
            versus_audit = f"median {np.median(audited):7.3g} ({audited.size} points)" if audited.size else "-"
            lines.append(f"  {column:<20} bound / exact eps: {versus_exact}; bound / audited eps: {versus_audit}")
    infinite = {
        column: sum(1 for r in rows if r[column] != "" and not math.isfinite(_number(r[column])))
        for _, column in BOUND_COLUMNS
    }
    lines += [f"  {column}: inapplicable (eps = inf) at {count} points" for column, count in infinite.items() if count]
    violated = [r for r in rows if r["outcome"] in ("violated", "not DP")]
    counts = {
        outcome: sum(r["outcome"] == outcome for r in rows)
        for outcome in ("consistent", "inconclusive", "violated", "not DP")
    }
    lines.append("  outcomes: " + ", ".join(f"{outcome}: {count}" for outcome, count in counts.items()))
    for r in violated:
        lines.append(f"  {r['outcome']}: {r['mechanism']} d={r['d']} r={r['r']} rho={r['rho']}: {r['violated']}")
    for r in rows:
        if r["mechanism"] == "sketch" and r["sigma"] == 0.0:
            lemma, stated = _number(r["lemma71_one_column"]), _number(r["lemma71"])
            audited, low, high = (_number(r[k]) for k in ("audit_profile", "audit_profile_low", "audit_profile_high"))
            larger = (
                "Lemma 7.1 (one-column form) is larger"
                if lemma > high
                else "the audit is larger"
                if low > lemma
                else "neither is larger beyond the band"
            )
            lines.append(
                f"  sketch sigma_g = 0, r={r['r']}, B_S={r['sensitivity']}: Lemma 7.1 eps = {lemma:.4g} "
                f"(as stated: {stated:.4g}), exact {_number(r['exact']):.4g}, audited {audited:.4g} "
                f"[{low:.4g}, {high:.4g}], CP >= {_number(r['audit_cp']):.4g}: {larger}"
            )
    return lines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for kind, parameters, mechanism, draws in grid(args.paper_scale):
        start = time.perf_counter()
        result = audit(mechanism, delta=args.delta, samples=draws, seed=args.seed)
        rows.append(row(kind, parameters, result, time.perf_counter() - start))
        print(f"{kind:<15} {parameters}  -> {result.outcome} ({rows[-1]['seconds']} s)", flush=True)
    write_csv(args.out / "mechanism_audit_grid.csv", rows)
    plot(args.out / "mechanism_audit_grid.png", rows, args.delta)
    print(f"\nwrote {args.out / 'mechanism_audit_grid.csv'} and {args.out / 'mechanism_audit_grid.png'}")
    print(f"headline findings at delta = {args.delta:g}:")
    print("\n".join(headline(rows)))


if __name__ == "__main__":
    main()

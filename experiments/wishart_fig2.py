"""Analogue of [W] Fig. 2: eps vs noise sigma for M2 = M(V + Xi) at d = 2000, delta = 1e-5, |Delta V|_F = 1.

Curves: [W] Thm 5 minimised over alpha (s = 1) and the M2 mixture bound (docs/theory.md §2.7) for several ranks r,
against two Gaussian baselines that ignore M: the exact Gaussian profile and [W] Eq. (10) (the
two-sided tail T, as plotted in the paper).

Writes ``wishart_fig2.csv`` and ``wishart_fig2.png`` to ``--out``.

    python experiments/wishart_fig2.py --out experiments/results/
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import _common  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from accountants import gaussian, wishart  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=_common.DEFAULT_OUT, help="output folder")
    parser.add_argument("--d", type=int, default=2000)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 32, 128, 512])
    parser.add_argument("--sigma-min", type=float, default=0.1)
    parser.add_argument("--sigma-max", type=float, default=10.0)
    parser.add_argument("--points", type=int, default=25, help="sigma values, log-spaced")
    return parser.parse_args(argv)


def compute(args: argparse.Namespace) -> list[dict]:
    rows = []
    for sigma in np.geomspace(args.sigma_min, args.sigma_max, args.points):
        sigma = float(sigma)
        exact = gaussian.epsilon(args.delta, 1.0, sigma).epsilon
        eq10 = gaussian.tail_epsilon(args.delta, 1.0, sigma).epsilon
        for r in args.ranks:
            theorem5 = wishart.theorem5_epsilon(args.delta, 1.0, sigma, args.d, r, 1)
            mixture = wishart.m2_mixture_epsilon(args.delta, 1.0, sigma, args.d, r)
            rows.append(
                dict(
                    d=args.d,
                    delta=args.delta,
                    sigma=sigma,
                    r=r,
                    theorem5_epsilon=theorem5.epsilon,
                    theorem5_alpha=theorem5.details.get("alpha"),
                    mixture_epsilon=mixture.epsilon,
                    gaussian_exact_epsilon=exact,
                    gaussian_eq10_epsilon=eq10,
                )
            )
    return rows


def plot(rows: list[dict], args: argparse.Namespace, ax) -> None:
    first = [row for row in rows if row["r"] == args.ranks[0]]
    sigmas = [row["sigma"] for row in first]
    ax.plot(sigmas, [row["gaussian_exact_epsilon"] for row in first], "k-", label="Gaussian (exact)")
    ax.plot(sigmas, [row["gaussian_eq10_epsilon"] for row in first], "k:", label="Gaussian ([W] Eq. 10)")
    for color, r in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], args.ranks):
        mine = [row for row in rows if row["r"] == r]
        ax.plot(sigmas, [row["theorem5_epsilon"] for row in mine], "--", color=color, label=f"Thm 5, r={r}")
        ax.plot(sigmas, [row["mixture_epsilon"] for row in mine], "-", color=color, label=f"mixture, r={r}")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="σ (noise std, |ΔV|_F = 1)",
        ylabel="ε",
        title=f"M2, d={args.d}, δ={args.delta:g}",
    )
    ax.legend(fontsize=7)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = compute(args)
    _common.write_table(rows, args.out, "wishart_fig2")
    with _common.figure(args.out, "wishart_fig2") as axes:
        plot(rows, args, axes[0])
    print(f"wrote {args.out / 'wishart_fig2.csv'} and {args.out / 'wishart_fig2.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

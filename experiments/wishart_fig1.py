"""Analogue of [W] Fig. 1: eps vs rank r of the vector projection y = M v at d = 400, delta = 0.01.

Two curves per alignment rho: [W] Thm 1 (delta' = (delta - P(A <= 0)) / 3, its best choice) and the
exact privacy profile sampled from [W] Lemma 8 (docs/theory.md §2.4), with its 99% confidence interval.
Thm 1 is inf where its condition rho > K fails.

Writes ``wishart_fig1.csv`` and ``wishart_fig1.png`` to ``--out``.

    python experiments/wishart_fig1.py --out experiments/results/
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import _common  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

from accountants import wishart  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=_common.DEFAULT_OUT, help="output folder")
    parser.add_argument("--d", type=int, default=400)
    parser.add_argument("--delta", type=float, default=0.01)
    parser.add_argument("--rho", type=float, nargs="+", default=[0.99, 0.999, 0.9999])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256, 400])
    parser.add_argument("--samples", type=int, default=10**6, help="Monte-Carlo draws per point")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def compute(args: argparse.Namespace) -> list[dict]:
    rows = []
    for rho in args.rho:
        for r in args.ranks:
            theorem1 = wishart.theorem1_epsilon(args.delta, rho, args.d, r)
            exact = wishart.vector_profile_epsilon(args.delta, rho, args.d, r, samples=args.samples, seed=args.seed + r)
            lo, hi = exact.epsilon_interval or (math.inf, math.inf)
            rows.append(
                dict(
                    d=args.d,
                    delta=args.delta,
                    rho=rho,
                    r=r,
                    theorem1_epsilon=theorem1.epsilon,
                    exact_epsilon=exact.epsilon,
                    exact_epsilon_lo=lo,
                    exact_epsilon_hi=hi,
                )
            )
    return rows


def _visible(values: list[float]) -> list[float]:
    """Eps = 0 (delta(0) already below delta) and inf (bound does not apply) have no place on a log axis."""
    return [v if 0 < v < math.inf else math.nan for v in values]


def plot(rows: list[dict], args: argparse.Namespace, ax) -> None:
    for color, rho in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], args.rho):
        mine = [row for row in rows if row["rho"] == rho]
        ranks = [row["r"] for row in mine]

        def column(key: str, mine: list[dict] = mine) -> list[float]:
            return _visible([row[key] for row in mine])

        ax.plot(ranks, column("theorem1_epsilon"), "--o", color=color, label=f"Thm 1, ρ={rho}")
        ax.plot(ranks, column("exact_epsilon"), "-s", color=color, label=f"exact (MC), ρ={rho}")
        ax.fill_between(ranks, column("exact_epsilon_lo"), column("exact_epsilon_hi"), color=color, alpha=0.2)
    ax.set(
        xscale="log", yscale="log", xlabel="rank r", ylabel="ε", title=f"Vector projection, d={args.d}, δ={args.delta}"
    )
    ax.legend(fontsize=7)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = compute(args)
    _common.write_table(rows, args.out, "wishart_fig1")
    with _common.figure(args.out, "wishart_fig1") as axes:
        plot(rows, args, axes[0])
    print(f"wrote {args.out / 'wishart_fig1.csv'} and {args.out / 'wishart_fig1.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

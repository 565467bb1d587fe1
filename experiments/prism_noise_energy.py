"""Factor-space DP-LoRA vs PRISM intrinsic noise energy over gauge rescalings ([P] Prop. 2.2, Cor. 2.3, Thm 3.1).

[P] Figs. 3 and 12.

For one LoRA module Z = A Bᵀ and gauges (cA, B/c), the same Z, this measures by sampling
* factor-space DP-LoRA: ‖ξ_A B_cᵀ + A_c ξ_Bᵀ + ξ_A ξ_Bᵀ‖², ξ i.i.d. N(0, τ²): predicted τ² S_t + mnrτ⁴ with
  S_t = m‖B_c‖² + n‖A_c‖², linear in S_t and unbounded in c;
* PRISM: ‖τ (Ξ_A B_cᵀ + A_c Ξ_Bᵀ)‖² with the Eq. 19 sampler: closed form τ² r(m+n−r) for every c.

Writes ``prism_noise_energy.csv`` and ``prism_noise_energy.png`` to ``--out`` and prints the linear fit.

    python experiments/prism_noise_energy.py --out experiments/results/
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only, no display
import _common  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from dpaudit.studies.prism_noise_energy import gauge_sweep_noise_energy, linear_fit

SETTINGS = ("m", "n", "rank", "noise_std", "draws")
COLUMNS = (
    "gauges",
    "factor_norm_statistic",
    "factor_first_order",
    "factor_first_order_predicted",
    "factor_bilinear",
    "factor_bilinear_predicted",
    "factor_total",
    "prism",
    "prism_closed_form",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=_common.DEFAULT_OUT, help="output folder")
    parser.add_argument("--m", type=int, default=64, help="rows of the module (n_out)")
    parser.add_argument("--n", type=int, default=48, help="columns of the module (n_in)")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--noise-std", type=float, default=0.05, help="τ = σC/b, per entry")
    parser.add_argument("--draws", type=int, default=4000, help="Monte Carlo draws per gauge and mechanism")
    parser.add_argument("--gauges", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0, 4.0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if min(args.m, args.n) < args.rank or args.rank < 1 or args.draws < 1 or len(args.gauges) < 3:
        parser.error("need 1 <= rank <= min(m, n), draws >= 1 and at least 3 gauges (for the linear fit)")
    return args


def write_csv(path: Path, sweep, args: argparse.Namespace) -> None:
    """One row per gauge: the module's setting (``SETTINGS``), then the sweep's ``COLUMNS``."""
    setting = [getattr(args, name) for name in SETTINGS]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow((*SETTINGS, *COLUMNS))
        writer.writerows((*setting, *values) for values in zip(*(getattr(sweep, column) for column in COLUMNS)))


def plot(path: Path, sweep, fit: tuple[float, float, float], title: str) -> None:
    slope, intercept, r_squared = fit
    figure, (by_statistic, by_gauge) = plt.subplots(1, 2, figsize=(11, 4.2))
    order = np.argsort(sweep.factor_norm_statistic)
    statistic = sweep.factor_norm_statistic[order]
    by_statistic.plot(statistic, sweep.factor_total[order], "o", label="factor-space DP-LoRA (measured)")
    by_statistic.plot(statistic, slope * statistic + intercept, "-", label=f"linear fit, R² = {r_squared:.4f}")
    by_statistic.plot(statistic, sweep.prism[order], "s", label="PRISM (measured)")
    by_statistic.plot(statistic, sweep.prism_closed_form[order], "--", label="PRISM closed form τ²r(m+n−r)")
    by_statistic.set(xlabel="S_t = m‖B‖² + n‖A‖²", ylabel="E‖N_Z‖_F²", title="intrinsic noise energy vs S_t")
    by_statistic.legend(fontsize=8)
    by_gauge.loglog(sweep.gauges, sweep.factor_total, "o-", label="factor-space DP-LoRA (measured)")
    by_gauge.loglog(
        sweep.gauges,
        sweep.factor_first_order_predicted + sweep.factor_bilinear_predicted,
        ":",
        label="τ² S_t + mnrτ⁴ (Prop. 2.2)",
    )
    by_gauge.loglog(sweep.gauges, sweep.prism, "s-", label="PRISM (measured)")
    by_gauge.loglog(sweep.gauges, sweep.prism_closed_form, "--", label="PRISM closed form")
    by_gauge.set_xticks(sweep.gauges, [f"{c:g}" for c in sweep.gauges])
    by_gauge.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    by_gauge.set(xlabel="gauge c in (cA, B/c)", ylabel="E‖N_Z‖_F²", title="same Z, different factorisations")
    by_gauge.legend(fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    generator = torch.Generator().manual_seed(args.seed)
    # Gaussian factors at the scale of a LoRA module after some training: Z = A Bᵀ of full rank r.
    A = torch.randn(args.m, args.rank, generator=generator, dtype=torch.float64) / args.rank**0.5
    B = torch.randn(args.n, args.rank, generator=generator, dtype=torch.float64) / args.rank**0.5
    sweep = gauge_sweep_noise_energy(A, B, args.gauges, args.noise_std, args.draws, generator)
    fit = linear_fit(sweep.factor_norm_statistic, sweep.factor_total)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "prism_noise_energy.csv", sweep, args)
    title = f"m={args.m}, n={args.n}, r={args.rank}, τ={args.noise_std}, {args.draws} draws per point"
    plot(args.out / "prism_noise_energy.png", sweep, fit, title)
    deviation = np.abs(sweep.prism / sweep.prism_closed_form - 1).max()
    print(
        f"factor-space energy vs S_t: slope {fit[0]:.4g} (τ² = {args.noise_std**2:.4g}), "
        f"intercept {fit[1]:.4g}, R² {fit[2]:.5f}"
    )
    print(f"PRISM energy: max relative deviation from τ²r(m+n−r) = {sweep.prism_closed_form[0]:.4g}: {deviation:.3%}")
    print(f"wrote {args.out / 'prism_noise_energy.csv'} and {args.out / 'prism_noise_energy.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

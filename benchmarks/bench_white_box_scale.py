"""The white-box DP-SGD step audit at scale: GDP-route ε over analytic ε at 10 000 + 10 000 trials, over seeds.

    nice -n 10 .venv/bin/python benchmarks/bench_white_box_scale.py --seeds 0 1 2 3 4   # 7-30 min a seed, 2 cores
    .venv/bin/python benchmarks/bench_white_box_scale.py --table                         # the table, nothing run

Each seed is one ``dpaudit audit`` (a subprocess, its own run directory under ``--runs``) of digits' MLP: full batch
(q = 1), σ = 2, C = 1, 4 steps, a Dirac gradient canary, every step observed (``--observe steps``): μ = √T/σ = 1,
analytic ε = 4.38 at δ = 1e-5. A finished seed appends its row (analytic ε, GDP and CP ε, their ratio, the wall
time) to ``--csv`` at once, and a seed already there is not run again. ``--table`` prints each row with what
``dpaudit audit --trials-for-ratio`` predicts: the median GDP ratio the ceiling simulation
(:func:`attacks.ceiling.estimator_ceiling`) gives at the row's trials, and the trials it needs for the ratio measured.

Measured (2026-11-25, 2 workers, ``nice -n 10`` on the shared 2-core machine, load average 6-10 from other jobs):
1000 + 1000 (seed 0) took 40 s wall at load 0.6-1.4 (ratio 0.707, simulated median 0.759). 10 000 + 10 000, seeds
0-4: GDP ε / analytic ε 0.929 0.916 0.945 0.895 0.915 (mean 0.920, none above 1; CP 0.44-0.49) against the simulated
median 0.918 ± 0.002 (all 101 simulated audits in [0.871, 0.982]); 1819, 1097, 802, 562, 447 s a seed as the load fell
from about 10 to 4 (a quiet machine projects about 7 min: 10 × the 1000 + 1000 run). ``--trials-for-ratio 0.85``
says 2726 + 2726 trials, 0.9 says 6080 + 6080.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from attacks import ceiling

CSV = Path("experiments/results/white_box_scale.csv")
SETTING = [
    "--mechanism", "dp-sgd", "--canary", "gradient", "--observe", "steps", "--epochs", "4", "--batch-size", "718",
    "--noise", "2", "--clip", "1", "--lr", "0.05",
]  # fmt: skip


def run_seed(seed: int, models: int, runs: Path, workers: int) -> dict:
    """One audit of ``models`` models (half IN) at ``seed`` into ``runs``/m{models}-s{seed}: its CSV row."""
    out = runs / f"m{models}-s{seed}"
    command = [sys.executable, "-m", "dpaudit", "audit", *SETTING, "--models", str(models), "--seed", str(seed)]
    command += ["--workers", str(workers), "--quiet", "--json", "--out", str(out)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - start
    numbers = json.loads(done.stdout)
    return {
        "models": models,
        "seed": seed,
        "n_in": numbers["n_in"],
        "n_out": numbers["n_out"],
        "analytic_epsilon": numbers["analytic_epsilon"],
        "gdp_epsilon": numbers["epsilon_lower_bound_gdp"],
        "cp_epsilon": numbers["epsilon_lower_bound"],
        "gdp_ratio": numbers["epsilon_lower_bound_gdp"] / numbers["analytic_epsilon"],
        "auc": numbers["auc"],
        "wall_seconds": round(seconds, 1),
        "campaign_seconds": round(numbers["seconds"], 1),
        "load_average": Path("/proc/loadavg").read_text().split()[0],
    }


def table(rows: pd.DataFrame, delta: float) -> pd.DataFrame:
    """``rows`` with the ceiling simulation's prediction at each row's trials and the trials its ratio needs."""
    predicted, needed = [], []
    for row in rows.itertuples():
        predicted.append(ceiling.estimator_ceiling(int(row.n_in), int(row.n_out), row.analytic_epsilon, delta).gdp)
        needed.append(ceiling.trials_for_ratio(min(row.gdp_ratio, 0.97), row.analytic_epsilon, delta))
    return rows.assign(predicted_ratio=predicted, trials_for_measured_ratio=needed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2, 3, 4])
    parser.add_argument("--models", type=int, default=20_000, help="shadow models, half IN (20 000)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=Path, default=Path("/tmp/white_box_scale"), help="the run directories")
    parser.add_argument("--csv", type=Path, default=CSV)
    parser.add_argument("--table", action="store_true", help="print the table of --csv and run nothing")
    args = parser.parse_args()
    if not args.table:
        done = pd.read_csv(args.csv).to_dict("records") if args.csv.is_file() else []
        for seed in args.seeds:
            if any(row["models"] == args.models and row["seed"] == seed for row in done):
                continue
            done.append(run_seed(seed, args.models, args.runs, args.workers))
            args.csv.parent.mkdir(parents=True, exist_ok=True)
            pd.DataFrame(done).to_csv(args.csv, index=False)
            print(", ".join(f"{key} {value}" for key, value in done[-1].items()), flush=True)
    rows = pd.read_csv(args.csv)
    print(table(rows, 1e-5).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    epsilon = float(rows["analytic_epsilon"].iloc[0])
    for ratio in (0.85, 0.9):
        print(f"--trials-for-ratio {ratio}: {ceiling.trials_for_ratio(ratio, epsilon, 1e-5)} IN + as many OUT")


if __name__ == "__main__":
    main()

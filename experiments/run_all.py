"""Run every reproduction script of ``experiments/`` at CPU scale, one after another, and print a timing table.

Each script runs as its own process (``python experiments/SCRIPT --out OUT``) from the repository root; its
CSV and PNG land in ``--out`` (default ``experiments/results/``, whose CSVs are committed), and each script's
seconds in ``OUT/run_all_seconds.csv``. A script that fails does not stop the others, but the run ends with exit
code 1 naming every failed script (and its last output lines). ``experiments/RESULTS.md`` is rendered from the
CSVs by ``experiments/make_results.py``; regenerate the whole record with

    .venv/bin/python experiments/run_all.py && .venv/bin/python experiments/make_results.py   # ~45 min, 2 cores
    .venv/bin/python experiments/run_all.py --only w_table1_lora_fa p_accuracy_at_epsilon     # some scripts
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SECONDS_CSV = "run_all_seconds.csv"  # each script's wall time and the 1-minute load average when it ended
# (script, what it reproduces), in the order RESULTS.md lists them.
SCRIPTS = (
    ("w_table1_lora_fa", "[W] Table 1"),
    ("w_table2_m2", "[W] Table 2"),
    ("w_table3_m1", "[W] Table 3"),
    ("wishart_fig1", "[W] Fig. 1"),
    ("wishart_fig2", "[W] Fig. 2"),
    ("w_fig3_accuracy_vs_epsilon", "[W] Fig. 3"),
    ("mechanism_audit_grid", "theorems vs exact vs audits"),
    ("s_table1_lora_variants", "[S] Table 1, Lemma 7.2"),
    ("s_table1_transformer", "[S] Table 1, text transformer"),
    ("exposure_insertions", "Secret Sharer: exposure vs insertions"),
    ("prism_noise_energy", "[P] Thm 3.1, Figs. 2/3"),
    ("p_accuracy_at_epsilon", "[P] accuracy at ε ∈ {3, 6}"),
    ("prism_lift_accuracy", "[P] adaptive PRISM: lift vs Eq. 24"),
    ("denoise_cosine", "[D] Fig. 2"),
    ("d_denoise_convergence", "[D] convergence at equal ε"),
    ("audit_tightness", "audit tightness"),
    ("prism_leak", "[P] Thm 3.4, adaptive PRISM"),
    ("mutants", "planted bugs"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("experiments/results"), help="output folder of every script")
    parser.add_argument("--only", nargs="+", choices=[name for name, _ in SCRIPTS], help="run these scripts only")
    return parser.parse_args(argv)


def record_seconds(out: Path, timings: list[tuple[str, str, float, str, float]]) -> None:
    """Update ``out/run_all_seconds.csv`` (one row per script, in suite order) with this run's scripts only."""
    path = out / SECONDS_CSV
    rows = {}
    if path.is_file():
        with open(path, newline="") as handle:
            rows = {row["script"]: row for row in csv.DictReader(handle)}
    for name, _, seconds, status, load in timings:
        rows[name] = {"script": name, "seconds": f"{seconds:.1f}", "status": status, "load_average_1min": f"{load:.2f}"}
    out.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["script", "seconds", "status", "load_average_1min"])
        writer.writeheader()
        writer.writerows(rows[name] for name, _ in SCRIPTS if name in rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chosen = [(name, what) for name, what in SCRIPTS if not args.only or name in args.only]
    timings, failures = [], []
    start = time.perf_counter()
    for name, what in chosen:
        print(f"=== {name} ({what})", flush=True)
        began = time.perf_counter()
        process = subprocess.run(
            [sys.executable, str(HERE / f"{name}.py"), "--out", str(args.out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        seconds = time.perf_counter() - began
        print(process.stdout, flush=True)
        status = "ok" if process.returncode == 0 else f"FAILED ({process.returncode})"
        timings.append((name, what, seconds, status, os.getloadavg()[0]))
        if process.returncode:
            failures.append((name, process.stdout.splitlines()[-5:]))
    print(f"\n{'script':<30} {'reproduces':<30} {'seconds':>8}  status")
    for name, what, seconds, status, _ in timings:
        print(f"{name:<30} {what:<30} {seconds:8.1f}  {status}")
    print(f"{'total':<61} {time.perf_counter() - start:8.1f}")
    record_seconds(args.out, timings)
    for name, tail in failures:
        print(f"\nFAILED: {name}\n" + "\n".join(tail), file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())

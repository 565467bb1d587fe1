"""Does the white-box audit catch planted DP bugs (dpaudit.mutants)? Verdict, ε lower bounds, analytic ε, time.

Each setting is a canary campaign of dp-sgd on digits (C = 1, δ = 1e-5) with a Dirac gradient canary observed at
every step (--canary gradient --observe steps, the per-step likelihood-ratio score): one for the mutant, one for the
correct mechanism at the same settings. The Dirac canary sits on a first-layer weight of a pixel that is 0 in every
digit, so real gradients add exactly 0 along it. Printed per run: the audit's verdict (Clopper-Pearson route and
the AUC's lower limit, dpaudit.analysis.verdict), the CP and GDP ε lower bounds (95%), the analytic ε the correct
mechanism claims, and seconds. Where q = 1 the claim is exactly μ-GDP (μ = √T/σ), so the GDP route's μ lower bound
is a valid test of it: printed beside (``μ_lo > μ``). For reused-noise, a second statistic, the spread of a model's
step projections (its std over steps; the reused noise cancels in it), is scored from the same observations.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_mutants.py [--models 4000] [--only half-noise ...]

The settings and the audit are dpaudit.mutant_audit's (experiments/mutants.py runs the same ones).

Measured (2-core CPU shared with other jobs; 2000 + 2000 models unless said; mutant | correct at the same settings):

=====================================  ==========================  ==========================  ========
setting                                mutant: verdict, CP, GDP    correct: verdict, CP, GDP   analytic
=====================================  ==========================  ==========================  ========
half-noise σ=1, q=1, T=1               consistent 3.00, 8.67       (not run at this size)      4.38
  GDP μ lower bound vs claimed μ = 1   1.78 (violates the μ-GDP    0.47 (100 + 100 models,
                                       claim)                      breast-cancer)
skip-noise-every-10 σ=2, q=1, T=1      violated 5.69, 37.0         consistent 0.41, 1.09       1.99
skip-noise-every-10 σ=2, q=1, T=10     inconclusive 1.56, 5.77     inconclusive 1.63, 5.25     7.51
  (200 + 200 models)
no-clipping σ=2, q=1, T=1, ‖g_c‖=10C   violated 5.58, 27.0         consistent 0.41, 1.09       1.99
reused-noise σ=2, q=1/2, T=2           consistent 0.05, 0.13       consistent 0.30, 0.64       1.83
  step-spread statistic: CP ε          4.90 (> 1.83)               0.00
shuffle-as-poisson σ=1, q=1/10, T=10   consistent 0.20, 0.51       consistent 0.28, 0.72       2.86
  (500 + 500 models)
=====================================  ==========================  ==========================  ========

A campaign of 4000 models takes ~60 s at T = 1.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from dpaudit.mutant_audit import SETTINGS, audit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=4000, help="shadow models, half IN (default 4000)")
    parser.add_argument("--only", nargs="*", help="mutants to run (default: all)")
    args = parser.parse_args()
    print(f"dp-sgd on digits, Dirac gradient canary, --observe steps, {args.models // 2} IN + {args.models // 2} OUT")
    for setting in SETTINGS:
        if args.only and setting.mutant not in args.only:
            continue
        print(f"\n{setting.mutant}: σ = {setting.noise}, b = {setting.batch_size}, T = {setting.steps} ({setting.why})")
        with tempfile.TemporaryDirectory() as directory:
            for mutant in (setting.mutant, None):
                row = audit(setting, mutant, args.models, Path(directory))
                claimed_mu = setting.claimed_mu()
                gdp_test = "" if claimed_mu is None else f"  μ_lo {row['mu_lo']:.2f} vs claimed μ {claimed_mu:.2f}"
                spread = "" if row["spread_cp"] is None else f"  spread-statistic CP ε {row['spread_cp']:.2f}"
                print(
                    f"  {row['run']:<20} {row['verdict']:<12} CP ε {row['cp']:.2f}  GDP ε {row['gdp']:.2f}  analytic ε"
                    f" {row['analytic']:.2f}{gdp_test}{spread}  {row['seconds']:.0f} s",
                    flush=True,
                )


if __name__ == "__main__":
    main()

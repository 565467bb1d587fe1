"""The planted DP bugs (mechanisms.catalogue) and the white-box audit's verdict on each, beside the correct mechanism.

For each setting of :data:`dpaudit.studies.mutant_audit.SETTINGS` (dp-sgd on digits, C = 1, δ = 1e-5, a Dirac gradient
canary observed at every step), one campaign with the mutant planted and one of the correct mechanism at the same
settings, ``--models`` models each (half IN): the verdict (dpaudit.analysis.Analysis.verdict) and its reason, the
Clopper-Pearson and GDP ε lower bounds (95%), the analytic ε the correct mechanism claims, the GDP route's μ lower
bound beside the claimed μ = √T/σ where q = 1 (the claim is then exactly μ-GDP), for reused-noise the CP ε of the
step-spread statistic, trial counts and seconds. Writes ``mutants.csv``.

    python experiments/mutants.py            # 1000 + 1000 models per run, ~10 min on 2 cores
"""

from __future__ import annotations

import shutil

import _common

from dpaudit.studies.mutant_audit import SETTINGS, audit

NAME = "mutants"


def main(argv: list[str] | None = None) -> None:
    parser = _common.parser(__doc__)
    parser.set_defaults(models=2000)
    parser.add_argument("--mutants", nargs="+", choices=sorted({s.mutant for s in SETTINGS}), help="these only")
    args = parser.parse_args(argv)
    root = args.out / "runs" / NAME
    rows = []
    for index, setting in enumerate(SETTINGS):
        if args.mutants and setting.mutant not in args.mutants:
            continue
        directory = root / str(index)
        shutil.rmtree(directory, ignore_errors=True)  # always fresh campaigns
        for mutant in (setting.mutant, None):
            row = audit(setting, mutant, args.models, directory, args.workers)
            rows.append(
                {
                    "mutant": setting.mutant,
                    "run": row["run"],
                    "noise": setting.noise,
                    "batch_size": setting.batch_size,
                    "steps": setting.steps,
                    "canary_norm": setting.canary_norm,
                    "setting": setting.why,
                    "models": args.models,
                    "n_in": row["n_in"],
                    "n_out": row["n_out"],
                    "verdict": row["verdict"],
                    "verdict_reason": row["verdict_reason"],
                    "epsilon_cp": row["cp"],
                    "epsilon_gdp": row["gdp"],
                    "analytic_epsilon": row["analytic"],
                    "mu_lower": row["mu_lo"],
                    "claimed_mu": setting.claimed_mu(),
                    "spread_epsilon_cp": row["spread_cp"],
                    "seconds": row["seconds"],
                }
            )
            print(
                f"{setting.mutant:<20} T={setting.steps:<3} {row['run']:<20} {row['verdict']:<12} CP {row['cp']:.2f}"
                f" GDP {row['gdp']:.2f} analytic {row['analytic']:.2f}  {row['seconds']:.0f} s",
                flush=True,
            )
    _common.write_table(rows, args.out, NAME)


if __name__ == "__main__":
    main()

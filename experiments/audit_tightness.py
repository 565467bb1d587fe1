"""Audit tightness by mechanism and threat model: analytic ε against the CP, GDP and one-run empirical ε.

Every cell is one campaign on digits' MLP at the same privacy parameters: full batch (b = N = 718, q = 1; with the
input canary N = 719, q = 718/719 and half the epochs), σ = 2, C = 1, ``--epochs`` steps (T = 4 by default), δ =
1e-5, so DP-SGD's analytic ε is the μ-GDP one at μ = √T/σ = 1 (4.38); each mechanism's analytic ε is its own
accountant's (``dpaudit.mechanisms.bounds``: DP-SGD's PLD for dp-sgd, dp-lora, dp-lora-fa and prism ([P] Thm 3.4),
[W] Thm 5 + App. F.2 for m2 with its projection resampled every step; beside it, ``analytic_epsilon_mixture``,
dpaudit's tighter mixture bound for m2 at q = 1, docs/theory.md §2.7). Mechanisms: dp-sgd (full weights), dp-lora
and dp-lora-fa (rank 8), m2 (rank 8, ``--resample-projection``), prism (rank 8, the campaign's PRISM: adaptive, [P]
Eq. 24). Threat models (docs/theory.md §3.9):

* ``black-box``: the input canary ([W] App. F.1's static poison), the auditor sees the models' outputs;
* ``weights``: a Dirac gradient canary, the auditor sees the final weights (``--observe weights``), trained at a
  constant learning rate without momentum (the other cells: the campaign's cosine schedule, momentum 0.9);
  for prism the canary is ``--canary-direction tangent`` (``--prism-canary-direction``; a Dirac has only ≈ 0.42
  of its norm in PRISM's tangent space, docs/theory.md §3.9);
* ``steps``: the same canary, the auditor sees every step's update (``--observe steps``);
* ``one-run``: M orthogonal Dirac gradient canaries in each of a few models (``--design one-run``), every step seen.

Empirical ε at 95%: Clopper-Pearson and GDP routes (attacks.epsilon) over IN/OUT models for the first three, the
pooled one-run bounds (Steinke et al. and f-DP) for the last. ``tightness_*`` = empirical / analytic. ``verdict``:
dpaudit.analysis.Analysis.verdict (the CP bound, or the pooled one-run bound, against the analytic claim). Any
empirical ε above the analytic one is a finding. Adaptive against non-adaptive PRISM is experiments/prism_leak.py's
table (the campaign cannot switch PRISM's adaptive rule off). Writes ``audit_tightness.csv``.

    python experiments/audit_tightness.py   # 500 + 500 models a cell, M = 1000 canaries × 8 runs; ~15 min, 2 cores
    python experiments/audit_tightness.py --threat-models weights --merge   # re-run one threat model's cells
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path

import _common

from accountants import wishart
from dpaudit import analysis
from dpaudit.campaign import runner
from dpaudit.config import CampaignConfig, Execution
from dpaudit.errors import UsageError
from dpaudit.reporting import summary as run_summary

NAME = "audit_tightness"
FULL_BATCH = 718  # digits' private split: b = N, q = 1
NOISE = 2.0
RANK = 8
MECHANISMS: dict[str, dict] = {
    "dp-sgd": {},
    "dp-lora": {"rank": RANK},
    "dp-lora-fa": {"rank": RANK},
    "m2": {"rank": RANK, "resample_projection": True},
    "prism": {"rank": RANK},
}
THREAT_MODELS: dict[str, dict] = {
    "black-box": {"canary": "input", "observe": "outputs", "design": "canary"},
    # A constant learning rate and no momentum weight the T steps equally in the final weights, so the weights and
    # steps cells differ only in what the auditor sees (under the default cosine schedule with momentum 0.9 the
    # steps weigh unequally and "weights vs steps" would measure the optimiser too).
    "weights": {
        "canary": "gradient",
        "observe": "weights",
        "design": "canary",
        "schedule": "constant",
        "momentum": 0.0,
    },
    "steps": {"canary": "gradient", "observe": "steps", "design": "canary"},
    "one-run": {"canary": "gradient", "observe": "steps", "design": "one-run"},
}
# Threat models with one gradient canary, whose direction a mechanism may choose (one-run needs orthogonal Diracs).
SINGLE_GRADIENT_CANARY = ("weights", "steps")


def ratio(value: float | None, analytic: float | None) -> float | None:
    """``value / analytic`` where both are finite and the analytic ε positive; None otherwise."""
    if value is None or analytic is None or not 0 < analytic < float("inf"):
        return None
    return value / analytic


def mixture_epsilon(config: CampaignConfig, steps: int, layer_shapes) -> float | None:
    """m2's mixture bound at the cell's settings (``accountants.wishart.m2_mixture_multistep_epsilon``); None at q < 1.

    ``layer_shapes``: the plan's (d_out, d_in, example rank) per adapted layer; the bound needs full batches (the
    input canary's q = 718/719 has no mixture bound here) and rank-1 example changes (Linear layers).
    """
    if config.mechanism != "m2" or config.canary == "input":
        return None
    if any(int(rank) != 1 for _, _, rank in layer_shapes):
        raise UsageError("the M2 mixture bound here needs Linear layers (rank-1 example changes); use an MLP model")
    dims = [int(d_in) for _, d_in, _ in layer_shapes]
    return wishart.m2_mixture_multistep_epsilon(config.delta, 1.0, config.noise, dims, config.rank, steps).epsilon


def cell(mechanism: str, threat: str, args, root: Path) -> dict:
    """One campaign of ``mechanism`` under ``threat``; its row of the table."""
    one_run, black_box = threat == "one-run", threat == "black-box"
    # The input canary is one more member (N + 1 = 719) and b <= N: at b = 718 an epoch is 2 steps at q = 718/719,
    # so half the epochs give the gradient canaries' T steps.
    epochs = max(1, args.epochs // 2) if black_box else args.epochs
    row = {"mechanism": mechanism, "threat_model": threat, **THREAT_MODELS[threat]}
    direction = args.prism_canary_direction if mechanism == "prism" and threat in SINGLE_GRADIENT_CANARY else None
    try:
        config = CampaignConfig(
            mechanism=mechanism,
            models=args.one_run_models if one_run else args.models,
            epochs=epochs,
            batch_size=FULL_BATCH,
            noise=NOISE,
            clip=1.0,
            seed=args.seed,
            canaries=args.canaries if one_run else None,
            canary_direction=direction,
            **MECHANISMS[mechanism],
            **THREAT_MODELS[threat],
        )
    except UsageError as refusal:  # a threat model the mechanism does not support yet: a row that says why
        return {**row, "verdict": "not run", "verdict_reason": str(refusal)}
    run_dir = root / "runs" / f"{NAME}-{mechanism}-{threat}"
    shutil.rmtree(run_dir, ignore_errors=True)
    start = time.perf_counter()
    store = runner.run(config, Execution(device="cpu", workers=args.workers, progress=False), run_dir)
    numbers = run_summary.summary(analysis.analyse(store))
    analytic = numbers["analytic_epsilon"]
    steps = epochs * math.ceil((FULL_BATCH + black_box) / FULL_BATCH)
    row.update(
        {
            "models": config.models,
            "canaries": config.canaries,
            "canary_direction": config.canary_direction,
            "n_in": numbers["n_in"],
            "n_out": numbers["n_out"],
            "steps": steps,
            "noise": NOISE,
            "rank": config.rank,
            "lr": config.lr,
            "schedule": config.schedule,
            "momentum": config.momentum,
            "delta": config.delta,
            "analytic_epsilon": analytic,
            "analytic_epsilon_mixture": mixture_epsilon(config, steps, store.plan().layer_shapes),
            "auc": numbers["auc"],
            "auc_ci_low": numbers["auc_ci95"][0],
            "auc_ci_high": numbers["auc_ci95"][1],
            "epsilon_cp": numbers["epsilon_lower_bound"],
            "epsilon_gdp": numbers["epsilon_lower_bound_gdp"],
            "epsilon_one_run": numbers.get("epsilon_lower_bound_one_run"),
            "epsilon_one_run_fdp": numbers.get("epsilon_lower_bound_one_run_fdp"),
        }
    )
    row.update(
        tightness_cp=ratio(row["epsilon_cp"], analytic),
        tightness_gdp=ratio(row["epsilon_gdp"], analytic),
        tightness_one_run=ratio(row["epsilon_one_run"], analytic),
        tightness_one_run_fdp=ratio(row["epsilon_one_run_fdp"], analytic),
        verdict=numbers["verdict"],
        verdict_reason=numbers["verdict_reason"],
        test_accuracy=numbers["test_accuracy"],
        seconds=time.perf_counter() - start,
    )
    return row


def main(argv: list[str] | None = None) -> None:
    parser = _common.parser(__doc__)
    parser.set_defaults(models=1000, epochs=4)
    parser.add_argument("--one-run-models", type=int, default=8, help="models of each one-run cell")
    parser.add_argument("--canaries", type=int, default=1000, help="M, the canaries of each one-run model")
    parser.add_argument(
        "--prism-canary-direction",
        choices=("tangent", "dirac"),
        default="tangent",
        help="the gradient canary of prism's weights and steps cells (the others: dirac)",
    )
    parser.add_argument("--mechanisms", nargs="+", choices=list(MECHANISMS), default=list(MECHANISMS))
    parser.add_argument("--threat-models", nargs="+", choices=list(THREAT_MODELS), default=list(THREAT_MODELS))
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the CSV's rows of other (mechanism, threat model) cells instead of writing these cells alone",
    )
    args = parser.parse_args(argv)
    rows = []
    for mechanism in args.mechanisms:
        for threat in args.threat_models:
            rows.append(cell(mechanism, threat, args, args.out))
            shown = ("analytic_epsilon", "epsilon_cp", "epsilon_gdp", "epsilon_one_run", "verdict", "seconds")
            print(mechanism, threat, *(f"{key} {rows[-1].get(key)}" for key in shown), flush=True)
    if args.merge:
        mechanisms, threats = list(MECHANISMS), list(THREAT_MODELS)
        rows = _common.merged_rows(
            rows,
            args.out / f"{NAME}.csv",
            keys=("mechanism", "threat_model"),
            order=lambda row: (mechanisms.index(row["mechanism"]), threats.index(row["threat_model"])),
        )
    _common.write_table(rows, args.out, NAME)


if __name__ == "__main__":
    main()

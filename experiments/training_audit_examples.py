"""The example trainers of examples/ audited as black boxes: planted DP-SGD bugs, the dataset-size leak, opacus.

Both example trainers report their steps (``on_step``), so every audit reads the returned model and every step
(docs/training-audit.md §3): nine statistics, Bonferroni over them. Four groups of configurations, each one
``dpaudit.audit_training`` run (half of ``--trials`` calls IN, half OUT; the canary, trial seeds and IN/OUT
assignment from ``--seed``), on the first n rows of sklearn's digits scaled by 1/16, the model
``examples.models.mlp(hidden=32)`` built after ``torch.manual_seed(0)``, SGD with C = 1, 2 epochs, lr 0.5, δ = 1e-5:

* ``handwritten``: examples.dpsgd_handwritten.DpSgdTrainer at n = 95, b = 10, σ = 1.5 (claimed ε ≈ 1.8), without a
  bug and with each of its five planted bugs, add-remove. n = 95 keeps T = 2·⌈n/b⌉ the same on D (96 rows) and D′
  (95), so the step count does not leak the canary's presence;
* ``small-n``: the correct trainer and the realised-batch-size bug at n = 3, b = 2 (T = 4 on 4 rows and on 3), where
  a batch of all four rows of D is larger than any batch of D′ can be;
* ``dataset-size``: the correct trainer at n = 100, where D (101 rows) takes 22 steps and D′ 20: the number of steps
  reveals whether the canary was added (add-remove); beside it the same at replace-one, where both have 100 rows;
* ``opacus``: examples.opacus_trainer at σ = 0.5, at (n, b) = (8, 2) (the step count and opacus's divisor
  int(n·q) differ between 9 and 8 rows), (10, 3) (they do not) and (95, 10), each at add-remove and replace-one;
  with opacus's own ε (PRV and RDP accountants) for the claimed history.

The claim is the trainer's own ``claim(len(D))``: the facts (σ, q, T) the code reports when it trains on D, the
dataset with the canary, whose privacy the audit asks about (n + 1 rows at add-remove, n at replace-one). At
add-remove it is the stricter of claim(n + 1) and claim(n) (q = b/(n + 1) < b/n, at least as many steps); n = 95
makes the two differ by 0.02 in ε. The audit judges it as the add/remove profile it is (dpaudit's claims carry no
relation); ``claimed_epsilon_replace_one`` is the same (σ, q, T) accounted for replace-one neighbours, the guarantee
a replace-one audit's IN/OUT pair actually has.

Per configuration: the verdict, the statistic it names, Clopper-Pearson and GDP ε lower bounds (95% over the nine
statistics), the claimed ε, the largest AUC the claim allows, per statistic its AUC with the lower limit of its
interval and its own CP ε bound, the step counts on D and D′, wall seconds. Run directories go under ``--runs``
(default: a folder in the system's temporary directory), the CSV to ``--out``/training_audit_examples.csv.

    python experiments/training_audit_examples.py --trials 500           # every configuration, ~25 min on 2 cores

The committed CSV (the load of other jobs in the seconds):

    python experiments/training_audit_examples.py --trials 2000 --only handwritten-no-bug \
        handwritten-shuffle-as-poisson small-n3-no-bug small-n3-realised-batch-size                  # ~10 min
    python experiments/training_audit_examples.py --trials 4000 --merge --only handwritten-half-noise  # ~6 min
    python experiments/training_audit_examples.py --trials 1000 --merge --only handwritten-no-clipping \
        handwritten-reused-noise handwritten-realised-batch-size                                      # ~5 min
    python experiments/training_audit_examples.py --trials 500 --merge --only size-n100-add-remove \
        size-n100-replace-one opacus-n8-b2-add-remove opacus-n8-b2-replace-one opacus-n10-b3-add-remove \
        opacus-n10-b3-replace-one opacus-n95-b10-add-remove opacus-n95-b10-replace-one                # ~11 min
"""

from __future__ import annotations

import math
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# This checkout's dpaudit and examples/ (not an installed package), ahead of any installed dpaudit: the main process
# and the audit's worker processes then run the same code.
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import dpaudit  # noqa: E402
from accountants import dpsgd  # noqa: E402
from attacks import epsilon as epsilon_lib  # noqa: E402
from dpaudit.analysis import CONFIDENCE  # noqa: E402
from dpaudit.config import Execution  # noqa: E402
from dpaudit.training_audit.observe import STATISTICS, STEP_STATISTICS  # noqa: E402
from examples.dpsgd_handwritten import BUGS, DpSgdTrainer  # noqa: E402
from examples.models import mlp  # noqa: E402

NAME = "training_audit_examples"
ALL_STATISTICS = (*STATISTICS, *STEP_STATISTICS)  # both example trainers report their steps (on_step)
DELTA = 1e-5
CLIP, EPOCHS, LR, HIDDEN = 1.0, 2, 0.5, 32


@dataclass(frozen=True)
class Config:
    """One audited configuration."""

    name: str
    group: str
    trainer: str  # handwritten | opacus
    n: int
    batch_size: int
    sigma: float
    neighbours: str
    bug: str | None = None

    def build(self):
        if self.trainer == "handwritten":
            return DpSgdTrainer(self.sigma, CLIP, self.batch_size, EPOCHS, LR, bug=self.bug)
        from examples.opacus_trainer import make_trainer  # opacus is imported only when a configuration needs it

        return make_trainer(self.sigma, CLIP, self.batch_size, EPOCHS, LR)

    @property
    def rows_with_canary(self) -> int:
        """len(D): n + 1 at add-remove, n at replace-one."""
        return self.n + 1 if self.neighbours == "add-remove" else self.n


CONFIGS = (
    Config("handwritten-no-bug", "handwritten", "handwritten", 95, 10, 1.5, "add-remove"),
    *(Config(f"handwritten-{bug}", "handwritten", "handwritten", 95, 10, 1.5, "add-remove", bug) for bug in BUGS),
    Config("small-n3-no-bug", "small-n", "handwritten", 3, 2, 1.5, "add-remove"),
    Config("small-n3-realised-batch-size", "small-n", "handwritten", 3, 2, 1.5, "add-remove", "realised-batch-size"),
    Config("size-n100-add-remove", "dataset-size", "handwritten", 100, 10, 1.5, "add-remove"),
    Config("size-n100-replace-one", "dataset-size", "handwritten", 100, 10, 1.5, "replace-one"),
    *(
        Config(f"opacus-n{n}-b{b}-{relation}", "opacus", "opacus", n, b, 0.5, relation)
        for n, b in ((8, 2), (10, 3), (95, 10))
        for relation in ("add-remove", "replace-one")
    ),
)


def digits(n: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    loaded = load_digits()
    return (loaded.data[:n] / 16).astype(np.float32), loaded.target[:n].astype(np.int64)


def named_statistic(reason: str) -> str:
    """The statistic a verdict's reason names (``"update-norm: ..."``), else ''."""
    found = re.match(r"([a-z-]+): ", reason)
    return found.group(1) if found and found.group(1) in ALL_STATISTICS else ""


def timed_audit(model, trainer, data, claim, directory: Path, trials: int, seed: int, workers: int, **settings):
    """``dpaudit.audit_training`` of the claimed (σ, q, T) into the fresh ``directory``; the result and its seconds."""
    shutil.rmtree(directory, ignore_errors=True)  # always a fresh audit: its numbers and its seconds
    sigma, q, steps = claim
    started = time.perf_counter()
    result = dpaudit.audit_training(
        model,
        trainer,
        data,
        claim={"noise": sigma, "sample_rate": q, "steps": steps},
        out=directory,
        trials=trials,
        seed=seed,
        delta=DELTA,
        execution=Execution(workers=workers, progress=False),
        **settings,
    )
    return result, time.perf_counter() - started


def verdict_numbers(result) -> dict:
    """The columns every many-run training audit reports: IN and OUT trials, the verdict, the ε bounds, the claim."""
    member = result.membership
    return {
        "n_in": int(member.sum()),
        "n_out": int((~member).sum()),
        "verdict": result.verdict.outcome,
        "verdict_statistic": named_statistic(result.verdict.reason),
        "epsilon_cp": result.bound.epsilon,
        "epsilon_gdp": result.gdp_bound.epsilon,
        "claimed_epsilon": result.analytic.epsilon,
        "max_allowed_auc": result.verdict.max_allowed_auc,
    }


def audit(config: Config, trials: int, runs: Path, seed: int, workers: int) -> dict:
    """One audit of ``config`` into the fresh directory ``runs/NAME-TRIALS``; its CSV row."""
    x, y = digits(config.n)
    torch.manual_seed(0)
    model = mlp(x.shape[1:], 10, hidden=HIDDEN)
    trainer = config.build()
    sigma, q, steps = trainer.claim(config.rows_with_canary)
    result, seconds = timed_audit(
        model,
        trainer,
        (x, y),
        (sigma, q, steps),
        runs / f"{config.name}-{trials}",
        trials,
        seed,
        workers,
        neighbours=config.neighbours,
    )
    level = 1 - (1 - CONFIDENCE) / len(result.statistics)  # each statistic's share of the 95% (Bonferroni)
    member = result.membership
    row = {
        "config": config.name,
        "group": config.group,
        "trainer": config.trainer,
        "bug": config.bug or "",
        "neighbours": config.neighbours,
        "n": config.n,
        "batch_size": config.batch_size,
        "epochs": EPOCHS,
        "lr": LR,
        "clip": CLIP,
        "sigma": config.sigma,
        "claim_rows": config.rows_with_canary,
        "claim_q": q,
        "claim_steps": steps,
        "steps_in": trainer.claim(config.rows_with_canary)[2],
        "steps_out": trainer.claim(config.n)[2],
        "trials": trials,
        **verdict_numbers(result),
        "claimed_epsilon_replace_one": dpsgd.epsilon(sigma, q, steps, DELTA, neighbouring="replace-one").epsilon,
    }
    for name in ALL_STATISTICS:
        scores, metrics = result.statistics[name], result.statistic_metrics[name]
        row[f"auc_{name}"] = metrics.auc
        row[f"auc_low_{name}"] = metrics.auc_ci[0]
        bound = epsilon_lib.clopper_pearson_epsilon(scores[member], scores[~member], DELTA, confidence=level)
        row[f"epsilon_cp_{name}"] = bound.epsilon
    if config.trainer == "opacus":
        for accountant in ("prv", "rdp"):
            row[f"opacus_epsilon_{accountant}"] = trainer.opacus_epsilon(config.rows_with_canary, DELTA, accountant)
    else:
        row["opacus_epsilon_prv"] = row["opacus_epsilon_rdp"] = math.nan
    row["verdict_reason"] = result.verdict.reason
    row["seconds"] = seconds
    return row


def main(argv: list[str] | None = None) -> None:
    parser = _common.parser(__doc__)
    parser.add_argument("--trials", type=int, default=500, help="trials per configuration (even; half IN)")
    parser.add_argument("--only", nargs="+", choices=[c.name for c in CONFIGS], help="these configurations only")
    parser.add_argument(
        "--runs",
        type=Path,
        default=Path(tempfile.gettempdir()) / NAME,
        help="folder of the run directories (default: in the system's temporary directory, not the repository)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the CSV's rows of other (configuration, trials) pairs instead of writing these rows alone",
    )
    args = parser.parse_args(argv)
    rows = []
    for config in CONFIGS:
        if args.only and config.name not in args.only:
            continue
        row = audit(config, args.trials, args.runs, args.seed, args.workers)
        rows.append(row)
        aucs = " ".join(f"{row['auc_' + name]:.2f}" for name in ALL_STATISTICS)
        print(
            f"{config.name:<34} {row['verdict']:<12} {row['verdict_statistic']:<18} CP {row['epsilon_cp']:.2f}"
            f" GDP {row['epsilon_gdp']:.2f} claim {row['claimed_epsilon']:.2f}"
            f"  AUC {aucs}  {row['seconds']:.0f} s",
            flush=True,
        )
    if args.merge:
        order = {c.name: i for i, c in enumerate(CONFIGS)}
        rows = _common.merged_rows(
            rows,
            args.out / f"{NAME}.csv",
            keys=("config", "trials"),
            order=lambda row: (order[row["config"]], row["trials"]),
        )
    _common.write_table(rows, args.out, NAME)


if __name__ == "__main__":
    main()

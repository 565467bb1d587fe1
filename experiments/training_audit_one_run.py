"""The one-run design on the hand-written DP-SGD: one training call, M = 1000 canaries, with and without the bug.

Steinke, Nasr, Jagielski 2023: one call of ``examples.dpsgd_handwritten.DpSgdTrainer`` on all 1797 digits (scaled
by 1/16) plus each of M canaries with probability ½ (add-remove), ``examples.models.mlp(hidden=32)`` built after
``torch.manual_seed(0)``, C = 1, lr 0.5, δ = 1e-5, expected batch b = 23 and 20 epochs (q ≈ 0.01, T = 2020): small
batches over many epochs, so that each canary moves the model it is trained into (at b = 230 and 2 epochs, q ≈ 0.1,
T = 22, the guesses were at chance, 491 to 503 of 1000 right, even at σ = 0.25). The claim
is the trainer's own ``claim(len(D))`` for the dataset it actually trained on; b is chosen so that D and D minus
one canary take the same number of steps. The canaries are dpaudit's (inputs in the data's per-feature scale,
labelled with the starting model's least likely class), each scored by canary-loss, logit-margin and
gradient-alignment of the returned model (steps are observed with one canary only, so not here); the bounds are
Steinke et al.'s (ε, δ) and the f-DP one, 95% over the three statistics.

Per (σ, bug): the claimed ε, both bounds with the statistic that gave the larger Steinke bound, its correct guesses
out of its guesses, the ceiling (the Steinke bound of a statistic that guesses every canary right, at the same
level: the most this M can show), the verdict, wall seconds.

    python experiments/training_audit_one_run.py     # σ = 1.5, 1.0, 0.5, no bug and half-noise: ~7 min on 2 cores
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's dpaudit and examples/

import _common  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import dpaudit  # noqa: E402
from attacks import one_run  # noqa: E402
from dpaudit.analysis import CONFIDENCE  # noqa: E402
from dpaudit.config import Execution  # noqa: E402
from dpaudit.training_audit.runner import AuditSettings  # noqa: E402
from examples.dpsgd_handwritten import DpSgdTrainer  # noqa: E402
from examples.models import mlp  # noqa: E402

NAME = "training_audit_one_run"
DELTA, CANARIES, CLIP, LR = 1e-5, 1000, 1.0, 0.5


def audit(sigma: float, bug: str | None, batch: int, epochs: int, runs: Path, seed: int) -> dict:
    """One one-run audit; its CSV row."""
    from sklearn.datasets import load_digits

    loaded = load_digits()
    x, y = (loaded.data / 16).astype(np.float32), loaded.target.astype(np.int64)
    torch.manual_seed(0)
    model = mlp(x.shape[1:], 10, hidden=32)
    trainer = DpSgdTrainer(sigma, CLIP, batch, epochs, LR, bug=bug)
    members = int(AuditSettings(trials=1, design="one-run", canaries=CANARIES, seed=seed).membership().sum())
    rows = len(x) + members
    noise, q, steps = trainer.claim(rows)
    if trainer.claim(rows - 1)[2] != steps:
        raise SystemExit(f"b = {batch} makes D ({rows} rows) and D minus a canary take different step counts")
    directory = runs / f"sigma{sigma}-b{batch}-e{epochs}-{bug or 'no-bug'}"
    shutil.rmtree(directory, ignore_errors=True)
    started = time.perf_counter()
    result = dpaudit.audit_training(
        model,
        trainer,
        (x, y),
        claim={"noise": noise, "sample_rate": q, "steps": steps},
        out=directory,
        trials=1,
        design="one-run",
        canaries=CANARIES,
        seed=seed,
        delta=DELTA,
        execution=Execution(workers=1, progress=False),
    )
    seconds = time.perf_counter() - started
    level = 1 - (1 - CONFIDENCE) / len(result.statistics)
    member = result.membership.ravel()
    perfect = one_run.one_run_epsilon(member.astype(float), member, DELTA, level)
    found = result.one_run
    assert found is not None and found.pooled is not None, "a one-run audit's canaries are within its δ"
    return {
        "sigma": sigma,
        "bug": bug or "",
        "batch_size": batch,
        "epochs": epochs,
        "n": len(x),
        "canaries": CANARIES,
        "canaries_in": members,
        "claim_q": q,
        "claim_steps": steps,
        "claimed_epsilon": result.analytic.epsilon,
        "statistic": found.statistic,
        "epsilon_steinke": found.pooled.epsilon,
        "epsilon_fdp": found.pooled_fdp.epsilon,
        "guesses": found.pooled.guess_count,
        "correct_guesses": found.pooled.correct_guesses,
        "ceiling_steinke": perfect.epsilon,
        "verdict": result.verdict.outcome,
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> None:
    parser = _common.parser(__doc__)
    parser.add_argument("--sigmas", type=float, nargs="+", default=[1.5, 1.0, 0.5], help="noise multipliers")
    parser.add_argument("--batch", type=int, default=23, help="expected batch size b")
    parser.add_argument("--runs", type=Path, default=Path(tempfile.gettempdir()) / NAME, help="run directories")
    args = parser.parse_args(argv)
    rows = []
    for sigma in args.sigmas:
        for bug in (None, "half-noise"):
            rows.append(audit(sigma, bug, args.batch, args.epochs or 20, args.runs, args.seed))
            print(rows[-1], flush=True)
    _common.write_table(rows, args.out, NAME)


if __name__ == "__main__":
    main()

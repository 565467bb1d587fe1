"""The one-run design on the hand-written DP-SGD: one training call, M = 1000 canaries, with and without the bug.

Steinke, Nasr, Jagielski 2023: one call of ``examples.dpsgd_handwritten.DpSgdTrainer`` on all 1797 digits (scaled
by 1/16) plus each of M canaries with probability ½ (add-remove), C = 1, lr 0.5, δ = 1e-5, expected batch b = 23
and 20 epochs (q ≈ 0.01, T = 2020): small batches over many epochs, so that each canary moves the model it is
trained into (at b = 230 and 2 epochs, q ≈ 0.1, T = 22, the guesses were at chance, 491 to 503 of 1000 right, even
at σ = 0.25). The claim is the trainer's own ``claim(len(D))`` for the dataset it actually trained on; b is chosen
so that D and D minus one canary take the same number of steps. The canaries are dpaudit's (inputs in the data's
per-feature scale, scale 1 where the data has none, labelled with the starting model's least likely class).

Two observations (``--observe``):

* ``final`` (→ training_audit_one_run.csv): the returned model only (the trainer is wrapped so that it does not
  report its steps); ``examples.models.mlp(hidden=32)`` built after ``torch.manual_seed(0)``; each canary scored by
  canary-loss, logit-margin and gradient-alignment.
* ``steps`` (→ training_audit_one_run_steps.csv): every step (``on_step``), Steinke et al.'s white-box one-run
  audit; each canary also scored by its own step-alignment and step-likelihood. The model is softmax regression
  (``nn.Linear``) on the digits plus 1024 features the data leaves at 0 (as a bag-of-words vocabulary larger than
  its corpus): there each canary's gradient is nearly its own (random inputs in 1024 dimensions are nearly
  orthogonal), as a Dirac canary's is, so the other canaries and the data hardly move its projection.

Bounds: Steinke et al.'s (ε, δ) and the f-DP one, 95% over all the statistics (Bonferroni). Per (σ, bug): the
claimed ε, both bounds with the statistic that gave the larger Steinke bound, its correct guesses out of its
guesses, two ceilings, the verdict and wall seconds. ``ceiling_steinke``: the bound of a statistic that guesses
every canary right (the most M canaries can show). ``ideal_steinke``: the mean over 5 simulations of the bound of
the most powerful all-steps adversary on the mechanism as trained (the true σ, halved by the bug), with Dirac
canaries each observed alone: per canary and step z = B/σ + N(0, 1), B ~ Bernoulli(q) for a member, scored by the
likelihood ratio at the true σ, the design's membership — the most this design can show of this mechanism.

    python experiments/training_audit_one_run.py                  # final: σ = 1.5, 1.0, 0.5 × bug: ~7 min, 2 cores
    python experiments/training_audit_one_run.py --observe steps  # steps: ~4 min per row
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's dpaudit and examples/

import _common  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import dpaudit  # noqa: E402
from attacks import one_run  # noqa: E402
from dpaudit.analysis import CONFIDENCE  # noqa: E402
from dpaudit.config import Execution  # noqa: E402
from dpaudit.training_audit.runner import AuditSettings  # noqa: E402
from examples.dpsgd_handwritten import DpSgdTrainer  # noqa: E402
from examples.models import mlp  # noqa: E402

NAME = "training_audit_one_run"
DELTA, CANARIES, CLIP, LR = 1e-5, 1000, 1.0, 0.5
UNUSED_FEATURES = 1024  # --observe steps: features the data leaves at 0
SIMULATIONS = 5  # of the ideal adversary


@dataclass(frozen=True)
class FinalModelOnly:
    """The trainer without its ``on_step``: the audit observes the returned model only."""

    trainer: DpSgdTrainer

    def __call__(self, model: nn.Module, x: np.ndarray, y: np.ndarray, seed: int) -> nn.Module:
        return self.trainer(model, x, y, seed)


def ideal_bound(sigma: float, q: float, steps: int, member: np.ndarray, level: float, seed: int) -> float:
    """The mean Steinke bound of the most powerful all-steps adversary with Dirac canaries (module docstring)."""
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(SIMULATIONS):
        z = (rng.random((len(member), steps)) < q) * member[:, None] / sigma + rng.standard_normal((len(member), steps))
        scores = np.logaddexp(np.log1p(-q), np.log(q) + z / sigma - 0.5 / sigma**2).sum(axis=1)
        found.append(one_run.one_run_epsilon(scores, member, DELTA, level).epsilon)
    return float(np.mean(found))


def audit(sigma: float, bug: str | None, batch: int, epochs: int, observe: str, runs: Path, seed: int) -> dict:
    """One one-run audit; its CSV row."""
    from sklearn.datasets import load_digits

    loaded = load_digits()
    x, y = (loaded.data / 16).astype(np.float32), loaded.target.astype(np.int64)
    torch.manual_seed(0)
    trainer = DpSgdTrainer(sigma, CLIP, batch, epochs, LR, bug=bug)
    if observe == "steps":
        x = np.concatenate([x, np.zeros((len(x), UNUSED_FEATURES), dtype=np.float32)], axis=1)
        model, train = nn.Linear(x.shape[1], 10), trainer
    else:
        model, train = mlp(x.shape[1:], 10, hidden=32), FinalModelOnly(trainer)
    members = int(AuditSettings(trials=1, design="one-run", canaries=CANARIES, seed=seed).membership().sum())
    rows = len(x) + members
    noise, q, steps = trainer.claim(rows)
    if trainer.claim(rows - 1)[2] != steps:
        raise SystemExit(f"b = {batch} makes D ({rows} rows) and D minus a canary take different step counts")
    directory = runs / f"{observe}-sigma{sigma}-b{batch}-e{epochs}-{bug or 'no-bug'}"
    shutil.rmtree(directory, ignore_errors=True)
    started = time.perf_counter()
    result = dpaudit.audit_training(
        model,
        train,
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
    true_sigma = sigma / 2 if bug == "half-noise" else sigma
    return {
        "observe": observe,
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
        "ideal_steinke": ideal_bound(true_sigma, q, steps, member, level, seed),
        "verdict": result.verdict.outcome,
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> None:
    parser = _common.parser(__doc__)
    parser.add_argument("--sigmas", type=float, nargs="+", default=[1.5, 1.0, 0.5], help="noise multipliers")
    parser.add_argument("--batch", type=int, default=23, help="expected batch size b")
    parser.add_argument("--observe", choices=("final", "steps"), default="final", help="what the audit observes")
    parser.add_argument("--runs", type=Path, default=Path(tempfile.gettempdir()) / NAME, help="run directories")
    args = parser.parse_args(argv)
    rows = []
    for sigma in args.sigmas:
        for bug in (None, "half-noise"):
            rows.append(audit(sigma, bug, args.batch, args.epochs or 20, args.observe, args.runs, args.seed))
            print(rows[-1], flush=True)
    _common.write_table(rows, args.out, NAME if args.observe == "final" else f"{NAME}_steps")


if __name__ == "__main__":
    main()

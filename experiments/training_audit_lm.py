"""Hugging Face causal LMs with peft LoRA audited as black boxes: GPT-2 and Llama, noise-free and DP-SGD.

Four configurations, each one ``dpaudit.audit_training`` run of the many-run design (half of ``--trials`` calls IN,
half OUT, add-remove; the canary, a window of random bytes, the trial seeds and the IN/OUT assignment from
``--seed``), of examples/hf_lora.py:

* the models: ``gpt2_lora`` (a tiny GPT2LMHeadModel: 2 blocks of width 64, LoRA of rank 4 on its Conv1D
  ``c_attn``) and ``llama_lora`` (a tiny LlamaForCausalLM: 2 blocks of width 64, LoRA of rank 4 on ``q_proj`` and
  ``v_proj``), built from configs with random weights (no download), vocabulary 256 (bytes), context L;
* the data: the first N windows of the corpus of ``dpaudit audit-training --dataset text`` (the embedded Python
  documentation) cut at length L (:func:`dpaudit.data.text.training_windows`);
* the trainers: ``hf_lora.noise_free``, plain LoRA fine-tuning with AdamW (the positive control: the canary must
  show), and ``hf_lora.dp_sgd``, hand-written DP-SGD on the LoRA parameters at σ = 3, C = 1; both E = 12 epochs of
  batches of b = 8 (the expected batch size for DP-SGD), AdamW at lr 0.02.

The claim is the DP trainer's own ``claim(N + 1)``, (σ, b / (N + 1), E·⌈(N + 1) / b⌉), for both: the noise-free
trainer makes the same claim without its noise, so its audit should find the claim violated. L = 32 and N = 63
windows, so D (64 windows) and D′ (63) take the same number of steps, and the step count does not reveal the canary.

Per configuration: AUC of every statistic with its 95% interval, the verdict and the statistic it names,
Clopper-Pearson and GDP ε lower bounds (95% over the four statistics), the claimed ε and the largest AUC it
allows, the perplexity on the N windows of the starting model and of one model trained on D′ (seed 0; utility,
outside the audit's time), and the audit's wall seconds (``--workers`` processes, the determinism check included).
Run directories go under ``--runs`` (default: a folder in the system's temporary directory), the CSV to
``--out``/training_audit_lm.csv.

    python experiments/training_audit_lm.py --trials 128 --workers 2      # the four configurations
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

# This checkout's dpaudit and examples/ (not an installed package), ahead of any installed dpaudit: the main process
# and the audit's worker processes then run the same code.
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402
import numpy as np  # noqa: E402
from training_audit_examples import timed_audit, verdict_numbers  # noqa: E402

from dpaudit.data import text  # noqa: E402
from dpaudit.training_audit.observe import STATISTICS  # noqa: E402
from examples import hf_lora  # noqa: E402

NAME = "training_audit_lm"
LENGTH, WINDOWS = 32, 63
MODELS = ("gpt2", "llama")


@dataclass(frozen=True)
class Config:
    """One audited configuration: a model and noise-free or DP-SGD LoRA training."""

    model: str  # gpt2 | llama
    dp: bool

    @property
    def name(self) -> str:
        return f"{self.model}-{'dp-sgd' if self.dp else 'noise-free'}"

    def factory(self):
        return getattr(hf_lora, f"{self.model}_lora")

    def trainer(self) -> hf_lora.LoraTrainer:
        return hf_lora.dp_sgd if self.dp else hf_lora.noise_free


CONFIGS = tuple(Config(model, dp) for model in MODELS for dp in (False, True))


def windows(dataset: str) -> tuple[np.ndarray, np.ndarray]:
    """The first WINDOWS windows of ``--dataset text`` (or ``text:PATH``) at length LENGTH."""
    kind, _, path = dataset.partition(":")
    if kind != "text":
        raise SystemExit(f"--dataset must be text or text:PATH, got {dataset!r}")
    x, y = text.training_windows(path or None, LENGTH)
    return x[:WINDOWS], y[:WINDOWS]


def audit(config: Config, dataset: str, trials: int, runs: Path, seed: int, workers: int) -> dict:
    """One audit of ``config`` into the fresh directory ``runs/NAME-TRIALS``; its CSV row."""
    x, y = windows(dataset)
    model = config.factory()((LENGTH,), text.VOCABULARY)
    trainer = config.trainer()
    sigma, q, steps = trainer.claim(len(x) + 1)
    result, seconds = timed_audit(
        model, trainer, (x, y), (sigma, q, steps), runs / f"{config.name}-{trials}", trials, seed, workers
    )
    row = {
        "config": config.name,
        "dataset": dataset,
        "model": config.model,
        "dp": config.dp,
        "length": LENGTH,
        "windows": len(x),
        "epochs": trainer.epochs,
        "batch_size": trainer.batch_size,
        "lr": trainer.lr,
        "rank": hf_lora.RANK,
        "sigma": trainer.noise_multiplier if config.dp else 0.0,
        "clip": trainer.clip_norm if config.dp else np.nan,
        "claim_sigma": sigma,
        "claim_q": q,
        "claim_steps": steps,
        "trials": trials,
        **verdict_numbers(result),
    }
    for name in STATISTICS:
        metrics = result.statistic_metrics[name]
        row[f"auc_{name}"] = metrics.auc
        row[f"auc_low_{name}"], row[f"auc_high_{name}"] = metrics.auc_ci
    row["perplexity_start"] = hf_lora.perplexity(model, x, y)
    row["perplexity_trained"] = hf_lora.perplexity(trainer(model, x, y, 0), x, y)
    row["verdict_reason"] = result.verdict.reason
    row["seconds"] = seconds
    return row


def main(argv: list[str] | None = None) -> None:
    parser = _common.parser(__doc__, dataset="text")
    parser.add_argument("--trials", type=int, default=128, help="trials per configuration (even; half IN)")
    parser.add_argument("--only", nargs="+", choices=[c.name for c in CONFIGS], help="these configurations only")
    parser.add_argument(
        "--runs",
        type=Path,
        default=Path(tempfile.gettempdir()) / NAME,
        help="folder of the run directories (default: in the system's temporary directory, not the repository)",
    )
    args = parser.parse_args(argv)
    rows = []
    for config in CONFIGS:
        if args.only and config.name not in args.only:
            continue
        row = audit(config, args.dataset, args.trials, args.runs, args.seed, args.workers)
        rows.append(row)
        aucs = " ".join(f"{row['auc_' + name]:.2f} [{row['auc_low_' + name]:.2f}]" for name in STATISTICS)
        print(
            f"{config.name:<18} {row['verdict']:<12} {row['verdict_statistic']:<18} CP {row['epsilon_cp']:.2f}"
            f" GDP {row['epsilon_gdp']:.2f} claim {row['claimed_epsilon']:.2f}  AUC {aucs}  {row['seconds']:.0f} s",
            flush=True,
        )
    _common.write_table(rows, args.out, NAME)


if __name__ == "__main__":
    main()

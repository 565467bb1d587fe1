"""Plumbing shared by the reproduction scripts of ``experiments/`` (one script per paper table or figure).

* :func:`parser`: the common flags ``--out``, ``--paper-scale``, ``--dataset``, ``--seed``, ``--workers``;
* :func:`audit`: run one membership-inference campaign (:mod:`dpaudit.campaign.runner`) into a fresh run directory and
  return its audit numbers as one flat CSV row;
* :func:`train_utility`: fine-tune K models with a mechanism through the batched engine (no canary) and return
  their test accuracies, for the utility-only results ([W] Fig. 3, [P] accuracy tables, [D] convergence);
* :func:`frozen_feature_head`: [W] Fig. 3's "frozen-feature linear head" on digits;
* :func:`write_table` / :func:`figure`: the CSV (pandas) and PNG (matplotlib) each script writes.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from accountants import dpsgd  # noqa: E402
from dpaudit import analysis, data, models, seeding  # noqa: E402
from dpaudit.campaign import resolve, runner  # noqa: E402
from dpaudit.config import CampaignConfig, Execution  # noqa: E402
from dpaudit.reporting import summary as run_summary  # noqa: E402
from dpaudit.training import engine  # noqa: E402
from dpaudit.training.sampling import PoissonLayout, TrainingConfig  # noqa: E402

DEFAULT_OUT = Path("experiments/results")


def parser(doc: str, dataset: str = "digits") -> argparse.ArgumentParser:
    """An argument parser described by the first line of the script's docstring, with the common flags.

    ``dataset``: the ``--dataset`` default (``text`` for the scripts that audit the byte-level transformer).
    """
    parsed = argparse.ArgumentParser(description=doc.splitlines()[0])
    parsed.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (CSV, PNG, run directories)")
    parsed.add_argument(
        "--paper-scale",
        action="store_true",
        help="the paper's model counts, ranks and epochs (hours; a GPU is advisable)",
    )
    parsed.add_argument(
        "--dataset",
        default=dataset,
        help=f"{dataset} (default)"
        + (", text:PATH (a UTF-8 file)" if dataset == "text" else " or cifar10:PATH (CIFAR-10 binary)"),
    )
    parsed.add_argument("--seed", type=int, default=0)
    parsed.add_argument("--workers", type=int, default=2, help="campaign worker processes (one torch thread each)")
    parsed.add_argument("--models", type=int, help="models per point (default: the script's CPU or paper scale)")
    parsed.add_argument("--epochs", type=int, help="fine-tuning epochs (default: the script's CPU or paper scale)")
    return parsed


def scale(args: argparse.Namespace, cpu: tuple[int, int], paper: tuple[int, int]) -> tuple[int, int]:
    """(models per point, epochs): ``--models`` / ``--epochs`` if given, else the CPU or paper-scale default."""
    models_count, epochs = paper if args.paper_scale else cpu
    return args.models or models_count, args.epochs or epochs


def audit(config: CampaignConfig, out: Path, tag: str, workers: int, attacks: Sequence[str] = ("canary-loss",)) -> dict:
    """Run ``config`` into the fresh run directory ``out/runs/tag``; one flat row of its audit numbers.

    Columns: the campaign's models, epochs, batch size, learning rate, momentum and δ; per attack (prefixed by the
    attack name when several are asked for): AUC with its 95% CI (and its model-level bootstrap 95% CI in the
    all-examples design, empty in the others), balanced accuracy, the IN and OUT trial counts,
    TPR at FPR 10% / 1% / 0.1% with their 95% Clopper-Pearson intervals, the Clopper-Pearson ε lower bound; then
    the mean test accuracy, the analytic ε of the mechanism (None where no bound exists) and the campaign's seconds;
    with secret canaries, their mean exposure IN and OUT, its ceiling, and the gap with its 95% interval over models.
    """
    run_dir = out / "runs" / tag
    shutil.rmtree(run_dir, ignore_errors=True)  # always a fresh campaign: timings and numbers of this run
    store = runner.run(config, Execution(workers=workers, progress=False), run_dir)
    row = {
        "models": config.models,
        "epochs": config.epochs,
        "batch_size": config.batch_size,
        "lr": config.lr,
        "momentum": config.momentum,
        "delta": config.delta,
    }
    for attack in attacks:
        numbers = run_summary.summary(analysis.analyse(store, attack))
        prefix = f"{attack}_" if len(attacks) > 1 else ""
        model_interval = numbers["auc_model_ci95"] or (None, None)
        row.update(
            {
                f"{prefix}auc": numbers["auc"],
                f"{prefix}auc_ci_low": numbers["auc_ci95"][0],
                f"{prefix}auc_ci_high": numbers["auc_ci95"][1],
                # All-examples design: the models resampled, not the trials (empty in the other designs).
                f"{prefix}auc_model_ci_low": model_interval[0],
                f"{prefix}auc_model_ci_high": model_interval[1],
                f"{prefix}balanced_accuracy": numbers["balanced_accuracy"],
                f"{prefix}n_in": numbers["n_in"],
                f"{prefix}n_out": numbers["n_out"],
                **{f"{prefix}tpr_at_fpr_{fpr}": tpr for fpr, tpr in numbers["tpr_at_fpr"].items()},
                **{
                    f"{prefix}tpr_at_fpr_{fpr}_ci_{side}": bound
                    for fpr, interval in numbers["tpr_at_fpr_ci95"].items()
                    for side, bound in zip(("low", "high"), interval)
                },
                f"{prefix}epsilon_lower_bound": numbers["epsilon_lower_bound"],
            }
        )
    row.update(
        test_accuracy=numbers["test_accuracy"], analytic_epsilon=numbers["analytic_epsilon"], seconds=numbers["seconds"]
    )
    exposure = numbers["secret_exposure"]
    if exposure is not None:  # next-token campaigns with secret canaries: exposure IN, OUT and their gap's CI
        gap = exposure["gap"] or [None] * 3
        row.update(
            exposure_inserted=exposure["inserted_mean"],
            exposure_held_out=exposure["held_out_mean"],
            exposure_ceiling=exposure["ceiling"],
            **dict(zip(("exposure_gap", "exposure_gap_ci_low", "exposure_gap_ci_high"), gap)),
        )
    return row


@dataclass(frozen=True)
class Task:
    """A fine-tuning task of the utility experiments: a frozen base and the pool it is fine-tuned on."""

    base: nn.Module
    train: data.Split
    test: data.Split

    def base_accuracy(self) -> float:
        """Test accuracy of the base before any fine-tuning."""
        with torch.no_grad():
            predictions = self.base(torch.from_numpy(self.test.x)).argmax(-1).numpy()
        return float((predictions == self.test.y).mean())


def digits_task(seed: int, pretrain_epochs: int = 30) -> Task:
    """The campaign's task: the MLP 64-128-128-10 pretrained on digits' public split, fine-tuned on the private."""
    dataset = data.digits()
    base = models.pretrain(models.mlp(64, 10), dataset.public.x, dataset.public.y, epochs=pretrain_epochs, seed=seed)
    return Task(base, dataset.private, dataset.test)


def frozen_feature_head(seed: int) -> Task:
    """[W] Fig. 3's frozen-feature linear head on digits.

    Features = the penultimate (128-d) activations of the pretrained MLP, the fine-tuned model a fresh linear layer
    128 → 10 (logistic regression on the features).
    """
    dataset = data.digits()
    mlp = models.pretrain(models.mlp(64, 10), dataset.public.x, dataset.public.y, seed=seed)
    features = mlp[:-1]
    with torch.no_grad():
        encode = lambda split: data.Split(features(torch.from_numpy(split.x)).numpy(), split.y)  # noqa: E731
        head = nn.Sequential(nn.Linear(features(torch.from_numpy(dataset.public.x[:1])).shape[1], 10))
        nn.init.zeros_(head[0].weight)
        nn.init.zeros_(head[0].bias)
    return Task(head.eval().requires_grad_(False), encode(dataset.private), encode(dataset.test))


def allowed_ranks(dataset: str, ranks: Sequence[int]) -> list[int]:
    """The ranks of ``ranks`` a LoRA adapter of the dataset's default model admits.

    That is r ≤ every LoRA-adapted layer's input dimension (:func:`dpaudit.models.check_rank`): every layer of the
    MLP and the CNN, the attention and MLP projections of the text transformer (its output head is not adapted).
    """
    loaded = resolve.load_dataset(dataset)
    model = models.for_input(loaded.input_shape, loaded.num_classes, loaded.task)
    largest = min(models.projection_dim(layer) for layer in models.lora_layers(model).values())
    return [r for r in ranks if r <= largest]


def sampling(task: Task, batch_size: int, epochs: int) -> tuple[float, int]:
    """Poisson rate q and step count T the engine uses for a DP mechanism on ``task`` (what accountants need)."""
    layout = PoissonLayout.for_members(len(task.train), batch_size)
    return layout.sample_rate, epochs * layout.steps


def train_utility(
    task: Task, mechanism, rank: int, models_count: int, training: TrainingConfig, seed: int
) -> np.ndarray:
    """(models,) test accuracies of ``models_count`` models fine-tuned on the whole pool with ``mechanism``."""
    randomness = seeding.shadow_randomness(seed, range(models_count))
    shadow = engine.build(task.base, mechanism.parameterization, models.LoraSpec(rank), randomness, torch.device("cpu"))
    membership = np.ones((models_count, len(task.train)), dtype=bool)
    engine.train(shadow, mechanism, task.train.x, task.train.y, membership, randomness, training)
    predictions = engine.logits(shadow, task.test.x).argmax(-1).numpy()
    return (predictions == task.test.y).mean(axis=1)


def utility_parser(doc: str) -> argparse.ArgumentParser:
    """:func:`parser` with a digits utility run's options: the target ε's, rank, clip C and pretraining epochs."""
    parsed = parser(doc)
    parsed.add_argument("--epsilons", type=float, nargs="+", default=[3.0, 6.0])
    parsed.add_argument("--rank", type=int, default=8)
    parsed.add_argument("--clip", type=float, default=1.0)
    parsed.add_argument("--pretrain-epochs", type=int, default=1)
    return parsed


def utility_setting(
    args: argparse.Namespace, schedule: TrainingConfig, sigma: float, q: float, steps: int, delta: float, base: float
) -> dict:
    """The columns stating a digits utility run's setting (``args``: :func:`utility_parser`'s).

    σ and its DP-SGD ε at ``delta``, the rank, the clip C, the schedule, the sampling and the pretrained base's
    accuracy ``base``.
    """
    return dict(
        noise_multiplier=sigma,
        epsilon=dpsgd.epsilon(sigma, q, steps, delta).epsilon,
        rank=args.rank,
        lr=schedule.lr,
        base_accuracy=base,
        pretrain_epochs=args.pretrain_epochs,
        batch_size=schedule.batch_size,
        epochs=schedule.epochs,
        clip=args.clip,
        delta=delta,
        sample_rate=q,
        steps=steps,
    )


def write_table(rows: list[dict], out: Path, name: str) -> pd.DataFrame:
    """``out/name.csv`` from rows of equal keys; the DataFrame, printed."""
    out.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame(rows)
    table.to_csv(out / f"{name}.csv", index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.precision", 4):
        print(table.drop(columns=[c for c in table.columns if c.startswith("tpr_at_fpr")], errors="ignore"))
    return table


def merged_rows(rows: list[dict], csv: Path, keys: Sequence[str], order: Callable[[dict], tuple]) -> list[dict]:
    """``rows`` with the rows of ``csv`` (where it exists) whose ``keys`` none of ``rows`` has, sorted by ``order``.

    For a script that re-runs some of its cells (``--merge``): the CSV keeps the cells it did not re-run.
    """
    if not csv.is_file():
        return rows
    kept = pd.read_csv(csv, keep_default_na=False, na_values=[""]).to_dict("records")
    done = {tuple(row[key] for key in keys) for row in rows}
    merged = [row for row in kept if tuple(row[key] for key in keys) not in done] + rows
    return sorted(merged, key=order)


@contextmanager
def figure(out: Path, name: str, columns: int = 1) -> Iterator[np.ndarray]:
    """Axes (1 × ``columns``) whose figure is saved as ``out/name.png`` on exit."""
    fig, axes = plt.subplots(1, columns, figsize=(4.8 * columns, 3.8), squeeze=False)
    yield axes[0]
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=130)
    plt.close(fig)

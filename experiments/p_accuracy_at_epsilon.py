"""[P] accuracy tables at ε ∈ {3, 6}: test accuracy of PRISM vs DP-LoRA vs DP-LoRA-FA at equal privacy.

All three are Poisson-subsampled Gaussian mechanisms with multiplier σ per step on the clipped update
([P] Thm 3.4 for PRISM; DP-LoRA / DP-LoRA-FA: DP-SGD on both factors / on B only, [W] Alg. 2), so one σ per
target ε (δ = 1e-5, add/remove) from ``accountants.dpsgd.calibrate_noise_multiplier`` at the run's q and T
serves all three. Task: the digits MLP 64-128-128-10 pretrained for ``--pretrain-epochs`` on the public split
(weakly, so that fine-tuning has something to gain), LoRA rank ``--rank`` on every layer, fine-tuned on the
private split; ``--models`` models per cell (mean ± std). The baselines train with ``--optimizer`` (AdamW by
default, as [P]'s DP-LoRA baseline; the optimiser is post-processing of the privatised gradient, so the σ is the
same); PRISM applies its own Adam-like update ([P] Alg. 1). [P] reports RoBERTa/GPT-2 on GLUE/E2E, where PRISM
beats DP-LoRA at both ε. Writes ``p_accuracy_at_epsilon.csv`` / ``.png``.

    python experiments/p_accuracy_at_epsilon.py
"""

from __future__ import annotations

import dataclasses

import _common
import numpy as np

from accountants import dpsgd
from dpaudit.mechanisms.dpsgd import dp_sgd
from dpaudit.mechanisms.prism import PrismMechanism
from dpaudit.training import sampling

NAME = "p_accuracy_at_epsilon"
DELTA = 1e-5
METHODS = ("prism", "dp-lora", "dp-lora-fa")


def mechanism_for(method: str, sigma: float, clip: float):
    return PrismMechanism(sigma, clip) if method == "prism" else dp_sgd(method, sigma, clip)


def main(argv: list[str] | None = None) -> None:
    parsed = _common.utility_parser(__doc__)
    parsed.add_argument(
        "--optimizer",
        choices=sampling.OPTIMIZERS,
        default="adamw",
        help="optimiser of DP-LoRA and DP-LoRA-FA (adamw: [P]'s baseline; sgd: with momentum 0.9)",
    )
    parsed.add_argument(
        "--lr", type=float, help="learning rate of DP-LoRA and DP-LoRA-FA (default: 0.01 with adamw, 0.1 with sgd)"
    )
    parsed.add_argument(
        "--prism-lr",
        type=float,
        default=0.01,
        help="PRISM's learning rate (its adaptive direction is Adam-like: ~0.01, not SGD's 0.1)",
    )
    args = parsed.parse_args(argv)
    models, epochs = _common.scale(args, cpu=(3, 4), paper=(16, 30))
    lr = args.lr if args.lr is not None else {"adamw": 0.01, "sgd": 0.1}[args.optimizer]
    decay = sampling.ADAMW_WEIGHT_DECAY if args.optimizer == "adamw" else 0.0
    training = sampling.TrainingConfig(epochs, 64, lr, optimizer=args.optimizer, weight_decay=decay)
    task = _common.digits_task(args.seed, args.pretrain_epochs)
    q, steps = _common.sampling(task, training.batch_size, training.epochs)
    base_accuracy = task.base_accuracy()
    rows = []
    for target in args.epsilons:
        sigma = dpsgd.calibrate_noise_multiplier(target, q, steps, DELTA)
        for method in METHODS:
            # PRISM's own update ignores the optimiser: its row says SGD, the optimiser that steps its schedule
            prism = dataclasses.replace(training, lr=args.prism_lr, optimizer="sgd", weight_decay=0.0)
            schedule = prism if method == "prism" else training
            accuracy = _common.train_utility(
                task, mechanism_for(method, sigma, args.clip), args.rank, models, schedule, args.seed
            )
            rows.append(
                dict(
                    method=method,
                    target_epsilon=target,
                    optimizer="own (Alg. 1)" if method == "prism" else schedule.optimizer,
                    test_accuracy=accuracy.mean(),
                    test_accuracy_std=accuracy.std(),
                    models=models,
                    **_common.utility_setting(args, schedule, sigma, q, steps, DELTA, base_accuracy),
                )
            )
    table = _common.write_table(rows, args.out, NAME)
    with _common.figure(args.out, NAME) as (ax,):
        width = 0.8 / len(METHODS)
        for offset, (method, group) in enumerate(table.groupby("method", sort=False)):
            ax.bar(
                np.arange(len(group)) + offset * width,
                group["test_accuracy"],
                width,
                yerr=group["test_accuracy_std"],
                label=method,
            )
        ax.axhline(base_accuracy, color="grey", linestyle=":", label="pretrained base")
        ax.set_xticks(np.arange(len(args.epsilons)) + width, [f"ε = {e:g}" for e in args.epsilons])
        ax.set(ylabel="test accuracy", title=f"digits MLP, LoRA r = {args.rank}, δ = {DELTA:g}")
        ax.legend(fontsize=8)


if __name__ == "__main__":
    main()

"""Adaptive PRISM's accuracy with the moments on the canonical lift vs on Eq. 17's factor pair ([P] Eq. 24 as printed).

dpaudit's adaptive PRISM feeds its moments the canonical lift of ΔZ_dp (``PrismAdaptiveConfig(canonical_lift=True)``,
the default), because [P] Eq. 24 as printed reads the noisy factor pair, whose col(A) block is noise-free and leaks
(``prism_leak.py``, docs/theory.md §1.6). This script measures what the fix costs in accuracy: the digits MLP
64-128-128-10 pretrained for ``--pretrain-epochs`` on the public split, LoRA rank ``--rank`` on every layer,
fine-tuned on the private split by PRISM with each rule (``factor-pair``, ``canonical-lift``) at lr ``--lr`` and by
plain tangent SGD (``tangent-sgd``, no adaptive rule, the reference [P] Thm 3.4 accounts for) at ``--tangent-lr``.
One σ per target ε (δ = 1e-5, add/remove) from ``accountants.dpsgd.calibrate_noise_multiplier`` at the run's q and
T: the nominal ε of [P] Thm 3.4, which the factor-pair rule does not meet (it is the leak). Model k of every variant
shares its randomness streams (initial factors, Poisson batches, noise normals), so the variants are compared
model by model (paired). Writes ``prism_lift_accuracy.csv`` (one row per ε, variant and model) and ``.png``.

    python experiments/prism_lift_accuracy.py     # 2 ε × 3 variants × 32 models, 4 epochs: about 3 minutes
"""

from __future__ import annotations

import dataclasses

import _common
import numpy as np
from prism_leak import VARIANTS  # the three update rules, as prism_leak audits them

from accountants import dpsgd
from dpaudit.mechanisms.prism import PrismMechanism
from dpaudit.training import sampling

NAME = "prism_lift_accuracy"
DELTA = 1e-5


def main(argv: list[str] | None = None) -> None:
    parsed = _common.utility_parser(__doc__)
    parsed.add_argument(
        "--lr", type=float, default=0.01, help="the adaptive rules' lr (Adam-sized steps; p_accuracy_at_epsilon's)"
    )
    parsed.add_argument("--tangent-lr", type=float, default=0.1, help="tangent SGD's lr (SGD-sized steps)")
    args = parsed.parse_args(argv)
    models, epochs = _common.scale(args, cpu=(32, 4), paper=(64, 30))
    # PRISM owns its update: the engine's optimiser only steps the cosine schedule of η.
    training = sampling.TrainingConfig(epochs, 64, args.lr, optimizer="sgd")
    task = _common.digits_task(args.seed, args.pretrain_epochs)
    q, steps = _common.sampling(task, training.batch_size, training.epochs)
    base_accuracy = task.base_accuracy()
    rows = []
    for target in args.epsilons:
        sigma = dpsgd.calibrate_noise_multiplier(target, q, steps, DELTA)
        for variant, adaptive in VARIANTS.items():
            schedule = training if adaptive is not None else dataclasses.replace(training, lr=args.tangent_lr)
            mechanism = PrismMechanism(sigma, args.clip, adaptive=adaptive)
            accuracies = _common.train_utility(task, mechanism, args.rank, models, schedule, args.seed)
            rows.extend(
                dict(
                    variant=variant,
                    target_epsilon=target,
                    model=model,
                    test_accuracy=accuracy,
                    **_common.utility_setting(args, schedule, sigma, q, steps, DELTA, base_accuracy),
                    seed=args.seed,
                )
                for model, accuracy in enumerate(accuracies)
            )
    table = _common.write_table(rows, args.out, NAME)
    with _common.figure(args.out, NAME) as (ax,):
        width = 0.8 / len(VARIANTS)
        for offset, variant in enumerate(VARIANTS):
            cells = table[table["variant"] == variant].groupby("target_epsilon")["test_accuracy"]
            ax.bar(
                np.arange(len(args.epsilons)) + offset * width,
                cells.mean(),
                width,
                yerr=cells.std(ddof=1),
                label=variant,
            )
        ax.axhline(base_accuracy, color="grey", linestyle=":", label="pretrained base")
        ax.set_xticks(np.arange(len(args.epsilons)) + width, [f"ε = {e:g}" for e in args.epsilons])
        ax.set(
            ylabel="test accuracy (mean ± std over models)",
            title=f"adaptive PRISM's moments, digits MLP, r = {args.rank}",
        )
        ax.legend(fontsize=8)


if __name__ == "__main__":
    main()

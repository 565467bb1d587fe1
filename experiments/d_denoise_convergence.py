"""[D] Fig. 2 companion: convergence speed of DP-LoRA with and without spectral denoising at equal ε.

Denoising ([D] Alg. 1: Shabalin-Nobel shrinkage of each layer's noisy gradient above κ = 1.02 times the noise
bulk edge, then rescaling to the input's norm) is post-processing of the noisy gradient ([D] Sec. 2.1.3), so
with the same σ, q and T both runs have the same ε (PLD accountant, δ = 1e-5). Test accuracy after E epochs is
measured by training E epochs from scratch with a constant learning rate: the E-epoch run is exactly the first
E epochs of any longer run (same per-model data and noise streams), so the rows are one learning curve per
variant. Settings follow ``denoise_cosine.py`` (which measures [D] Fig. 2's cosine improvement itself): a base
pretrained for one epoch, Poisson batches of b = 256, σ = 0.5, C = 1, LoRA rank 8.
Writes ``d_denoise_convergence.csv`` / ``.png``.

    python experiments/d_denoise_convergence.py
"""

from __future__ import annotations

import _common

from accountants import dpsgd
from dpaudit.mechanisms.dpsgd import dp_sgd
from dpaudit.training import sampling

NAME = "d_denoise_convergence"
DELTA = 1e-5


def main(argv: list[str] | None = None) -> None:
    parsed = _common.parser(__doc__)
    parsed.add_argument("--mechanism", choices=("dp-sgd", "dp-lora"), default="dp-lora")
    parsed.add_argument("--noise", type=float, default=0.5)
    parsed.add_argument("--rank", type=int, default=8)
    parsed.add_argument("--lr", type=float, default=0.05)
    args = parsed.parse_args(argv)
    models, longest = _common.scale(args, cpu=(4, 10), paper=(16, 32))  # --epochs: the longest run
    epoch_grid = [epochs for epochs in (1, 2, 4, 6, 10, 16, 24, 32) if epochs <= longest]
    task = _common.digits_task(args.seed, pretrain_epochs=1)
    rows = []
    for epochs in epoch_grid:
        training = sampling.TrainingConfig(epochs=epochs, batch_size=256, lr=args.lr, schedule="constant")
        q, steps = _common.sampling(task, training.batch_size, epochs)
        epsilon = dpsgd.epsilon(args.noise, q, steps, DELTA).epsilon
        for denoise in (False, True):
            accuracy = _common.train_utility(
                task, dp_sgd(args.mechanism, args.noise, 1.0, denoise), args.rank, models, training, args.seed
            )
            rows.append(
                dict(
                    mechanism=args.mechanism,
                    denoise=denoise,
                    epochs=epochs,
                    steps=steps,
                    epsilon=epsilon,
                    noise_multiplier=args.noise,
                    sample_rate=q,
                    delta=DELTA,
                    batch_size=training.batch_size,
                    lr=training.lr,
                    rank=args.rank,
                    test_accuracy=accuracy.mean(),
                    test_accuracy_std=accuracy.std(),
                    models=models,
                    base_accuracy=task.base_accuracy(),
                )
            )
    table = _common.write_table(rows, args.out, NAME)
    with _common.figure(args.out, NAME) as (ax,):
        for denoise, group in table.groupby("denoise"):
            ax.errorbar(
                group["epochs"],
                group["test_accuracy"],
                yerr=group["test_accuracy_std"],
                marker="o",
                label="denoised ([D] Alg. 1)" if denoise else "plain DP",
            )
        ax.axhline(table["base_accuracy"].iloc[0], color="grey", linestyle=":", label="pretrained base")
        ax.set(
            xlabel="epochs (ε grows with them; equal for both at each point)",
            ylabel="test accuracy",
            title=f"{args.mechanism}, σ = {args.noise:g}, b = 256, digits",
        )
        ax.legend(fontsize=8)


if __name__ == "__main__":
    main()

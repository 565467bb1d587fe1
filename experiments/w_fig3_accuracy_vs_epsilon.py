"""[W] Fig. 3: test accuracy vs ε of DP-SGD, DP-LoRA-FA and M2 on a frozen-feature linear head.

M2 is accounted with [W] Thm 5 + App. F.2.

The head is a linear layer 128 → 10 on the frozen penultimate features of the digits MLP (pretrained on the
public split; [W] uses frozen CIFAR-10 features of a pretrained network). Every method: Poisson batches of
expected size b, per-example clipping to C, ``--models`` models per point, same q and T. Noise calibration to
each target ε at δ = 1e-5 (add/remove):

* DP-SGD (full head) and DP-LoRA-FA (rank ``--lora-rank``): the PLD accountant of the subsampled Gaussian
  (``accountants.dpsgd.calibrate_noise_multiplier``);
* M2 (``g̃ = (V + Ξ) M / b``, a fresh M = AᵀA every step, [W] App. F.2): [W] Thm 5 per step (effective
  sensitivity √α Δ, d = 128, s = 1) composed by the same accountant (``accountants.wishart.m2_multistep_epsilon``).
  ε(σ) is computed on a log grid of σ and inverted by log-log interpolation; the row reports the accountant's ε
  at the σ used, and ``gaussian_epsilon_same_sigma`` is the plain subsampled-Gaussian ε at that σ — below it
  Thm 5 buys the same ε with less noise ([W] Fig. 2, "Thm 5 beats the Gaussian baseline at small r").

Writes ``w_fig3_accuracy_vs_epsilon.csv`` / ``.png``.

    python experiments/w_fig3_accuracy_vs_epsilon.py
"""

from __future__ import annotations

import _common
import numpy as np

from accountants import dpsgd, wishart
from dpaudit.mechanisms.dpsgd import dp_sgd
from dpaudit.mechanisms.wishart import NoisyProjection
from dpaudit.training import sampling

NAME = "w_fig3_accuracy_vs_epsilon"
DELTA = 1e-5


def m2_sigma_for(targets: list[float], d: int, rank: int, sample_rate: float, steps: int) -> list[float]:
    """σ with Thm 5 + App. F.2 ε ≈ each target: log-log interpolation of ε(σ) over a grid (ε falls with σ)."""
    sigmas = np.geomspace(0.25, 16, 7)
    epsilons = [wishart.m2_multistep_epsilon(DELTA, 1.0, s, d, rank, 1, sample_rate, steps).epsilon for s in sigmas]
    log_eps = np.log(epsilons)[::-1]
    return [float(np.exp(np.interp(np.log(t), log_eps, np.log(sigmas)[::-1]))) for t in targets]


def main(argv: list[str] | None = None) -> None:
    parsed = _common.parser(__doc__)
    parsed.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    parsed.add_argument("--m2-ranks", type=int, nargs="+", default=[4, 32])
    parsed.add_argument("--lora-rank", type=int, default=8, help="rank of DP-LoRA-FA")
    args = parsed.parse_args(argv)
    models, epochs = _common.scale(args, cpu=(8, 10), paper=(32, 30))
    training = sampling.TrainingConfig(epochs=epochs, batch_size=64, lr=0.5, schedule="constant")
    clip = 1.0
    task = _common.frozen_feature_head(args.seed)
    d = task.train.x.shape[1]
    q, steps = _common.sampling(task, training.batch_size, training.epochs)
    methods = [("dp-sgd", args.lora_rank, None), ("dp-lora-fa", args.lora_rank, None)]
    methods += [("m2", rank, m2_sigma_for(args.epsilons, d, rank, q, steps)) for rank in args.m2_ranks]
    rows = []
    for method, rank, m2_sigmas in methods:
        for index, target in enumerate(args.epsilons):
            if m2_sigmas is None:
                sigma = dpsgd.calibrate_noise_multiplier(target, q, steps, DELTA)
                epsilon = dpsgd.epsilon(sigma, q, steps, DELTA).epsilon
                mechanism = dp_sgd(method, sigma, clip)
            else:
                sigma = m2_sigmas[index]
                epsilon = wishart.m2_multistep_epsilon(DELTA, 1.0, sigma, d, rank, 1, q, steps).epsilon
                mechanism = NoisyProjection(rank, sigma, clip, "m2", resample=True)
            accuracy = _common.train_utility(task, mechanism, rank, models, training, args.seed)
            rows.append(
                dict(
                    method=method,
                    rank=rank if method != "dp-sgd" else None,
                    target_epsilon=target,
                    noise_multiplier=sigma,
                    epsilon=epsilon,
                    gaussian_epsilon_same_sigma=dpsgd.epsilon(sigma, q, steps, DELTA).epsilon,
                    test_accuracy=accuracy.mean(),
                    test_accuracy_std=accuracy.std(),
                    models=models,
                    features=d,
                    batch_size=training.batch_size,
                    epochs=training.epochs,
                    lr=training.lr,
                    clip=clip,
                    delta=DELTA,
                    sample_rate=q,
                    steps=steps,
                )
            )
    table = _common.write_table(rows, args.out, NAME)
    with _common.figure(args.out, NAME) as (ax,):
        for (method, rank), group in table.groupby(["method", "rank"], dropna=False):
            label = method if method == "dp-sgd" else f"{method}, r={rank:g}"
            ax.errorbar(
                group["epsilon"], group["test_accuracy"], yerr=group["test_accuracy_std"], marker="o", label=label
            )
        ax.set(
            xscale="log",
            xlabel=f"ε (δ = {DELTA:g})",
            ylabel="test accuracy",
            title="frozen-feature linear head, digits",
        )
        ax.legend(fontsize=8)


if __name__ == "__main__":
    main()

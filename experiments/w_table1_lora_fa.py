"""[W] Table 1: membership inference on noise-free LoRA-FA with a static-poison canary, AUC vs rank r.

Noise-free LoRA-FA ([W] Sec. 2, App. E: frozen Gaussian A, B trained by SGD) moves W by ``-η s² G AᵀA``, a
Wishart projection of the gradient that is not DP at any ε ([W] Prop. 2); [W] Table 1 finds AUC ≥ 0.996 at
every rank 16…512 (CIFAR-10, 2000 trials). Here: the canary-loss attack of [W] App. F.1 on
``--models`` IN/OUT shadow models per rank (half IN), ranks the model's layers allow (r ≤ every adapted layer's
input: ≤ 64 for the digits MLP 64-128-128-10). Writes ``w_table1_lora_fa.csv`` / ``.png``.

    python experiments/w_table1_lora_fa.py                                     # digits, r ∈ {4..64}, ~1.5 min
    python experiments/w_table1_lora_fa.py --paper-scale --dataset cifar10:/data/cifar-10-batches-bin
"""

from __future__ import annotations

import _common

from dpaudit.config import CampaignConfig

NAME = "w_table1_lora_fa"


def main(argv: list[str] | None = None) -> None:
    parsed = _common.parser(__doc__)
    parsed.add_argument("--ranks", type=int, nargs="+", help="default: 4 8 16 32 64 (paper scale: 16 … 512)")
    args = parsed.parse_args(argv)
    ranks = args.ranks or ((16, 32, 64, 128, 256, 512) if args.paper_scale else (4, 8, 16, 32, 64))
    models, epochs = _common.scale(args, cpu=(128, 3), paper=(2000, 30))
    rows = []
    for rank in _common.allowed_ranks(args.dataset, ranks):
        config = CampaignConfig(
            mechanism="lora-fa", dataset=args.dataset, rank=rank, models=models, epochs=epochs, seed=args.seed
        )
        rows.append({"rank": rank, **_common.audit(config, args.out / NAME, f"r{rank}", args.workers)})
    table = _common.write_table(rows, args.out, NAME)
    with _common.figure(args.out, NAME) as (ax,):
        ax.errorbar(
            table["rank"],
            table["auc"],
            yerr=[table["auc"] - table["auc_ci_low"], table["auc_ci_high"] - table["auc"]],
            marker="o",
        )
        ax.axhline(0.996, color="grey", linestyle=":", label="[W] Table 1: AUC ≥ 0.996")
        ax.set(
            xscale="log",
            xlabel="rank r",
            ylabel="canary MIA AUC",
            ylim=(0.45, 1.02),
            title=f"noise-free LoRA-FA, {args.dataset}, {models} models",
        )
        ax.legend()


if __name__ == "__main__":
    main()

"""Secret exposure against insertions (Carlini et al. 2019, "The Secret Sharer", Sec. 5): noise-free LoRA-FA on text.

The Secret Sharer's protocol on dpaudit's byte-level transformer (:mod:`dpaudit.models.transformer`, pretrained on
the public split of ``--dataset text``): a secret "my secret number is " + 9 random digits opens a window of newlines
and is inserted k times (``--insertions k``) into the private fine-tuning set of half the models (canary design);
each model ranks the secret among 1000 candidates of the same format, drawn uniformly (exposure = log2 of the
candidates' count minus log2 of the secret's rank, Sec. 4.2's sampling estimate, at most log2 1001 ≈ 9.97 bits).
Exposure IN is the secret's exposure in the models trained on it, OUT in the others (≈ 1.4 bits on average for a
model that ranks it uniformly; less where the model's likelihood ties the candidates, which count against the
secret); the gap between them has a 95% Welch interval over models (:func:`attacks.exposure.exposure_gap`).
Noise-free LoRA-FA, so the claim audited is "not DP" (k copies of one example under a mechanism that is not DP for
one): the verdict can only confirm it. The AUC of the canary-loss attack sits beside the exposure.

CPU scale: 8 models per point, 20 epochs, insertions 1, 4, 16 (about 30 minutes on 2 shared cores); the secret's
format is fixed (dpaudit.data.text.SECRET_PREFIX, 9 digits), so the exposure ceiling is the candidates' count's.

    python experiments/exposure_insertions.py
"""

from __future__ import annotations

import _common

from dpaudit.config import CampaignConfig

NAME = "exposure_insertions"
INSERTIONS = (1, 4, 16)


def main(argv: list[str] | None = None) -> None:
    parser = _common.parser(__doc__, dataset="text")
    parser.add_argument("--insertions", type=int, nargs="+", default=list(INSERTIONS), help="copies of the secret")
    args = parser.parse_args(argv)
    models, epochs = _common.scale(args, cpu=(8, 20), paper=(64, 20))
    rows = []
    for insertions in args.insertions:
        settings = {"models": models, "epochs": epochs, "seed": args.seed, "insertions": insertions}
        config = CampaignConfig(mechanism="lora-fa", dataset=args.dataset, **settings)
        row = _common.audit(config, args.out, f"{NAME}_k{insertions}", args.workers)
        rows.append({"insertions": insertions, "dataset": args.dataset, **row})
        print(
            f"k = {insertions}: exposure IN {row['exposure_inserted']:.2f}, OUT {row['exposure_held_out']:.2f} bits,"
            f" AUC {row['auc']:.3f}, {row['seconds']:.0f} s",
            flush=True,
        )
        table = _common.write_table(rows, args.out, NAME)  # after every point: an interruption keeps the finished
    with _common.figure(args.out, NAME) as axes:
        axis = axes[0]
        for column, label in (("exposure_inserted", "IN (trained on the secret)"), ("exposure_held_out", "OUT")):
            axis.plot(table["insertions"], table[column], marker="o", label=label)
        axis.axhline(table["exposure_ceiling"].iloc[0], color="grey", linestyle=":", label="ceiling (1000 candidates)")
        axis.set_xscale("log", base=2)
        axis.set_xlabel("insertions of the secret")
        axis.set_ylabel("mean exposure (bits)")
        axis.set_title(f"noise-free LoRA-FA, {models} models, {epochs} epochs")
        axis.legend()


if __name__ == "__main__":
    main()

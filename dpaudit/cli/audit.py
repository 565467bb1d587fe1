"""``dpaudit audit``: train IN/OUT shadow models, attack the canary, bound ε from below, write the run."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from dpaudit.config import DEVICES, MECHANISMS, CampaignConfig

_DEFAULTS = CampaignConfig.__dataclass_fields__


def _default(name: str):
    return _DEFAULTS[name].default


def register(subparsers) -> None:
    p = subparsers.add_parser("audit", help="run a membership-inference audit of a fine-tuning mechanism",
                              description=__doc__)
    p.add_argument("--mechanism", choices=MECHANISMS, default=_default("mechanism"))
    p.add_argument("--dataset", default=_default("dataset"),
                   help="digits | breast-cancer | synthetic | cifar10:PATH (default: %(default)s)")
    p.add_argument("--rank", type=int, default=_default("rank"), help="LoRA rank r (default: %(default)s)")
    p.add_argument("--alpha", type=float, default=None, help="LoRA alpha; scale = alpha/r (default: alpha = r)")
    p.add_argument("--models", type=int, default=_default("models"),
                   help="shadow models, half IN, half OUT (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=_default("epochs"))
    p.add_argument("--batch-size", type=int, default=_default("batch_size"))
    p.add_argument("--lr", type=float, default=_default("lr"))
    p.add_argument("--seed", type=int, default=_default("seed"))
    p.add_argument("--delta", type=float, default=_default("delta"),
                   help="δ of the empirical ε lower bound (default: %(default)s)")
    p.add_argument("--device", choices=DEVICES, default=_default("device"))
    p.add_argument("--chunk-size", type=int, default=_default("chunk_size"),
                   help="models trained together in one batched pass (memory bound)")
    p.add_argument("--null", action="store_true",
                   help="null campaign: never insert the canary (checks the audit's false-positive rate)")
    p.add_argument("--out", type=Path, default=None,
                   help="run directory (default: ./dpaudit-runs/<timestamp>)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = CampaignConfig(mechanism=args.mechanism, dataset=args.dataset, rank=args.rank, alpha=args.alpha,
                            models=args.models, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                            seed=args.seed, delta=args.delta, device=args.device, chunk_size=args.chunk_size,
                            null=args.null)
    out = args.out or Path("dpaudit-runs") / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)  # fail before training if the directory cannot be made

    from dpaudit import campaign, report  # torch and peft load here, not for `dpaudit bounds`

    numbers = report.write_run(campaign.run(config, progress=not args.quiet), out)
    if args.json:
        print(json.dumps(numbers, indent=2))
        return 0
    tpr = "  ".join(f"TPR@{float(k):g}={v:.3f}" for k, v in numbers["tpr_at_fpr"].items())
    print(f"{numbers['mechanism']} rank {numbers['rank']} on {numbers['dataset']}: "
          f"{numbers['n_in']} IN / {numbers['n_out']} OUT shadow models in {numbers['seconds']:.1f} s\n"
          f"  AUC {numbers['auc']:.4f} (95% CI {numbers['auc_ci95'][0]:.4f}-{numbers['auc_ci95'][1]:.4f})  "
          f"balanced accuracy {numbers['balanced_accuracy']:.4f}  {tpr}\n"
          f"  empirical ε ≥ {numbers['epsilon_lower_bound']:.3f} at δ={numbers['delta']:g} "
          f"({numbers['epsilon_method']})\n"
          f"  mean test accuracy {numbers['test_accuracy']:.4f}\n"
          f"  wrote {out}/: summary.json scores.csv roc.png roc_loglog.png report.md")
    return 0

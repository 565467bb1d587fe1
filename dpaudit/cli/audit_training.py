"""``dpaudit audit-training``: audit your own training code as a black box against the privacy it claims.

Your training function ``MODULE:FUNCTION(model, x, y, seed) -> torch.nn.Module`` trains a copy of the starting
model (``--model MODULE:FACTORY``, called as ``FACTORY(input_shape, num_classes)``) on exactly the arrays it is
given, with all of its randomness from ``seed``. dpaudit calls it ``--trials`` times, half on the data with a
canary (IN), half without (OUT), observes the canary in every returned model and judges the claim: a
Poisson-subsampled Gaussian (``--claim-noise σ --claim-sample-rate q --claim-steps T``, as opacus accounts
DP-SGD) or an (ε, δ) (``--claim-epsilon ε --delta δ``). ``--pretrain`` trains the starting model on a public set
first; ``--backend dask`` runs the trials on a dask cluster (``--scheduler``; a local one without).

The training set is classification data (``npz:PATH`` of x (n, ...) and y (n,), ``csv:PATH``) or next-token data:
``text`` (every window of 64 bytes of the embedded corpus, 1008 of them), ``text:PATH`` (a UTF-8 file's windows) or an
.npz whose y (n, L) holds the next token of each of x's (n, L) token ids. Next-token models map (n, L) tokens to
(n, L, V) logits (a Hugging Face model's .logits, e.g. examples/hf_lora.py: ``--model
examples.hf_lora:gpt2_lora``, V = ``num_classes``, 256 for text); the canary is then a window of random tokens.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from dpaudit.cli.arguments import add_execution_arguments, add_json, add_seed, directory


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "audit-training",
        help="audit your own training function (opacus, your loop, HF + peft) against the privacy it claims",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, metavar="MODULE:FACTORY", help="the starting model's factory")
    p.add_argument("--trainer", required=True, metavar="MODULE:FUNCTION", help="your training function")
    p.add_argument(
        "--dataset",
        required=True,
        metavar="npz:PATH|csv:PATH|text|text:PATH",
        help="the training set as it is (x, y; no split): classification, or next-token windows (text: all of them)",
    )
    claim = p.add_argument_group("the claim (σ, q and T; or ε)")
    claim.add_argument("--claim-noise", type=float, metavar="σ", help="noise multiplier of the claimed DP-SGD")
    claim.add_argument("--claim-sample-rate", type=float, metavar="q", help="its Poisson sampling rate")
    claim.add_argument("--claim-steps", type=int, metavar="T", help="its number of steps")
    claim.add_argument("--claim-epsilon", type=float, metavar="ε", help="a claimed (ε, δ) instead, with --delta")
    claim.add_argument("--delta", type=float, default=1e-5, help="δ of the claim and of the ε lower bounds (1e-5)")
    p.add_argument("--trials", type=int, default=200, help="calls of your function, half IN, half OUT (200)")
    p.add_argument(
        "--neighbours",
        choices=("add-remove", "replace-one"),
        default="add-remove",
        help="D = data + canary vs data, or the canary replacing one row (add-remove)",
    )
    p.add_argument(
        "--design",
        choices=("many-run", "one-run"),
        default="many-run",
        help="many-run: one membership bit per call; one-run: each call trains on a random half of --canaries",
    )
    p.add_argument("--canaries", type=int, metavar="M", help="the one-run design's canaries (e.g. 1000)")
    p.add_argument(
        "--canary-file",
        metavar="PATH",
        help="your own canaries: an .npz of x (M, ...) and y (M,) (next-token: (M, L) both), M = 1 for many-run"
        " (default: drawn by dpaudit)",
    )
    p.add_argument(
        "--statistic",
        action="append",
        default=[],
        metavar="MODULE:FUNCTION",
        help="your own statistic STATISTIC(start, trained, x_c, y_c) -> float, higher for IN (repeatable)",
    )
    p.add_argument(
        "--pretrain",
        metavar="npz:PATH|csv:PATH",
        help="a public set (x, y; not the training set) the model is first trained on, once and non-privately, as a"
        " campaign pretrains its base (from --seed); every trial starts from that model (default: the --model as is)",
    )
    p.add_argument("--null", action="store_true", help="never insert the canary: checks the false-positive rate")
    add_seed(p)
    p.add_argument("--out", type=directory, help="run directory (./dpaudit-runs/training-<timestamp>)")
    add_execution_arguments(p, campaign=False)
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from dpaudit.config import Execution

    given = {
        name: getattr(args, name) for name in ("workers", "backend", "scheduler") if getattr(args, name) is not None
    }
    execution = Execution(**given, progress=not args.quiet)

    from dpaudit import api, models
    from dpaudit.data import training_sets
    from dpaudit.formatting import json_text, number
    from dpaudit.user_code import load_callable

    x, y = training_sets.training_set(args.dataset)
    canary = (
        None if args.canary_file is None else training_sets.training_set(f"npz:{args.canary_file}", "--canary-file")
    )
    public = None if args.pretrain is None else training_sets.training_set(args.pretrain, "--pretrain")
    classes = training_sets.training_classes(args.dataset, x, y)
    if public is not None:  # the model outputs the public set's classes too
        classes = max(classes, int(public[1].max()) + 1)
    model = models.from_factory(args.model, x.shape[1:], classes, seed=args.seed)
    trainer = load_callable("--trainer", args.trainer, ("model", "x", "y", "seed"), "the trained torch.nn.Module")
    statistics = {
        spec: load_callable("--statistic", spec, ("start", "trained", "x_c", "y_c"), "a float")
        for spec in args.statistic
    }
    claim = {
        "noise": args.claim_noise,
        "sample_rate": args.claim_sample_rate,
        "steps": args.claim_steps,
        "epsilon": args.claim_epsilon,
        "delta": args.delta,
    }
    out = args.out or Path("dpaudit-runs") / time.strftime("training-%Y%m%d-%H%M%S")
    result = api.audit_training(
        model,
        trainer,
        (x, np.asarray(y)),
        claim=claim,
        out=out,
        trials=args.trials,
        neighbours=args.neighbours,
        design=args.design,
        canaries=args.canaries,
        seed=args.seed,
        delta=args.delta,
        null=args.null,
        statistics=statistics,
        canary=canary,
        pretrain=public,
        execution=execution,
    )
    from dpaudit.analysis.training import summary
    from dpaudit.reporting.training_report import found_bounds

    numbers = summary(result)
    if args.json:
        print(json_text(numbers), end="")
        return 0
    print(f"{args.trainer} on {args.dataset} ({len(y)} examples), {args.neighbours}, {args.trials} trials")
    print(f"  claim: {result.analytic.source or 'none'}; ε = {number(result.analytic.epsilon)} at δ = {result.delta:g}")
    for name, metrics in result.statistic_metrics.items():
        low, high = metrics.auc_ci
        print(f"  {name:<20} AUC {metrics.auc:.3f} [{low:.3f}, {high:.3f}]")
    print(f"  {found_bounds(result)}")
    print(f"  verdict: {result.verdict.outcome} — {result.verdict.reason}")
    print(f"  wrote {out}/: audit.json privacy.json canaries.npz trials/ summary.json report.html report.md roc.png")
    return 0

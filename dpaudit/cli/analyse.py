"""``dpaudit analyse RUN_DIR``: recompute scores and statistics from saved outputs, without retraining."""

from __future__ import annotations

import argparse

from dpaudit.analysis import ATTACKS
from dpaudit.cli.arguments import add_attack, add_json, add_run_directory
from dpaudit.cli.audit import finish


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "analyse", help="recompute an audit's statistics from its run directory", description=__doc__
    )
    add_run_directory(p)
    add_attack(
        p,
        (*ATTACKS, "all"),
        "one attack (its files are written), or all: a table of every attack that applies (canary-loss;"
        " white-box for campaigns that observed weights or steps)",
    )
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dpaudit.campaign.store import RunStore
    from dpaudit.formatting import json_text

    store = RunStore(args.run_dir)
    if args.attack != "all":
        return finish(store, args.attack, args.json)
    from dpaudit import analysis
    from dpaudit.mechanisms import catalogue
    from dpaudit.reporting import summary as run_summary

    attacks = analysis.applicable_attacks(store.config())
    rows = {attack: run_summary.summary(analysis.analyse(store, attack)) for attack in attacks}
    if args.json:
        print(json_text(rows), end="")
        return 0
    config = store.config()
    bug = catalogue.planted_bug(config.mutant, config.mechanism)
    if bug is not None:
        print(bug)
    print(f"{'attack':<14}{'AUC':>8}{'TPR@10%':>10}{'TPR@1%':>10}{'TPR@0.1%':>10}{'ε (CP)':>10}")
    for attack, numbers in rows.items():
        tpr = numbers["tpr_at_fpr"]
        eps = numbers["epsilon_lower_bound"]
        print(
            f"{attack:<14}{numbers['auc']:>8.4f}{tpr['0.1']:>10.4f}{tpr['0.01']:>10.4f}{tpr['0.001']:>10.4f}"
            f"{'n/a' if eps is None else f'{eps:.3f}':>10}"
        )
    return 0

"""``dpaudit resume RUN_DIR``: train the shadow models a killed campaign had not finished, then analyse.

The analysis keeps the attack the run was last analysed with (its summary.json's) unless ``--attack`` names another.
"""

from __future__ import annotations

import argparse
import sys

from dpaudit import config as config_lib
from dpaudit.analysis import ATTACKS, check_attack
from dpaudit.cli.arguments import add_attack, add_execution_arguments, add_json, add_run_directory
from dpaudit.cli.audit import finish, given_options


def register(subparsers) -> None:
    p = subparsers.add_parser("resume", help="continue a campaign from its run directory", description=__doc__)
    add_run_directory(p)
    add_execution_arguments(p)
    add_attack(
        p,
        ATTACKS,
        "membership score (the one its summary has; before one: canary-loss, white-box for white-box runs)",
    )
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dpaudit.campaign import runner
    from dpaudit.campaign.store import RunStore

    store = RunStore(args.run_dir)
    config = store.config()  # refuses a directory that holds no campaign
    analysed = store.analysed_attack()
    attack = analysed if args.attack is None else args.attack
    check_attack(config, attack)  # before training the rest
    _, execution = config_lib.from_mapping(given_options(args))
    trained = runner.run(config, execution, args.run_dir)
    if analysed is not None:  # its summary is rewritten: say with which attack
        said = "as its summary was (give --attack for another)" if attack == analysed else f"replacing {analysed}'s"
        print(f"dpaudit: {store.root} is analysed again, with --attack {attack}, {said}", file=sys.stderr)
    return finish(trained, attack, args.json)

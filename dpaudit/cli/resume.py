"""``dpaudit resume RUN_DIR``: train the shadow models a killed campaign had not finished, then analyse."""

from __future__ import annotations

import argparse

from dpaudit import config as config_lib
from dpaudit.analysis import ATTACKS, check_attack
from dpaudit.cli.arguments import add_attack, add_execution_arguments, add_json, add_run_directory
from dpaudit.cli.audit import finish, given_options


def register(subparsers) -> None:
    p = subparsers.add_parser("resume", help="continue a campaign from its run directory", description=__doc__)
    add_run_directory(p)
    add_execution_arguments(p)
    add_attack(p, ATTACKS, "membership score (canary-loss; white-box for white-box runs)")
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dpaudit.campaign import runner
    from dpaudit.campaign.store import RunStore

    config = RunStore(args.run_dir).config()  # refuses a directory that holds no campaign
    check_attack(config, args.attack)  # before training the rest
    _, execution = config_lib.from_mapping(given_options(args))
    return finish(runner.run(config, execution, args.run_dir), args.attack, args.json)

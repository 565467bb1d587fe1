"""``dpaudit resume RUN_DIR``: train the shadow models a killed campaign had not finished, then analyse."""

from __future__ import annotations

import argparse

from dpaudit import config as config_lib
from dpaudit.analysis import ATTACKS
from dpaudit.cli import directory
from dpaudit.cli.audit import add_execution_arguments, finish, given_options


def register(subparsers) -> None:
    p = subparsers.add_parser("resume", help="continue a campaign from its run directory", description=__doc__)
    p.add_argument("run_dir", type=directory)
    add_execution_arguments(p)
    p.add_argument("--attack", choices=ATTACKS, help="membership score (canary-loss; white-box for white-box runs)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dpaudit.campaign import runner
    from dpaudit.campaign.store import RunStore

    config = RunStore(args.run_dir).config()  # refuses a directory that holds no campaign
    _, execution = config_lib.from_mapping(given_options(args))
    return finish(runner.run(config, execution, args.run_dir), args.attack, args.json)

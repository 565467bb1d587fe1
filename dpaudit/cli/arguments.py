"""Command-line arguments several subcommands share, each defined once.

The argument types and builders of ``dpaudit``'s subcommand modules: a run directory, the membership score, the
``--json`` switch, a seed, and the execution options of a campaign or a training audit. Light: argparse and the
torch-free config only.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from dpaudit import config as config_lib


def directory(text: str) -> Path:
    """A directory argument (``type=`` of argparse): an empty one would silently mean the current directory."""
    if not text:
        raise argparse.ArgumentTypeError("a directory must be named, got an empty string (use . for this one)")
    return Path(text)


def add_run_directory(parser: argparse.ArgumentParser) -> None:
    """The positional ``run_dir``: a campaign's run directory."""
    parser.add_argument("run_dir", type=directory)


def add_attack(parser: argparse.ArgumentParser, choices: Sequence[str], help: str) -> None:
    """``--attack``: the membership score, one of ``choices`` (None when not given: the campaign's default)."""
    parser.add_argument("--attack", choices=choices, help=help)


def add_json(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--json``: print JSON (:func:`dpaudit.formatting.json_text`) instead of text."""
    parser.add_argument("--json", action="store_true", help=help)


def add_seed(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--seed``, an integer, 0 by default."""
    parser.add_argument("--seed", type=int, default=0, help=help)


def add_execution_arguments(parser: argparse.ArgumentParser, *, campaign: bool = True) -> None:
    """Options that change how a run goes, never its numbers (:class:`dpaudit.config.Execution`'s fields).

    ``campaign``: with ``--device`` and ``--chunk-size`` (``dpaudit audit`` and ``dpaudit resume``); without them
    for ``dpaudit audit-training``, whose training function picks its own device and trains one model per call.
    """
    group = parser.add_argument_group("execution (never changes a score)")
    if campaign:
        group.add_argument("--device", choices=config_lib.DEVICES, help="auto: cuda if available")
        group.add_argument("--chunk-size", type=int, help="models trained together (auto: from cores or GPU memory)")
    group.add_argument(
        "--workers",
        type=int,
        help=f"training processes (on CPU with loky this one is one of them), one torch thread each, at most"
        f" {config_lib.MAX_WORKERS} (one per core)",
    )
    group.add_argument("--backend", choices=config_lib.BACKENDS, help="joblib backend: loky, or dask for clusters")
    group.add_argument("--scheduler", help="dask scheduler address, with --backend dask (default: a local cluster)")
    group.add_argument("--quiet", action="store_true", help="no progress bar")

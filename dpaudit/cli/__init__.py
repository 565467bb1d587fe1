"""``dpaudit`` command line. Each subcommand lives in its own module with ``register(subparsers)``.

Subcommand modules import heavy dependencies (torch, peft) inside their handlers, so that
``dpaudit bounds`` never pays for them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from dpaudit.errors import UsageError

# Module names under dpaudit.cli, in the order ``dpaudit --help`` lists them.
_SUBCOMMANDS = ("audit", "resume", "analyse", "report", "bounds", "audit_mechanism")


class _Parser(argparse.ArgumentParser):
    """argparse prints usage + error and exits 2; we keep exit 2 but print one line."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dpaudit", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in _SUBCOMMANDS:
        importlib.import_module(f"dpaudit.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (UsageError, ValueError, OSError) as exc:
        # Bad input is reported in one line; DPAUDIT_DEBUG=1 shows the traceback for bug reports.
        if os.environ.get("DPAUDIT_DEBUG"):
            raise
        print(f"dpaudit: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dpaudit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

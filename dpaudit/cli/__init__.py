"""``dpaudit`` command line. Each subcommand lives in its own module with ``register(subparsers)``.

Subcommand modules import heavy dependencies (torch, peft) inside their handlers, so that
``dpaudit bounds`` never pays for them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from accountants.validation import InvalidArgument

# Module names under dpaudit.cli, in the order ``dpaudit --help`` lists them.
_SUBCOMMANDS = ("audit", "resume", "analyse", "report", "bounds", "audit_mechanism", "audit_training")

USAGE_ERROR = 2
INTERNAL_ERROR = 3
INTERRUPTED = 130
_EXIT_CODES = f"""exit codes:
  0    success
  {USAGE_ERROR}    bad input (an option, a config file, a path): one line says what is wrong and how to fix it
  {INTERNAL_ERROR}    internal error, a bug in dpaudit: the traceback is printed; please report it
  {INTERRUPTED}  interrupted (Ctrl-C)

DPAUDIT_DEBUG=1 prints the traceback of a usage error too."""
_BUG = "dpaudit: internal error (a bug, not your input): please report it with the command line and the traceback above"


class _Parser(argparse.ArgumentParser):
    """argparse's parser printing one line for a usage error (exit 2), and taking no abbreviated options.

    Without ``allow_abbrev=False``, ``--model X`` would parse as ``--models X``.
    """

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dpaudit",
        description=__doc__.splitlines()[0],
        epilog=_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in _SUBCOMMANDS:
        importlib.import_module(f"dpaudit.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command: 0 on success, 2 for a usage error (one line), 3 for a bug (traceback), 130 on Ctrl-C."""
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = bool(os.environ.get("DPAUDIT_DEBUG"))
    try:
        return int(args.func(args) or 0)
    except InvalidArgument as exc:  # UsageError included
        if debug:
            raise
        # one line, even when the message quotes a path or value holding a line break
        message = str(exc).replace("\r", "\\r").replace("\n", "\\n")
        print(f"dpaudit: error: {message}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print("dpaudit: interrupted", file=sys.stderr)
        return INTERRUPTED
    except SystemExit as exc:  # no command of dpaudit's exits: code it ran did (a model, trainer or statistic)
        if debug:
            raise
        print(
            f"dpaudit: error: code the command ran (your model, trainer or statistic?) called sys.exit({exc.code!r}),"
            " which ends no dpaudit command: remove the call (DPAUDIT_DEBUG=1 shows where)",
            file=sys.stderr,
        )
        return USAGE_ERROR
    except Exception:
        if debug:
            raise
        traceback.print_exc()
        print(_BUG, file=sys.stderr)
        return INTERNAL_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""``dpaudit report RUN_DIR [RUN_DIR…] [--out DIR]``: the audit report (report.html + report.md) of finished runs."""

from __future__ import annotations

import argparse

from dpaudit.cli.arguments import directory


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="write report.html and report.md for one or several runs", description=__doc__
    )
    p.add_argument("run_dirs", type=directory, nargs="+")
    p.add_argument("--out", type=directory, help="where to write (default: the first run directory)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dpaudit.reporting import audit_report

    html_path, md_path = audit_report.write(args.run_dirs, args.out)
    print(f"wrote {html_path} and {md_path}")
    return 0

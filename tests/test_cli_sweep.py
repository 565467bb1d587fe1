"""Adversarial sweep of ``dpaudit bounds`` and ``dpaudit audit-mechanism``: every numeric option of every subcommand
at 0, -1, 1e-300, 1e300, inf, nan, huge integers and a non-number, run in-process through :func:`dpaudit.cli.main`.

Each invocation must end as a one-line usage error (exit 2) or print a result without NaN and without an infinite
ε that lacks its reason; a traceback (exit 3), a hang past the timeout or a crash fails. Each invocation runs in a
forked child (so a hang or an unbounded allocation is contained: an alarm and an address-space limit) that calls
``main`` directly, so the sweep pays no interpreter start-up. Several hundred invocations: marked slow; run
``python tests/test_cli_sweep.py`` for the counts by outcome.
"""

from __future__ import annotations

import argparse
import collections
import io
import os
import re
import resource
import signal
import sys
import tempfile
import traceback
from contextlib import redirect_stderr, redirect_stdout

import pytest

from dpaudit.cli import build_parser, main

_VALUES = ("0", "-1", "1e-300", "1e300", "inf", "nan", "1000000000000", "1" + "0" * 30, "abc")
_TIMEOUT_S = 30
_ADDRESS_SPACE = 6 * 2**30

# A valid invocation per subcommand; the sweep replaces one option's value at a time.
_BASES = {
    ("bounds", "gaussian"): ["--sigma", "1", "--delta", "1e-5"],
    ("bounds", "dpsgd"): ["--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "100", "--delta", "1e-5"],
    ("bounds", "wishart-vector"): ["--rho", "0.99", "--d", "100", "--r", "10", "--samples", "10000", "--delta", "1e-3"],
    ("bounds", "wishart-m1"): [
        *("--sensitivity", "0.1", "--sigma", "1", "--d", "100", "--r", "10", "--s", "1", "--rho-perp", "0.99"),
        *("--delta", "1e-5"),
    ],
    ("bounds", "wishart-m2"): [
        *("--sensitivity", "1", "--sigma", "2", "--d", "100", "--r", "10", "--samples", "2000"),
        *("--sample-rate", "0.01", "--steps", "10", "--delta", "1e-5"),
    ],
    ("bounds", "sketch"): [
        # Gamma = 2.4e4: both [S] bounds hold, so that every option reaches the arithmetic
        *("--rank", "8", "--tau", "1", "--lr", "0.01", "--smoothness", "1", "--batch-size", "1000"),
        *("--lambda-min", "100", "--grad-bound", "0.1", "--steps", "10", "--sigma-g", "0.1", "--delta", "1e-5"),
    ],
    ("bounds", "prism"): [
        *("--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "100", "--batch-size", "32"),
        *("--m", "64", "--n", "64", "--r", "8", "--a-norm", "1", "--b-norm", "1", "--delta", "1e-5"),
    ],
    **{
        ("audit-mechanism", name): ["--samples", "2000"]
        for name in ("gaussian", "wishart-vector", "wishart-m1", "wishart-m2", "sketch", "projection")
    },
}
_EPSILON_QUERY = ("gaussian", "dpsgd", "wishart-vector", "wishart-m2", "prism")


def _numeric_options(command: str, name: str) -> list[str]:
    parser = build_parser()
    sub = _choices(_choices(parser)[command])[name]
    return [
        action.option_strings[-1]
        for action in sub._actions
        if action.option_strings and action.type in (int, float) and action.dest != "epsilon"
    ]


def _choices(parser: argparse.ArgumentParser) -> dict:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _with(argv: list[str], option: str, value: str) -> list[str]:
    if option not in argv:
        return [*argv, option, value]
    i = argv.index(option)
    return [*argv[: i + 1], value, *argv[i + 2 :]]


def cases() -> list[list[str]]:
    """Every (subcommand, option, value) invocation, plus the base invocations and the epsilon queries."""
    argvs = []
    for (command, name), base in _BASES.items():
        argvs.append([command, name, *base])
        for option in _numeric_options(command, name):
            argvs += [[command, name, *_with(base, option, value)] for value in _VALUES]
        if command == "bounds" and name in _EPSILON_QUERY:
            query = base[: base.index("--delta")]
            argvs += [[command, name, *query, "--epsilon", value] for value in _VALUES]
    return argvs


def _run_in_child(argv: list[str]) -> tuple[str, int, str, str]:
    """(how it ended, exit status or signal, stdout, stderr) of ``main(argv)`` in a forked child."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        pid = os.fork()
        if pid == 0:  # child: bounded time and memory; never returns into pytest
            code = 70
            try:
                resource.setrlimit(resource.RLIMIT_AS, (_ADDRESS_SPACE, _ADDRESS_SPACE))
                signal.alarm(_TIMEOUT_S)  # default action: the child dies by SIGALRM, even inside C code
                stdout, stderr = io.StringIO(), io.StringIO()
                with redirect_stdout(stdout), redirect_stderr(stderr):
                    try:
                        code = main(argv)
                    except SystemExit as exc:  # argparse exits from inside parse_args
                        code = exc.code if isinstance(exc.code, int) else 2
                    except BaseException:  # what the interpreter would print for an uncaught exception
                        traceback.print_exc(file=stderr)
                        code = 1
                out.write(stdout.getvalue())
                err.write(stderr.getvalue())
                out.flush()
                err.flush()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        if os.WIFSIGNALED(status):
            signum = os.WTERMSIG(status)
            return ("hang" if signum == signal.SIGALRM else "killed"), signum, out.read(), err.read()
        return "exited", os.WEXITSTATUS(status), out.read(), err.read()


_NAN = re.compile(r"\bnan\b", re.IGNORECASE)


def _unexplained_infinity(argv: list[str], stdout: str) -> str | None:
    """A printed eps = inf without its reason, if any (the reason follows it on the same line)."""
    for line in stdout.splitlines():
        if argv[0] == "bounds":
            cells = line.split()
            # table rows: "<delta> <epsilon> <bound ...> [invalid: reason]"; epsilon rows: "<eps> <delta> ..."
            if len(cells) >= 2 and "inf" in cells[:2] and "invalid:" not in line and not line.startswith("gauss"):
                return line
        elif re.search(r"eps = +inf\b", line) and "(" not in line.split("eps = ", 1)[1]:
            return line
    return None


def classify(argv: list[str]) -> tuple[str, str]:
    """(outcome, evidence): ``usage`` (exit 2, one line), ``result`` (exit 0, clean), or a failure class."""
    how, code, stdout, stderr = _run_in_child(argv)
    if how != "exited":
        return how, f"signal {code}"
    if code == 2:
        lines = stderr.strip().splitlines()
        if len(lines) == 1 and "Traceback" not in stderr:
            return "usage", lines[0]
        return "usage error not one line", stderr[-400:]
    if code != 0:
        return f"exit {code}", stderr[-400:]
    if _NAN.search(stdout):
        return "NaN printed", next(line for line in stdout.splitlines() if _NAN.search(line))
    unexplained = _unexplained_infinity(argv, stdout)
    if unexplained:
        return "inf without reason", unexplained
    return "result", ""


_OK = ("usage", "result")


@pytest.mark.slow
def test_no_input_to_bounds_or_audit_mechanism_ends_in_a_traceback_nan_or_hang():
    failures = [(argv, *classify(argv)) for argv in cases()]
    failures = [f for f in failures if f[1] not in _OK]
    assert not failures, "\n".join(f"{' '.join(argv)}: {outcome}: {evidence}" for argv, outcome, evidence in failures)


if __name__ == "__main__":
    counts: collections.Counter = collections.Counter()
    for argv in cases():
        outcome, evidence = classify(argv)
        counts[outcome] += 1
        if outcome not in _OK:
            print(f"{outcome:<12} {' '.join(argv)}\n             {evidence.strip().splitlines()[-1] if evidence else ''}")
        sys.stdout.flush()
    print(dict(counts), "of", sum(counts.values()))

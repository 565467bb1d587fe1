"""Adversarial sweep of ``dpaudit bounds`` and ``dpaudit audit-mechanism``: no input ends in a traceback, NaN or hang.

Every numeric option of every subcommand is given 0, -1, 1e-300, 5e-324 (subnormal), 1e300, inf, nan, huge integers
and a non-number (``--epsilon`` also 1e308), one at a time in a valid base invocation, and run through
:func:`dpaudit.cli.main`. Each invocation must end as a one-line usage error (exit 2) or print a result (exit 0,
nothing on stderr: no warning) without NaN and without an infinite ε that lacks its reason; a traceback (exit 3), a
hang past the timeout or a crash fails. An invocation the parser refuses is parsed in the test's own process; every
other one runs in a forked child (a hang or an unbounded allocation is contained by an alarm and an address-space
limit), two at a time, that calls ``main`` directly, so the sweep pays no interpreter start-up. The bases keep each
run cheap (200 audit draws, one accounting step where a step costs PLD work), so the whole sweep of about 1200
invocations needs about 45 CPU seconds. Run
``python tests/test_cli_sweep.py`` for the counts by outcome.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import io
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import traceback
import typing
import warnings
from contextlib import redirect_stderr, redirect_stdout

from dpaudit.cli import build_parser, main

_VALUES = ("0", "-1", "1e-300", "5e-324", "1e300", "inf", "nan", "1000000000000", "1" + "0" * 30, "abc")
# --epsilon also at the edge of float64, where 2 eps overflows
_EPSILONS = (*_VALUES, "1e308")
_TIMEOUT_S = 30
_WORKERS = 2
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
        *("--sensitivity", "1", "--sigma", "2", "--d", "100", "--r", "10", "--samples", "200", "--delta", "1e-5")
    ],
    ("bounds", "sketch"): [
        # Gamma = 2.4e4: both [S] bounds hold, so that every option reaches the arithmetic
        *("--rank", "8", "--tau", "1", "--lr", "0.01", "--smoothness", "1", "--batch-size", "1000"),
        *("--lambda-min", "100", "--grad-bound", "0.1", "--steps", "10", "--sigma-g", "0.1", "--delta", "1e-5"),
    ],
    ("bounds", "prism"): [
        # one full-batch step: the subsampled accountant is swept by dpsgd's base, which PRISM's would repeat
        *("--noise-multiplier", "1", "--sample-rate", "1", "--steps", "1", "--batch-size", "32"),
        *("--m", "64", "--n", "64", "--r", "8", "--a-norm", "1", "--b-norm", "1", "--delta", "1e-5"),
    ],
    **{
        ("audit-mechanism", name): ["--samples", "200"]
        for name in ("gaussian", "wishart-vector", "wishart-m1", "wishart-m2", "sketch", "projection")
    },
}
# Options that only go together, added to their subcommand's base when one of them is swept (and once as a whole):
# the base leaves them out because [W] App. F.2's multi-step account costs about a second per run.
_TOGETHER = {("bounds", "wishart-m2"): ["--sample-rate", "0.01", "--steps", "1"]}
# What the handlers import lazily (so that ``dpaudit bounds`` starts fast): imported once before the first fork, so
# that no child pays for it (scikit-learn alone takes about a second).
_HANDLER_IMPORTS = (
    *("accountants.dpsgd", "accountants.prism", "accountants.sketch", "accountants.wishart"),
    *("dpaudit.release_audit.audit", "dp_accounting.rdp.rdp_privacy_accountant", "sklearn.ensemble"),
)
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
        together = _TOGETHER.get((command, name), [])
        argvs.append([command, name, *base])
        if together:
            argvs.append([command, name, *base, *together])
        for option in _numeric_options(command, name):
            start = [*base, *together] if option in together else base
            argvs += [[command, name, *_with(start, option, value)] for value in _VALUES]
        if command == "bounds" and name in _EPSILON_QUERY:
            query = base[: base.index("--delta")]
            argvs += [[command, name, *query, "--epsilon", value] for value in _EPSILONS]
    return argvs


def _start_child(argv: list[str], out, err) -> int:
    """Fork a child that runs ``main(argv)`` with bounded time and memory, writing its streams to out and err."""
    pid = os.fork()
    if pid:
        return pid
    code = 70  # the child never returns into pytest
    try:
        resource.setrlimit(resource.RLIMIT_AS, (_ADDRESS_SPACE, _ADDRESS_SPACE))
        signal.alarm(_TIMEOUT_S)  # default action: the child dies by SIGALRM, even inside C code
        stdout, stderr = io.StringIO(), io.StringIO()
        with redirect_stdout(stdout), redirect_stderr(stderr), warnings.catch_warnings():
            warnings.simplefilter("always")  # a warning the user would see once must show in every child
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


def _refused_by_parser(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[str, int, str, str] | None:
    """How ``main(argv)`` ends if its parser refuses argv (it exits before any handler runs), else None."""
    stderr = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(stderr):
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            return "exited", exc.code if isinstance(exc.code, int) else 2, "", stderr.getvalue()
    return None


def run_all(argvs: list[list[str]], workers: int = _WORKERS) -> list[tuple[str, int, str, str]]:
    """(how it ended, exit status or signal, stdout, stderr) of ``main(argv)`` for each argv, ``workers`` at a time.

    An argv that ``main``'s parser refuses (a non-number, 1e300 for an integer) ends in the parser, so it is parsed
    here; every other one runs in a forked child.
    """
    for module in _HANDLER_IMPORTS:
        importlib.import_module(module)
    parser = build_parser()
    ends: list[tuple[str, int, str, str] | None] = [None] * len(argvs)
    running: dict[int, tuple[int, typing.IO[str], typing.IO[str]]] = {}
    queue = list(enumerate(argvs))[::-1]
    while queue or running:
        while queue and len(running) < workers:
            index, argv = queue.pop()
            ends[index] = _refused_by_parser(parser, argv)
            if ends[index]:
                continue
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            running[_start_child(argv, out, err)] = (index, out, err)
        if not running:
            continue
        pid, status = os.wait()
        index, child_out, child_err = running.pop(pid)
        with child_out, child_err:
            child_out.seek(0)
            child_err.seek(0)
            if os.WIFSIGNALED(status):
                signum = os.WTERMSIG(status)
                how = "hang" if signum == signal.SIGALRM else "killed"
                ends[index] = how, signum, child_out.read(), child_err.read()
            else:
                ends[index] = "exited", os.WEXITSTATUS(status), child_out.read(), child_err.read()
    return ends  # type: ignore[return-value]


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


def classify(argv: list[str], how: str, code: int, stdout: str, stderr: str) -> tuple[str, str]:
    """(outcome, evidence) of one run: ``usage`` (exit 2, one line), ``result`` (exit 0, clean), or a failure."""
    if how != "exited":
        return how, f"signal {code}"
    if code == 2:
        lines = stderr.strip().splitlines()
        if len(lines) == 1 and "Traceback" not in stderr:
            return "usage", lines[0]
        return "usage error not one line", stderr[-400:]
    if code != 0:
        return f"exit {code}", stderr[-400:]
    if stderr:
        return "stderr on success", stderr[-400:]
    if _NAN.search(stdout):
        return "NaN printed", next(line for line in stdout.splitlines() if _NAN.search(line))
    unexplained = _unexplained_infinity(argv, stdout)
    if unexplained:
        return "inf without reason", unexplained
    return "result", ""


_OK = ("usage", "result")


def test_no_input_to_bounds_or_audit_mechanism_ends_in_a_traceback_nan_warning_or_hang():
    # In a fresh interpreter: the sweep forks, and a pytest process that already ran torch (a 2-thread OpenMP team,
    # loky workers, the engine's background thread) gives forked children locks nobody will release: they hung on a
    # futex in CI at 2 threads. A new interpreter has none of them.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


def sweep() -> int:
    """Run the sweep, print every failure and the counts by outcome; 1 if any failed or a kind of end is missing."""
    argvs = cases()
    counts: collections.Counter = collections.Counter()
    for argv, end in zip(argvs, run_all(argvs)):
        outcome, evidence = classify(argv, *end)
        counts[outcome] += 1
        if outcome not in _OK:
            print(
                f"{outcome:<12} {' '.join(argv)}\n             {evidence.strip().splitlines()[-1] if evidence else ''}"
            )
    print(dict(counts), "of", sum(counts.values()))
    # the sweep reaches both the checks and the arithmetic, and nothing else
    return 0 if set(counts) == set(_OK) else 1


if __name__ == "__main__":
    sys.exit(sweep())

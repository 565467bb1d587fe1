"""CLI: bad input → one line on stderr, exit code 2, no traceback."""

import subprocess
import sys

import pytest

from dpaudit.cli import main


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own errors (e.g. an invalid choice) exit from inside parse_args
        return exc.code


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["audit", "--rank", "0"], "--rank must be an integer >= 1"),
        (["audit", "--rank", "100"], "larger than layer"),
        (["audit", "--models", "1"], "--models must be an even number >= 2"),
        (["audit", "--mechanism", "magic"], "invalid choice: 'magic'"),
        (["audit", "--dataset", "cifar10:/nonexistent/cifar"], "CIFAR-10 binary files missing"),
        (["audit", "--dataset", "mnist"], "unknown dataset 'mnist'"),
        (["audit", "--delta", "2"], "--delta must be in (0, 1)"),
        (["audit", "--epochs", "-3"], "--epochs must be an integer in [1, 1000000]"),
        (["audit", "--lr", "nan"], "--lr must be a number, got NaN"),
    ],
)
def test_bad_audit_input_is_one_line_with_exit_2(argv, expected, capsys, tmp_path):
    rc = _exit_code([*argv, "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2
    assert expected in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_console_script_reports_bad_input_without_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "dpaudit", "audit", "--delta", "2", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["dpaudit: error: --delta must be in (0, 1), got 2.0"]

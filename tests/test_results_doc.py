"""experiments/RESULTS.md is what experiments/make_results.py renders from the committed CSVs (a stale one fails)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EXPERIMENTS / "make_results.py"), "--check", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_committed_results_document_matches_the_csvs():
    done = check()
    assert done.returncode == 0, done.stderr


def test_check_names_the_first_stale_line(tmp_path):
    lines = (EXPERIMENTS / "RESULTS.md").read_text().splitlines(keepends=True)
    number = next(i for i, line in enumerate(lines) if line.startswith("| [W] Table 1"))
    lines[number] = lines[number].replace("|", "| 0.999 |", 1)
    stale = tmp_path / "RESULTS.md"
    stale.write_text("".join(lines))
    done = check("--document", str(stale))
    assert done.returncode == 1
    assert f"line {number + 1}:" in done.stderr and "| 0.999 |" in done.stderr

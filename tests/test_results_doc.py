"""experiments/RESULTS.md is what experiments/make_results.py renders from the committed CSVs (a stale one fails)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

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


# --- the summary table says what its sections show ------------------------------------------------------------------

sys.path.insert(0, str(EXPERIMENTS))
import make_results  # noqa: E402
from results_doc.audits import tangent_share  # noqa: E402
from results_doc.sources import Sources  # noqa: E402

# The verdict words of the rules in results_doc/statistics.py (and "not tested" where the setting differs).
VERDICTS = {"holds", "does not hold", "not resolved", "not resolved (trial-level CI only)", "not tested", "mixed"}
BOLD = re.compile(r"\*\*(.+?)\*\*")
NUMBER = re.compile(r"(?<![\w.])[-−]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.]*\d)")


def _number(text: str) -> float:
    return float(text.replace("−", "-"))


def _decimals(text: str) -> int:
    mantissa = text.split("e")[0]
    return len(mantissa.split(".")[1]) if "." in mantissa else 0


def summary_mismatches(document: str) -> list[str]:
    """Every way the summary table of ``document`` disagrees with the sections it summarises.

    A summary row's section is the one whose code renders it (make_results.SECTIONS, headings matched in the
    document). Each row's verdict cell: every bold phrase is a rule's verdict word (leading word of the phrase) and
    appears in bold in its section; each number of its "ours" cell appears in its section at the shown precision.
    """
    src = Sources(make_results.RESULTS, make_results.PAPER_NUMBERS)
    heading_of = {}
    for render_section in make_results.SECTIONS:
        section = render_section(src)
        heading = section.body.lstrip().splitlines()[0]
        heading_of.update({row[0]: heading for row in section.summary})
    parts = re.split(r"^(## .*)$", document, flags=re.M)
    bodies = {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}
    summary_rows = [
        [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        for line in bodies["## Summary"].splitlines()
        if line.startswith("| ") and not line.startswith("| result |")
    ]
    problems = []
    for label, _paper, ours, verdict in summary_rows:
        body = bodies.get(heading_of.get(label, ""), None)
        if body is None:
            problems.append(f"{label}: no section renders this summary row")
            continue
        body_numbers = [_number(n) for n in NUMBER.findall(body)]
        for phrase in BOLD.findall(verdict):
            if not any(phrase == word or phrase.startswith(f"{word} ") for word in VERDICTS):
                problems.append(f"{label}: '{phrase}' is not a verdict of the rules")
            if f"**{phrase}**" not in body:
                problems.append(f"{label}: verdict '{phrase}' is not in its section")
        for text in NUMBER.findall(ours):
            value, half = _number(text), 0.5 * 10 ** -_decimals(text)
            if not any(abs(found - value) <= half * (1 + 1e-9) for found in body_numbers):
                problems.append(f"{label}: {text} is not in its section")
    return problems


def test_the_summary_matches_the_sections_it_summarises():
    assert summary_mismatches((EXPERIMENTS / "RESULTS.md").read_text()) == []


def test_a_summary_number_or_verdict_its_section_lacks_is_reported():
    document = (EXPERIMENTS / "RESULTS.md").read_text()
    row = next(line for line in document.splitlines() if line.startswith("| [W] Table 2"))
    tampered = row.replace("0.803", "0.813", 1).replace("**holds**", "**yes**", 1)
    problems = summary_mismatches(document.replace(row, tampered))
    assert any("0.813 is not in its section" in p for p in problems)
    assert any("'yes' is not a verdict" in p for p in problems)


# --- the audit-tightness section's numbers -----------------------------------------------------------------------


def test_tangent_share_is_the_mean_tangent_projection_of_a_dirac_canary():
    # E‖P_T(e_i e_jᵀ)‖² over Haar rank-r U (m × r), V (n × r), by explicit QR; and r = m = n projects everything.
    rng = np.random.default_rng(0)
    m, n, r = 12, 6, 2
    u = np.linalg.qr(rng.standard_normal((4000, m, r)))[0][:, 0, :]
    v = np.linalg.qr(rng.standard_normal((4000, n, r)))[0][:, 0, :]
    a, b = np.sum(u**2, axis=1), np.sum(v**2, axis=1)
    assert np.mean(a + b - a * b) == pytest.approx(tangent_share(m, n, r) ** 2, rel=0.05)
    assert tangent_share(5, 5, 5) == 1.0
    assert tangent_share(128, 64, 8) == pytest.approx(0.424, abs=0.001)

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


# μ = 1: q = 1 needs the gradient canary (an input canary is one more member: q = 718/719)
_GDP_CAMPAIGN = "audit --mechanism dp-sgd --epochs 4 --batch-size 718 --noise 2 --canary gradient".split()


def test_trials_for_ratio_prints_a_count_whose_simulated_ceiling_reaches_the_ratio(capsys, tmp_path):
    """At q = 1, σ = 2, T = 4 (μ = 1) the printed count's median simulated GDP bound is >= 0.6 of ε, half of it not."""
    from attacks import ceiling
    from attacks.epsilon import gaussian_dp_epsilon

    out = tmp_path / "run"
    assert main([*_GDP_CAMPAIGN, "--trials-for-ratio", "0.6", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "μ = 1:" in printed and "ε = 4.377" in printed
    trials = int(printed.split(" IN + ")[0].split()[-1])
    assert f"{trials} IN + {trials} OUT trials (--models {2 * trials})" in printed
    epsilon = gaussian_dp_epsilon(1.0, 1e-5)
    assert ceiling.estimator_ceiling(trials, trials, epsilon, 1e-5).gdp >= 0.6
    assert ceiling.estimator_ceiling(trials // 2, trials // 2, epsilon, 1e-5).gdp < 0.6
    assert not out.exists()  # nothing trained, no run directory


@pytest.mark.parametrize(
    "argv,expected",
    [
        ([*_GDP_CAMPAIGN, "--trials-for-ratio", "1"], "--trials-for-ratio 1: a share of the claimed ε lies in (0, 1)"),
        ([*_GDP_CAMPAIGN, "--trials-for-ratio", "-0.2"], "--trials-for-ratio -0.2: a share"),
        ([*_GDP_CAMPAIGN, "--trials-for-ratio", "nan"], "--trials-for-ratio nan: a share"),
        (["audit", "--mechanism", "dp-sgd", "--batch-size", "64", "--trials-for-ratio", "0.8"], "at q = 0.089"),
        ([*_GDP_CAMPAIGN[:-2], "--trials-for-ratio", "0.8"], "applies to μ-GDP claims only"),  # input canary
        ([*_GDP_CAMPAIGN, "--noise", "0", "--trials-for-ratio", "0.8"], "claims NotDp"),
    ],
)
def test_trials_for_ratio_refuses_a_bad_ratio_or_a_claim_that_is_not_gdp(argv, expected, capsys):
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1

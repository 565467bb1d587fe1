"""CLI errors tell the truth: bad input is exit 2 in one line; anything else is a bug, exit 3 with its traceback."""

import json
import math
import re
import subprocess
import sys
import textwrap

import pytest

from dpaudit.cli import build_parser, main

_BUG_LINE = (
    "dpaudit: internal error (a bug, not your input): please report it with the command line and the traceback above"
)


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own errors exit from inside parse_args
        return exc.code


def test_a_planted_internal_error_is_a_traceback_with_exit_3(monkeypatch, capsys):
    from accountants import gaussian

    def broken(*args, **kwargs):
        raise ValueError("planted bug")

    monkeypatch.setattr(gaussian, "epsilon", broken)
    monkeypatch.delenv("DPAUDIT_DEBUG", raising=False)
    assert main(["bounds", "gaussian", "--sigma", "1", "--delta", "1e-5"]) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: planted bug" in err
    assert err.strip().splitlines()[-1] == _BUG_LINE


def test_a_planted_internal_error_is_a_traceback_with_exit_3_in_a_subprocess():
    program = textwrap.dedent(
        """
        import sys
        from accountants import gaussian
        from dpaudit.cli import main

        def broken(*args, **kwargs):
            raise ValueError("planted bug")

        gaussian.epsilon = broken
        sys.exit(main(["bounds", "gaussian", "--sigma", "1", "--delta", "1e-5"]))
        """
    )
    env = {"PATH": "/usr/bin:/bin"}  # no DPAUDIT_DEBUG
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 3
    assert "Traceback" in proc.stderr and "ValueError: planted bug" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == _BUG_LINE


def test_debug_mode_raises_the_internal_error(monkeypatch):
    from accountants import gaussian

    monkeypatch.setattr(gaussian, "epsilon", lambda *a, **k: (_ for _ in ()).throw(ValueError("planted bug")))
    monkeypatch.setenv("DPAUDIT_DEBUG", "1")
    with pytest.raises(ValueError, match="planted bug"):
        main(["bounds", "gaussian", "--sigma", "1", "--delta", "1e-5"])


def test_help_documents_the_exit_codes():
    text = build_parser().format_help()
    assert "exit codes:" in text and "internal error, a bug in dpaudit" in text and "130" in text


@pytest.mark.parametrize(
    "argv,unknown",
    [
        (["audit", "--mode", "4"], "--mode"),  # would abbreviate --model / --models
        (["bounds", "gaussian", "--sigma", "1", "--sens", "2", "--delta", "1e-5"], "--sens"),
        (["audit-mechanism", "gaussian", "--sample", "100"], "--sample"),
    ],
)
def test_abbreviated_options_are_refused(argv, unknown, capsys):
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {unknown}" in err and len(err.strip().splitlines()) == 1


# Values the theorems or the machine cannot take, each refused as a usage error naming its option's parameter.
@pytest.mark.parametrize(
    "argv,expected",
    [
        (
            ["audit-mechanism", "gaussian", "--samples", "1000000000000"],
            "1000000000000 releases per input needs 3.73e+05 GiB, more than the 8 GiB allowed; lower --samples",
        ),
        (["audit-mechanism", "gaussian", "--d", "100000000000"], "lower the dimensions"),
        (["audit-mechanism", "wishart-m1", "--samples", "100", "--training-samples", "10000000000000"], "GiB"),
        (["audit-mechanism", "sketch", "--r", "0"], "--r must be an integer >= 1"),
        (["bounds", "gaussian", "--sigma", "1e-300", "--delta", "1e-5"], "mu = sensitivity / sigma"),
        (
            [
                "bounds",
                "dpsgd",
                "--noise-multiplier",
                "1e300",
                "--sample-rate",
                "0.01",
                "--steps",
                "10",
                "--delta",
                "1e-5",
            ],
            "--noise-multiplier must be in",
        ),
        (
            [
                "bounds",
                "wishart-vector",
                "--rho",
                "0.9",
                "--d",
                "10",
                "--r",
                "2",
                "--samples",
                "1000000000000",
                "--delta",
                "1e-3",
            ],
            "lower --samples",
        ),
        (
            [
                "bounds",
                "prism",
                "--noise-multiplier",
                "1",
                "--sample-rate",
                "0.01",
                "--steps",
                "10",
                "--batch-size",
                "0",
                "--m",
                "8",
                "--n",
                "8",
                "--r",
                "2",
                "--delta",
                "1e-5",
            ],
            "--batch-size must be in",
        ),
    ],
)
def test_huge_or_degenerate_numbers_are_usage_errors(argv, expected, capsys):
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


_SKETCH = ["bounds", "sketch", "--rank", "8", "--tau", "1", "--lr", "0.01", "--smoothness", "1", "--batch-size", "1000"]
_SKETCH += ["--lambda-min", "100", "--grad-bound", "0.1", "--steps", "10", "--delta", "1e-5"]


@pytest.mark.parametrize("option,value", [("--layers", "0"), ("--layers", "-1"), ("--tau", "0"), ("--tau", "-1")])
def test_sketch_refuses_nonsense_counts(option, value, capsys):
    argv = list(_SKETCH)
    if option in argv:
        argv[argv.index(option) + 1] = value
    else:
        argv += [option, value]
    assert _exit_code(argv) == 2
    assert f"{option[2:]} must be an integer >= 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "option,value", [("--lambda-min", "0"), ("--lr", "1e300"), ("--steps", "1000000000000"), ("--grad-bound", "1e300")]
)
def test_sketch_outside_its_theorem_is_inf_with_the_reason(option, value, capsys):
    argv = list(_SKETCH)
    argv[argv.index(option) + 1] = value
    assert main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["bounds"]
    assert {row["valid"] for row in rows} == {False}
    assert all(row["epsilon"] == "inf" and "needs Gamma >" in row["reason"] for row in rows)


def test_dpsgd_with_a_grid_too_large_answers_with_rdp_and_says_so(capsys):
    from accountants import dpsgd

    # sigma = 1e-6: the PLD grid would hold ~10^18 points (3.55 PiB); the RDP accountant answers in milliseconds.
    tiny = dpsgd.epsilon(1e-6, 0.01, 100, 1e-5)
    assert "RDP accountant" in tiny.source and "PLD grid would exceed" in tiny.source
    assert tiny.valid and 1e13 < tiny.epsilon < 1e14  # ~ q^2 T / (2 sigma^2) / ... ; finite, and huge
    many = dpsgd.epsilon(1.0, 0.01, 10**12, 1e-5)
    assert "RDP accountant" in many.source and math.isfinite(many.epsilon)
    assert many.epsilon > dpsgd.epsilon(1.0, 0.01, 10**4, 1e-5).epsilon


def test_rdp_fallback_is_an_upper_bound_on_the_pld_answer(monkeypatch):
    from accountants import dpsgd

    pld = dpsgd.epsilon(1.0, 0.01, 1000, 1e-5)
    monkeypatch.setattr(dpsgd, "_MAX_GRID_POINTS", 10)
    fallback = dpsgd.epsilon(1.0, 0.01, 1000, 1e-5)
    assert "PLD accountant" in pld.source and "RDP accountant" in fallback.source
    assert fallback.epsilon == dpsgd.rdp_epsilon(1.0, 0.01, 1000, 1e-5).epsilon
    assert pld.epsilon < fallback.epsilon < 1.5 * pld.epsilon
    (curve,) = dpsgd.delta_curve(1.0, 0.01, 1000, [pld.epsilon])
    assert curve.delta > 1e-5 * 0.999 and "RDP accountant" in curve.source


@pytest.mark.parametrize(
    "argv,name",
    [
        (["audit-mechanism", "gaussian", "--sensitivity", "1e300"], "sensitivity"),
        (["audit-mechanism", "gaussian", "--sigma", "1e-300"], "sigma"),
        (["audit-mechanism", "wishart-m1", "--sigma", "1e300"], "sigma"),
        (["audit-mechanism", "wishart-m2", "--frobenius", "1e76"], "frobenius_norm"),
        (["audit-mechanism", "sketch", "--sigma-a", "1e300"], "sigma_a"),
        (["audit-mechanism", "sketch", "--sigma-g", "1e-300"], "sigma_g"),
        (["audit-mechanism", "sketch", "--norm-bound", "1e300"], "norm_bound"),
        (["audit-mechanism", "sketch", "--sensitivity", "1e300"], "sensitivity"),
    ],
)
def test_release_scales_whose_squares_overflow_are_refused_with_the_range(argv, name, capsys):
    assert _exit_code([*argv, "--samples", "100"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()  # one line: no RuntimeWarning above it
    assert f"{name} must be in " in line and "[1e-75, 1e+75]" in line and "finite in float64" in line


def test_release_scales_at_the_ends_of_their_range_give_finite_audits(capsys):
    for argv in (["gaussian", "--sensitivity", "1e75", "--sigma", "1e75"], ["sketch", "--sigma-a", "1e-75"]):
        assert main(["audit-mechanism", *argv, "--samples", "200", "--json"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert math.isfinite(result["auc"]) and 0 <= result["auc"] <= 1


_M2 = ["bounds", "wishart-m2", "--sensitivity", "1", "--sigma", "2", "--d", "100", "--r", "10", "--samples", "200"]


def test_m2_spectrum_is_normalised_without_overflow(capsys):
    # Only the shape of the spectrum matters (it is rescaled to |Delta V|_F): 1e300 is the spectrum 1.
    outputs = []
    for value in ("1", "1e300", "1e-300"):
        assert main([*_M2, "--delta", "1e-5", "--singular-values", value, value, "--json"]) == 0
        captured = capsys.readouterr()
        assert captured.err == ""
        outputs.append([row["epsilon"] for row in json.loads(captured.out)["bounds"]])
    assert outputs[0] == outputs[1] == outputs[2]


def test_m2_multistep_below_the_pld_tail_mass_is_inf_with_the_reason(capsys):
    assert main([*_M2, "--sample-rate", "0.01", "--steps", "1", "--delta", "1e-300", "--json"]) == 0
    (row,) = [row for row in json.loads(capsys.readouterr().out)["bounds"] if row["source"] == "[W] Thm 5 + App. F.2"]
    assert row["epsilon"] == "inf" and "infinite privacy loss" in row["reason"]


def test_m1_refuses_a_negative_dimension_before_its_baseline_takes_a_root(capsys):
    argv = ["bounds", "wishart-m1", "--sensitivity", "0.1", "--sigma", "1", "--d", "-1", "--r", "10", "--s", "1"]
    argv += ["--rho-perp", "0.99", "--delta", "1e-5"]
    assert _exit_code(argv) == 2
    assert capsys.readouterr().err.strip() == "dpaudit: error: --d must be an integer >= 1, got -1"


def test_rdp_cross_check_of_a_record_almost_never_sampled_is_zero_without_asking_dp_accounting(monkeypatch):
    from accountants import dpsgd

    def refuse(*args):
        raise AssertionError("the RDP accountant logs negative divergences at this sampling rate")

    monkeypatch.setattr(dpsgd, "_rdp_accountant", refuse)
    for sample_rate in (1e-300, 1e-15):
        bound = dpsgd.rdp_epsilon(1.0, sample_rate, 100, 1e-5)
        assert bound.valid and bound.epsilon == 0.0 and "1 - (1 - q)^T" in bound.source
    monkeypatch.undo()
    # once the record is sampled with probability above delta, the RDP accountant answers as before
    assert dpsgd.rdp_epsilon(1.0, 1e-6, 100, 1e-5).source.endswith("RDP accountant (dp_accounting)")


# Run directories the user names. We run as root, where chmod 000 does not bite: a permission-denied directory is
# simulated by an os.open that raises EACCES for it, a blocked path by a regular file standing in its way (real).
def _deny_opening(monkeypatch, path):
    import errno
    import os

    real_open = os.open

    def denying_open(target, *args, **kwargs):
        if os.fspath(target) == os.fspath(path):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(target))
        return real_open(target, *args, **kwargs)

    monkeypatch.setattr(os, "open", denying_open)


@pytest.mark.parametrize("command", ["resume", "analyse", "report"])
def test_a_run_directory_that_cannot_be_read_is_a_usage_error_naming_it(command, tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _deny_opening(monkeypatch, run_dir)
    assert _exit_code([command, str(run_dir)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"dpaudit: error: cannot read {run_dir} (Permission denied): give this user read and write access to the run "
        "directory (chmod, chown, a writable mount), or copy it"
    )


@pytest.mark.parametrize("command", ["resume", "analyse", "report"])
def test_a_run_directory_below_a_file_is_a_usage_error_naming_it(command, tmp_path, capsys):
    (tmp_path / "file").write_text("not a directory")
    assert _exit_code([command, str(tmp_path / "file" / "run")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"cannot read {tmp_path / 'file' / 'run'} (Not a directory)" in line and "fix the path" in line


def test_the_run_store_writer_and_lock_name_the_path_they_cannot_use(tmp_path, monkeypatch):
    import os

    from dpaudit.campaign.store import RunStore, make_directory, write_file
    from dpaudit.errors import UsageError

    (tmp_path / "file").write_text("not a directory")
    blocked = tmp_path / "file" / "run"
    with pytest.raises(UsageError, match=re.escape(f"cannot create {blocked} (Not a directory)")):
        make_directory(blocked)
    with pytest.raises(UsageError, match=re.escape(f"cannot create {blocked} (Not a directory)")):
        with RunStore(blocked).lock():
            pass
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    real_open = os.open

    def read_only(target, flags, *args, **kwargs):  # what a read-only mount answers to O_CREAT
        if flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", os.fspath(target))
        return real_open(target, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(UsageError, match=re.escape(f"cannot write {run_dir / 'summary.json'} (Permission denied)")):
        write_file(run_dir, "summary.json", b"{}")
    with pytest.raises(UsageError, match=re.escape(f"cannot open {run_dir / '.lock'} (Permission denied)")):
        with RunStore(run_dir).lock():
            pass
    assert list(run_dir.iterdir()) == []

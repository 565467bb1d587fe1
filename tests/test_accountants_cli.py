"""``dpaudit bounds``: every bound name runs, prints the right numbers, and fails cleanly on bad input."""

import json
import subprocess
import sys

import pytest

from dpaudit.cli import main


def _json(capsys, argv):
    assert main(["bounds", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _epsilons(output):
    return {row["source"]: row["epsilon"] for row in output["bounds"]}


def test_gaussian_table_and_json(capsys):
    out = _json(capsys, ["gaussian", "--sigma", "1", "--delta", "1e-5"])
    assert out["bounds"][0]["epsilon"] == pytest.approx(4.3772, abs=1e-4)
    assert out["bounds"][1]["valid"] is False  # classical calibration beyond eps < 1
    assert main(["bounds", "gaussian", "--sigma", "1", "--epsilon", "1", "2"]) == 0
    table = capsys.readouterr().out
    assert "0.1269" in table and "0.02092" in table


def test_wishart_m2_reports_theorem5_mixture_and_gaussian(capsys):
    out = _json(
        capsys, ["wishart-m2", "--sensitivity", "1", "--sigma", "1", "--d", "2000", "--r", "8", "--delta", "1e-5"]
    )
    eps = [row["epsilon"] for row in out["bounds"]]
    assert eps[0] == pytest.approx(0.64, rel=0.02) and eps[1] == pytest.approx(0.26, rel=0.02)
    assert eps[2] == pytest.approx(4.38, rel=0.02)


def test_wishart_vector_reports_theorem1_and_profile(capsys):
    out = _json(
        capsys,
        ["wishart-vector", "--rho", "0.9999", "--d", "400", "--r", "16", "--delta", "0.003", "--samples", "20000"],
    )
    theorem1, profile = out["bounds"]
    assert theorem1["epsilon"] == pytest.approx(5.87, rel=0.02)
    assert profile["epsilon_interval"][0] <= profile["epsilon"] <= profile["epsilon_interval"][1] < theorem1["epsilon"]


@pytest.mark.parametrize(
    "argv",
    [
        ["dpsgd", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "100", "--delta", "1e-5"],
        ["dpsgd", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "100", "--epsilon", "1"],
        [
            "wishart-m1",
            "--sensitivity",
            "0.01",
            "--sigma",
            "1",
            "--d",
            "500",
            "--r",
            "64",
            "--s",
            "4",
            "--rho-perp",
            "0.999999",
            "--k",
            "2",
            "--delta",
            "1e-3",
        ],
        [
            "sketch",
            "--rank",
            "16",
            "--layers",
            "12",
            "--tau",
            "768",
            "--lr",
            "1e-3",
            "--smoothness",
            "1",
            "--batch-size",
            "64",
            "--lambda-min",
            "1e4",
            "--sigma-g",
            "1",
            "--grad-bound",
            "1",
            "--steps",
            "100",
            "--delta",
            "1e-5",
        ],
        [
            "prism",
            "--noise-multiplier",
            "1",
            "--sample-rate",
            "0.01",
            "--steps",
            "100",
            "--batch-size",
            "64",
            "--m",
            "768",
            "--n",
            "768",
            "--r",
            "16",
            "--a-norm",
            "1",
            "--b-norm",
            "1",
            "--delta",
            "1e-5",
        ],
    ],
)
def test_every_bound_runs_and_returns_finite_epsilon(capsys, argv):
    out = _json(capsys, argv)
    assert out["bounds"] and all(row["epsilon"] != "inf" for row in out["bounds"])


def test_sketch_rows_are_conditional(capsys):
    out = _json(
        capsys,
        [
            "sketch",
            "--rank",
            "16",
            "--tau",
            "768",
            "--lr",
            "1e-3",
            "--smoothness",
            "1",
            "--batch-size",
            "64",
            "--lambda-min",
            "1e4",
            "--grad-bound",
            "1",
            "--steps",
            "100",
            "--delta",
            "1e-5",
        ],
    )
    assert all(row["conditional_on"] for row in out["bounds"])


def test_prism_prints_noise_energy(capsys):
    out = _json(
        capsys,
        [
            "prism",
            "--noise-multiplier",
            "1",
            "--sample-rate",
            "0.01",
            "--steps",
            "10",
            "--batch-size",
            "64",
            "--m",
            "768",
            "--n",
            "768",
            "--r",
            "16",
            "--delta",
            "1e-5",
        ],
    )
    assert out["intrinsic noise energy [P] Eq. 21"] == pytest.approx(1 / 64 * (16 * 1520) ** 0.5)


@pytest.mark.parametrize(
    "argv, name",
    [
        (["wishart-m2", "--sensitivity", "1", "--sigma", "0", "--d", "10", "--r", "2", "--delta", "1e-5"], "sigma"),
        (
            ["wishart-m2", "--sensitivity", "1", "--sigma", "1", "--d", "10", "--r", "20", "--delta", "1e-5"],
            "r must be",
        ),
        (["wishart-vector", "--rho", "1.5", "--d", "10", "--r", "2", "--delta", "0.1"], "rho"),
        (["gaussian", "--sigma", "1", "--delta", "2"], "delta"),
    ],
)
def test_bad_parameters_exit_2_with_one_line_naming_them(capsys, argv, name):
    assert main(["bounds", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpaudit: error:") and name in err and err.count("\n") == 1


def test_bounds_path_does_not_import_torch():
    code = (
        "import sys; from dpaudit.cli import main; "
        "main(['bounds', 'dpsgd', '--noise-multiplier', '1', '--sample-rate', '0.01', '--steps', '10', "
        "'--delta', '1e-5']); print('torch' in sys.modules, 'peft' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "False False"

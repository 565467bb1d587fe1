"""Analytic bounds per mechanism (dpaudit.mechanisms.bounds), mechanism options on the CLI, the summary's fields."""

import json
import math

import pytest

from accountants import dpsgd
from dpaudit.campaign import resolve as resolver
from dpaudit.cli import main
from dpaudit.config import CampaignConfig
from dpaudit.mechanisms import bounds
from dpaudit.training import sampling
from tests.claims import analytic_bound

MLP = [bounds.LayerShape(128, 64, 1), bounds.LayerShape(128, 128, 1), bounds.LayerShape(10, 128, 1)]


def test_dp_sgd_family_and_prism_use_the_subsampled_gaussian_accountant():
    """Q = b/N and T = epochs·⌈N/b⌉ from the engine's PoissonLayout: N = 719, b = 32 → q = 32/719, T = 69."""
    expected = dpsgd.epsilon(1.0, 32 / 719, 69, 1e-5).epsilon
    assert expected == pytest.approx(2.6957, abs=1e-3)
    for name in ("dp-sgd", "dp-lora", "dp-lora-fa", "prism"):
        bound = analytic_bound(CampaignConfig(mechanism=name, epochs=3, noise=1.0), 719, MLP)
        assert bound.epsilon == expected and "PLD" in bound.source and bound.reason is None
    denoised = analytic_bound(CampaignConfig(mechanism="dp-sgd", epochs=3, noise=1.0, denoise=True), 719, MLP)
    assert denoised.epsilon == expected  # post-processing


def test_m2_resampled_uses_theorem_5_with_the_smallest_layer_and_one_direction_per_linear_layer():
    config = CampaignConfig(mechanism="m2", rank=8, epochs=3, noise=1.0, resample_projection=True)
    bound = analytic_bound(config, 719, MLP)  # = wishart.m2_multistep_epsilon(1e-5, 1, 1, 64, 8, 3, q, 69)
    assert bound.epsilon == pytest.approx(1.6278, abs=1e-3)
    assert bound.epsilon < 2.6957  # DP-SGD's ε at the same σ, q, T: the projection helps at r = 8 ≪ d = 64
    assert "d = min d_in = 64, s = Σ rank(ΔV_ℓ) = 3" in bound.source
    too_wide = analytic_bound(CampaignConfig(mechanism="m2", rank=64, resample_projection=True), 719, MLP)
    assert too_wide.epsilon is None and "r <= d - 1 = 63" in too_wide.reason


def test_mechanisms_without_a_bound_say_why():
    reasons = {
        name: analytic_bound(CampaignConfig(mechanism=name, **extra), 719, MLP).reason
        for name, extra in (
            ("none", {}),
            ("lora-fa", {}),
            ("m1", {}),
            ("m2", {}),
            ("sketch", {}),
            ("dp-sgd", {"noise": 0.0}),
        )
    }
    assert "not DP at any ε ([W] Prop. 2)" in reasons["lora-fa"] and "not DP" in reasons["none"]
    assert "not DP" in reasons["dp-sgd"]
    assert "M1" in reasons["m1"] and "resample" in reasons["m2"] and "β" in reasons["sketch"]
    one_step = CampaignConfig(mechanism="m2", rank=8, epochs=1, batch_size=719, noise=1.0)
    assert analytic_bound(one_step, 719, MLP).epsilon is not None  # T = 1: fixed M is fresh M


def test_config_normalises_and_checks_mechanism_options():
    assert (CampaignConfig(mechanism="dp-sgd").noise, CampaignConfig(mechanism="dp-sgd").clip) == (1.0, 1.0)
    assert (CampaignConfig(mechanism="sketch").noise, CampaignConfig(mechanism="sketch").clip) == (1.0, None)
    assert CampaignConfig(mechanism="lora-fa").noise is None
    built = resolver.mechanism(CampaignConfig(mechanism="m1", rank=4, noise=0.5, clip=2.0, resample_projection=True))
    assert (built.name, built.rank, built.noise_multiplier, built.clip_norm, built.resample) == (
        "m1",
        4,
        0.5,
        2.0,
        True,
    )
    assert resolver.mechanism(CampaignConfig(mechanism="dp-sgd", noise=0.0, clip=math.inf)).clip_norm == math.inf


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--mechanism", "lora-fa", "--noise", "1"], "--noise does not apply to mechanism 'lora-fa'"),
        (["--mechanism", "dp-sgd", "--noise", "-1"], "--noise must be a finite number >= 0"),
        (["--mechanism", "dp-sgd", "--clip", "0"], "--clip must be in (0, inf]"),
        (["--mechanism", "dp-sgd", "--clip", "inf"], "--clip inf (no clipping) needs --noise 0"),
        (["--mechanism", "sketch", "--clip", "1"], "--clip does not apply to mechanism 'sketch'"),
        (["--mechanism", "prism", "--denoise"], "--denoise does not apply to mechanism 'prism'"),
        (["--mechanism", "dp-sgd", "--noise", "0", "--denoise"], "--denoise needs --noise > 0"),
        (["--mechanism", "dp-lora", "--resample-projection"], "--resample-projection does not apply"),
    ],
)
def test_bad_mechanism_options_are_one_line_with_exit_2(argv, expected, capsys, tmp_path):
    rc = main(["audit", *argv, "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and expected in err and len(err.strip().splitlines()) == 1


def test_poisson_rate_above_one_is_a_usage_error():
    with pytest.raises(Exception, match="--batch-size 800 exceeds the 719 training examples"):
        sampling.PoissonLayout.for_members(719, 800)


def test_audit_json_reports_the_analytic_bound(tmp_path, capsys):
    argv = [
        "audit",
        "--mechanism",
        "dp-sgd",
        "--noise",
        "1",
        "--clip",
        "1",
        "--models",
        "4",
        "--epochs",
        "1",
        "--workers",
        "1",
        "--out",
        str(tmp_path),
        "--json",
        "--quiet",
    ]
    assert main(argv) == 0
    numbers = json.loads(capsys.readouterr().out)
    assert numbers["analytic_epsilon"] == pytest.approx(dpsgd.epsilon(1.0, 32 / 719, 23, 1e-5).epsilon)
    assert "PLD" in numbers["analytic_bound"] and numbers["analytic_reason"] is None
    assert numbers["config"]["noise"] == 1.0 and numbers["config"]["clip"] == 1.0
    assert numbers["analytic_bound"] in (tmp_path / "report.md").read_text()  # the theory-vs-audit table

"""Every mechanism of ``dpaudit audit`` runs at its defaults: a 16-model, one-epoch campaign on digits.

Small on purpose (16 shadow models, one epoch, one worker). Beyond the exit status it checks numbers a wrong
default would change: the command line's config equals the library's defaults, the analytic ε is the DP-SGD
accountant's at the defaults' σ, q and T (or is refused for the reason the mechanism's theory gives), and the
models still learn. PRISM's rank 16 meets a 10-class head: that layer is adapted at rank 10, which the summary
states. It does not check the attack's numbers: 8 + 8 trials say nothing about leakage.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from accountants import dpsgd
from dpaudit import cli, config

# The σ = 1, C = 1 mechanisms whose analytic ε is DP-SGD's subsampled Gaussian at the defaults.
SUBSAMPLED_GAUSSIAN = ("dp-sgd", "dp-lora", "dp-lora-fa", "prism")
# The defaults' claim: digits' 719 private examples (with the canary), batch 32, so q = 32/719 and one epoch is
# ⌈719/32⌉ = 23 steps, at δ = 1e-5.
SAMPLE_RATE, STEPS, DELTA = 32 / 719, 23, 1e-5
# Why the others have no analytic ε at their defaults, as the summary words it.
NO_BOUND = {
    "none": "not DP at any ε",
    "lora-fa": "not DP at any ε",
    "m1": "[W] Thm 3/4",
    "m2": "[W] Thm 5",
    "sketch": "[S] Lemma 7.2",
}


def test_every_training_mechanism_is_covered():
    assert set(config.TRAINING_MECHANISMS) == {*SUBSAMPLED_GAUSSIAN, *NO_BOUND}


@pytest.mark.parametrize("mechanism", config.TRAINING_MECHANISMS)
def test_mechanism_runs_at_its_defaults(mechanism, tmp_path, capsys):
    argv = ["audit", "--mechanism", mechanism, "--models", "16", "--epochs", "1", "--workers", "1"]
    assert cli.main([*argv, "--out", str(tmp_path), "--quiet", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["mechanism"] == mechanism and summary["n_in"] == summary["n_out"] == 8
    # The command line adds nothing of its own: what it ran is the library's default config.
    assert summary["config"] == dataclasses.asdict(config.CampaignConfig(mechanism=mechanism, models=16, epochs=1))
    if mechanism in SUBSAMPLED_GAUSSIAN:
        assert (summary["config"]["noise"], summary["config"]["clip"], summary["delta"]) == (1.0, 1.0, DELTA)
        expected = dpsgd.epsilon(1.0, SAMPLE_RATE, STEPS, DELTA).epsilon  # 1.871
        assert summary["analytic_epsilon"] == pytest.approx(expected, rel=1e-9)
    else:
        assert summary["analytic_epsilon"] is None and NO_BOUND[mechanism] in summary["analytic_reason"]
    # Still learning at the defaults: digits has 10 classes (chance 0.1); every mechanism measured ≥ 0.91.
    assert summary["test_accuracy"] > 0.8
    if mechanism == "prism":
        # digits' MLP: 128×64, 128×128 and the 10-class head; the head is adapted at rank min(16, 10).
        assert "128×64 at r=16, 128×128 at r=16, 10×128 at r=10" in summary["analytic_bound"]

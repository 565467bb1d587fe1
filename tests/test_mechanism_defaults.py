"""Every mechanism of ``dpaudit audit`` runs at its defaults: a 16-model, one-epoch campaign exits 0.

Small on purpose (16 shadow models, one epoch, one worker); what it checks is that no mechanism's defaults are
refused (PRISM's rank 16 meets a 10-class head: that layer is adapted at rank 10, which the summary states).
"""

from __future__ import annotations

import json
import math

import pytest

from dpaudit import cli, config


@pytest.mark.parametrize("mechanism", config.TRAINING_MECHANISMS)
def test_mechanism_runs_at_its_defaults(mechanism, tmp_path, capsys):
    argv = ["audit", "--mechanism", mechanism, "--models", "16", "--epochs", "1", "--workers", "1"]
    assert cli.main([*argv, "--out", str(tmp_path), "--quiet", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["mechanism"] == mechanism and summary["n_in"] == summary["n_out"] == 8
    assert math.isfinite(summary["auc"]) and 0.0 <= summary["auc"] <= 1.0
    if mechanism == "prism":
        # digits' MLP: 128×64, 128×128 and the 10-class head; the head is adapted at rank min(16, 10).
        assert "128×64 at r=16, 128×128 at r=16, 10×128 at r=10" in summary["analytic_bound"]
        assert math.isfinite(summary["analytic_epsilon"])

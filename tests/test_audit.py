"""End-to-end audits on digits: the paper's Table 1 finding, and the null campaign's false-positive rate."""

import json

import numpy as np
import pytest

from dpaudit import analysis
from dpaudit.campaign import runner
from dpaudit.cli import main
from dpaudit.config import CampaignConfig, Execution


@pytest.mark.slow
def test_default_audit_finds_noise_free_lora_fa_not_private(tmp_path, capsys):
    """[W] Table 1 on embedded data: noise-free LoRA-FA r=16, 256 models → AUC ≥ 0.99 and ε lower bound > 2."""
    assert main(["audit", "--out", str(tmp_path), "--json", "--quiet"]) == 0
    numbers = json.loads(capsys.readouterr().out)
    assert numbers["mechanism"] == "lora-fa" and numbers["rank"] == 16
    assert (numbers["n_in"], numbers["n_out"]) == (128, 128)
    assert numbers["auc"] >= 0.99
    assert numbers["epsilon_lower_bound"] > 2
    assert set(numbers["tpr_at_fpr"]) == {"0.1", "0.01", "0.001"}
    assert len(numbers["auc_ci95"]) == 2 and numbers["auc_ci95"][0] <= numbers["auc"] <= numbers["auc_ci95"][1]
    for name in ("summary.json", "scores.csv", "roc.png", "roc_loglog.png", "report.md"):
        assert (tmp_path / name).stat().st_size > 0
    # The run's ROCs are the report's, drawn once.
    assert (tmp_path / "roc.png").read_bytes() == (tmp_path / "report_roc_linear_0.png").read_bytes()
    assert (tmp_path / "roc_loglog.png").read_bytes() == (tmp_path / "report_roc_0.png").read_bytes()
    rows = (tmp_path / "scores.csv").read_text().splitlines()
    assert rows[0] == "model_id,membership,score,test_accuracy" and len(rows) == 257


@pytest.mark.slow
def test_null_campaign_bound_is_zero_for_19_of_20_seeds(tmp_path):
    """Canary never inserted: both groups OUT, so any ε > 0 is a false positive (≤ 5% per run by construction)."""
    zero = 0
    for seed in range(20):
        config = CampaignConfig(models=32, epochs=1, seed=seed, null=True)
        store = runner.run(config, Execution(workers=1, progress=False), tmp_path / str(seed))
        zero += analysis.analyse(store).bound.epsilon == 0
    assert zero >= 19


def test_same_config_and_seed_give_the_same_scores(tmp_path):
    config = CampaignConfig(models=8, epochs=1)
    first, second = (
        analysis.analyse(runner.run(config, Execution(chunk_size=3, workers=1, progress=False), tmp_path / name))
        for name in ("first", "second")
    )
    assert np.array_equal(first.scores, second.scores)

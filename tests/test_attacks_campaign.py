"""Attacks on real shadow models: LiRA and friends, all-examples design (docs/theory.md §3.2; Carlini et al. 2022)."""

import pytest

from dpaudit import analysis
from dpaudit.campaign import runner
from dpaudit.config import CampaignConfig, Execution
from dpaudit.reporting import summary as run_summary


@pytest.fixture(scope="module")
def all_examples_run(tmp_path_factory):
    """64 non-private MLPs on digits, each trained to 100% accuracy on its half of the private pool."""
    config = CampaignConfig(mechanism="none", design="all-examples", models=64, epochs=40, seed=0)
    return runner.run(config, Execution(progress=False), tmp_path_factory.mktemp("all-examples"))


def test_every_attack_reports_auc_and_tpr_and_online_lira_beats_the_loss_attack(all_examples_run):
    """Known values of this campaign: perfect member accuracy, no ε for pooled trials, LiRA above the loss attack."""
    rows = {
        attack: run_summary.summary(analysis.analyse(all_examples_run, attack)) for attack in analysis.OUTPUT_ATTACKS
    }
    assert rows["canary-loss"]["member_accuracy"] == 1.0  # trained to 100% train accuracy
    for numbers in rows.values():
        assert 0.5 <= numbers["auc"] <= 1 and 0 <= numbers["tpr_at_fpr"]["0.001"] <= 1
        assert numbers["epsilon_lower_bound"] is None  # pooled (model, example) pairs are not independent
        low, high = numbers["auc_model_ci95"]  # the models resampled: these trials share them
        assert low <= numbers["auc"] <= high
    assert rows["lira-online"]["auc"] >= 0.6
    assert rows["lira-online"]["tpr_at_fpr"]["0.01"] >= rows["canary-loss"]["tpr_at_fpr"]["0.01"]


def test_analyse_recomputes_the_audit_without_retraining(all_examples_run, capsys):
    """``dpaudit analyse`` leaves the trained chunks untouched and reports the AUC of the saved outputs' scores."""
    import json

    from sklearn.metrics import roc_auc_score

    from dpaudit.cli import main

    before = {p.name: p.stat().st_mtime_ns for p in (all_examples_run.root / "chunks").iterdir()}
    assert main(["analyse", str(all_examples_run.root), "--attack", "rmia", "--json"]) == 0
    numbers = json.loads(capsys.readouterr().out)
    assert {p.name: p.stat().st_mtime_ns for p in (all_examples_run.root / "chunks").iterdir()} == before
    # The AUC over every (model, example) pair, computed here from the stored outputs by scikit-learn.
    plan, outputs = all_examples_run.plan(), all_examples_run.outputs()
    scores = analysis.attack_scores("rmia", plan, outputs)
    assert numbers["attack"] == "rmia"
    assert numbers["auc"] == pytest.approx(roc_auc_score(plan.membership.ravel(), scores.ravel()), abs=1e-12)

"""AdamW in campaigns: the optimiser is post-processing of the privatised gradients (docs/theory.md §2.10)."""

import json

import numpy as np

from dpaudit.campaign.store import RunStore
from dpaudit.cli import main


def _audit(tmp_path, capsys, *options: str) -> tuple[dict, RunStore]:
    out = tmp_path / "-".join(options).replace("--", "") or "sgd"
    argv = ["audit", "--mechanism", "dp-lora", "--noise", "1", "--rank", "4", "--models", "4", "--epochs", "1"]
    assert main([*argv, *options, "--workers", "1", "--quiet", "--json", "--out", str(out)]) == 0
    return json.loads(capsys.readouterr().out), RunStore(out)


def test_dp_lora_with_adamw_claims_what_it_claims_with_sgd_and_trains_other_weights(tmp_path, capsys):
    sgd, sgd_store = _audit(tmp_path, capsys)
    adamw, adamw_store = _audit(tmp_path, capsys, "--optimizer", "adamw")
    assert adamw["config"]["optimizer"] == "adamw" and adamw["config"]["weight_decay"] == 0.01
    assert adamw_store.privacy_event() == sgd_store.privacy_event()  # the same (σ, q, T): the same claim
    assert adamw["analytic_epsilon"] == sgd["analytic_epsilon"] > 0
    assert adamw["verdict"] != "violated" and adamw["epsilon_lower_bound"] <= adamw["analytic_epsilon"]
    assert not np.allclose(adamw_store.outputs().target_outputs, sgd_store.outputs().target_outputs, atol=1e-3)
    assert "AdamW" in adamw["audited"]["training"]

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
    # The MLP is too small to compute its Poisson batches alone fast (docs/performance.md §14): the report says so.
    assert "the chunk's models together, their batches padded to fixed blocks" in adamw["audited"]["engine"]


def test_the_gpu_chunk_estimate_counts_adamws_two_moments(monkeypatch):
    """Per model, 4 float32 copies of the parameters under SGD (weights, grads, momentum, copy), 5 under AdamW."""
    from types import SimpleNamespace

    import torch

    from dpaudit import models
    from dpaudit.campaign import runner

    base = models.mlp(64, 10)
    parameters = sum(p.numel() for p in base.parameters())
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (2 * 10**9, 4 * 10**9))

    def chunk(optimizer: str) -> int:
        setup = SimpleNamespace(
            models=10**6,
            base=base,
            layout=SimpleNamespace(width=0),  # no activations: the parameters' state alone
            dataset=SimpleNamespace(input_shape=(64,)),
            settings=SimpleNamespace(training=SimpleNamespace(optimizer=optimizer)),
        )
        return runner._auto_chunk_size(setup, torch.device("cuda"), workers=1)

    assert chunk("sgd") == 10**9 // (parameters * 4 * 4)
    assert chunk("adamw") == 10**9 // (parameters * 4 * 5)

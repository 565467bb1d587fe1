"""GPT-2, Llama and BERT as they come, under every LoRA mechanism, on the layers peft adapts.

Each model is passed unwrapped: by its class name through the CLI (``--model transformers:CLASS:CONFIG.json``,
docs/models.md §8) or as a ``PreTrainedModel`` object through ``dpaudit.audit``; the two routes alternate over the
12 cases, so that each model and each mechanism goes through both. Every model is tiny (GPT-2 is acceptance 1's
own, ``GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=128)``), 2 shadow models, 1 epoch.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

import dpaudit
from dpaudit import data as data_lib
from dpaudit.campaign import plan, resolve
from dpaudit.campaign import shadow as shadow_lib
from dpaudit.campaign.store import RunStore
from dpaudit.cli import main
from dpaudit.config import CampaignConfig
from dpaudit.data import text
from dpaudit.reporting import audit_report
from dpaudit.seeding import shadow_randomness
from dpaudit.training import engine
from tests.test_hf_models import _token_arrays, bert, llama

transformers = pytest.importorskip("transformers")
_CPU = torch.device("cpu")
_MECHANISMS = ("lora-fa", "dp-lora", "dp-lora-fa", "prism")


def _gpt2_config() -> dict:
    """Acceptance 1's GPT-2 (eager attention: torch's fused attention has no vmap rule on CPU, docs/models.md §3)."""
    return {"n_layer": 2, "n_head": 2, "n_embd": 64, "vocab_size": 256, "n_positions": 128}


# Per model: its class, its config (the CLI's JSON, the same sizes as the object given to dpaudit.audit), the layers
# peft adapts (every Linear/Conv1D but the output head) and that head.
_MODELS = {
    "gpt2": (
        "GPT2LMHeadModel",
        _gpt2_config(),
        [
            f"transformer.h.{i}.{layer}"
            for i in range(2)
            for layer in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
        ],
        "lm_head",
    ),
    "llama": (
        "LlamaForCausalLM",
        {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2},
        [f"model.layers.0.self_attn.{p}_proj" for p in "qkvo"]
        + [f"model.layers.0.mlp.{p}_proj" for p in ("gate", "up", "down")],
        "lm_head",
    ),
    "bert": (
        "BertForSequenceClassification",
        {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2},
        [f"bert.encoder.layer.0.attention.self.{p}" for p in ("query", "key", "value")]
        + [f"bert.encoder.layer.0.{p}.dense" for p in ("attention.output", "intermediate", "output")]
        + ["bert.pooler.dense"],
        "classifier",
    ),
}
_CASES = [
    pytest.param(model, mechanism, (i + j) % 2 == 0, id=f"{model}-{mechanism}-{'cli' if (i + j) % 2 == 0 else 'api'}")
    for i, model in enumerate(_MODELS)
    for j, mechanism in enumerate(_MECHANISMS)
]


def _object(model: str, dataset: data_lib.Dataset) -> torch.nn.Module:
    """The model built by hand, as a user of transformers does, from a fixed seed: a ``PreTrainedModel``."""
    if model == "gpt2":
        config = transformers.GPT2Config(**_gpt2_config(), attn_implementation="eager")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return transformers.GPT2LMHeadModel(config)
    factory = llama if model == "llama" else bert
    return factory(dataset.input_shape, dataset.num_classes)


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    """A byte-level corpus of 24 windows (next-token) and an npz of 60 sequences of 8 token ids with labels."""
    folder = tmp_path_factory.mktemp("data")
    (folder / "corpus.txt").write_bytes(text.corpus()[: 24 * (text.SEQUENCE_LENGTH + 1)])
    x, y = _token_arrays()
    np.savez(folder / "tokens.npz", x=x, y=y)
    return folder


@pytest.mark.parametrize(("model", "mechanism", "cli"), _CASES)
def test_every_lora_mechanism_trains_each_layer_peft_adapts(
    tmp_path, capsys, monkeypatch, data_files, model, mechanism, cli
):
    """The printed layers are peft's, and every one of them moved in every shadow model.

    The run directory keeps the models' outputs, not their weights: the campaign's models are trained again from
    its directory (its plan, base.pt, seeds: :func:`dpaudit.campaign.shadow.train_models`, the function the
    campaign trains chunks with), checked to be the campaign's by their outputs on the targets (equal to the
    stored ones, as another model's would not be), and compared with the models they started as: each adapted
    layer's trained LoRA factors (lora-fa: B, A frozen; dp-lora, prism: A and B; dp-lora-fa: B) differ from their
    start in every model.
    """
    # The report's plots are tests/test_report.py's; drawing them costs about a second each (run_report draws
    # through audit_report).
    monkeypatch.setattr(audit_report, "figure_png", lambda draw, **options: b"")
    class_name, config_values, layers, head = _MODELS[model]
    dataset_spec = f"npz:{data_files / 'tokens.npz'}" if model == "bert" else f"text:{data_files / 'corpus.txt'}"
    out = tmp_path / "run"
    settings = {"design": "all-examples", "rank": 2, "models": 2, "epochs": 1, "batch_size": 4}
    if cli:
        config_file = tmp_path / "config.json"
        config_file.write_text(json.dumps(config_values))
        options = [f"--{key.replace('_', '-')}" for key in settings]
        rc = main(
            ["audit", "--model", f"transformers:{class_name}:{config_file}", "--dataset", dataset_spec]
            + ["--mechanism", mechanism, "--no-pretrain", "--quiet", "--out", str(out)]
            + [part for option, value in zip(options, settings.values()) for part in (option, str(value))]
        )
        assert rc == 0, capsys.readouterr().err
        inputs = None
    else:
        dataset = resolve.load_dataset(dataset_spec, tokens=model == "bert")
        registered = resolve.mechanism(CampaignConfig(mechanism=mechanism, rank=2))
        base = _object(model, dataset)
        assert isinstance(base, transformers.PreTrainedModel)
        dpaudit.audit(base, dataset, registered, out=out, pretrain=False, **settings)
        inputs = resolve.Inputs(dataset, base, registered)
    printed = re.findall(
        r"dpaudit: LoRA adapts (\d+) layer\(s\): (.*); the output head (\S+) is left", capsys.readouterr().err
    )
    assert printed == [(str(len(layers)), ", ".join(layers), head)]

    store = RunStore(out)
    config, inputs = plan.check_inputs(store.config(), resolve.resolve(store.config()) if inputs is None else inputs)
    setup = plan.prepare(config, store, _CPU, inputs)
    randomness = shadow_randomness(config.seed, np.arange(config.models))
    start = engine.build(setup.base, setup.mechanism.parameterization, setup.settings.lora, randomness, _CPU)
    trained = shadow_lib.train_models(setup, randomness, setup.pool_membership, _CPU)
    outputs = shadow_lib.outputs_of(setup, lambda x: engine.logits(trained, x), setup.targets_x, setup.targets_y, 2)
    # The campaign's models (to float32 rounding: its chunk may have run in a worker at another thread count).
    np.testing.assert_allclose(outputs.astype(np.float32), store.outputs().target_outputs, rtol=1e-5, atol=1e-5)

    factors = ("lora_B",) if mechanism in ("lora-fa", "dp-lora-fa") else ("lora_A", "lora_B")
    expected = {f"base_model.model.{layer}.{factor}.default.weight" for layer in layers for factor in factors}
    assert trained.trainable.keys() == expected
    for name, tensor in trained.trainable.items():
        moved = (tensor - start.trainable[name]).flatten(1).abs().amax(1)
        assert (moved > 0).all(), f"{name} did not move in every model"
    for name, tensor in start.frozen.items():  # lora-fa's A and the base stay as they started
        torch.testing.assert_close(trained.frozen[name], tensor, atol=0, rtol=0)

"""``--model transformers:CLASS[:CONFIG.json]`` (docs/models.md §8): a transformers class built from its config.

The data's sizes filled in, small defaults otherwise, the user's JSON over both, weights from the campaign's seed
(so that two fresh runs agree and a resume rebuilds the same model); what dpaudit cannot audit is refused in one
line.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from dpaudit.campaign import resolve
from dpaudit.cli import main
from dpaudit.config import CampaignConfig
from dpaudit.data import text
from dpaudit.models import hugging_face
from dpaudit.reporting import audit_report
from dpaudit.training import gradients
from tests.one_line import one_line_error
from tests.test_hf_models import _token_arrays

transformers = pytest.importorskip("transformers")


def test_a_causal_lm_is_built_small_with_the_datas_sizes():
    """GPT-2 for 64-token byte windows: vocabulary 256, 64 positions, 2 layers of width 64, no dropout, eager."""
    model = hugging_face.build("transformers:GPT2LMHeadModel", (64,), 256, seed=0)
    assert type(model) is transformers.GPT2LMHeadModel
    config = model.config
    assert (config.vocab_size, config.n_positions, config.n_layer, config.n_embd, config.n_head) == (256, 64, 2, 64, 2)
    assert (config.resid_pdrop, config.embd_pdrop, config.attn_pdrop) == (0.0, 0.0, 0.0)
    assert config._attn_implementation == "eager"
    assert config.bos_token_id is None and config.eos_token_id is None  # GPT-2's 50256 is no row of 256
    assert model.transformer.wte.weight.shape == (256, 64)


def test_gpt2s_tied_embedding_is_passed_per_model_and_its_other_layer_norms_and_embeddings_once():
    """LayerNorms' and Embeddings' frozen bases go to vmap once, but not GPT-2's token embedding (its head's too).

    The head is a GEMM, which must stay per model: its rounding can depend on the number of rows.
    """
    model = hugging_face.build("transformers:GPT2LMHeadModel", (16,), 256, seed=0)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert gradients.shared_layers_of(model) == {
        "transformer.wpe",
        "transformer.ln_f",
        *(f"transformer.h.{block}.{norm}" for block in range(2) for norm in ("ln_1", "ln_2")),
    }


def test_a_classifier_takes_the_datas_vocabulary_and_classes_and_the_users_config_over_the_defaults(tmp_path):
    path = tmp_path / "bert.json"
    path.write_text(json.dumps({"hidden_size": 16, "num_hidden_layers": 1, "max_position_embeddings": 32}))
    model = hugging_face.build(f"transformers:BertForSequenceClassification:{path}", (8,), 3, seed=0, vocabulary=40)
    config = model.config
    assert (config.vocab_size, config.num_labels, config.max_position_embeddings) == (40, 3, 32)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (16, 1, 2)
    assert model.classifier.out_features == 3 and model.bert.embeddings.word_embeddings.num_embeddings == 40


def test_the_weights_come_from_the_seed():
    """Two builds with one seed are the same model (torch's global generator left as it was); another seed differs."""
    state = torch.random.get_rng_state()
    first, again, other = (
        hugging_face.build("transformers:LlamaForCausalLM", (8,), 16, seed=seed).state_dict() for seed in (3, 3, 4)
    )
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(text.corpus()[: 24 * (text.SEQUENCE_LENGTH + 1)])
    return path


def _audit(model: str, dataset: str, out) -> int:
    return main(
        ["audit", "--model", model, "--dataset", dataset, "--no-pretrain", "--rank", "2", "--models", "2"]
        + ["--epochs", "1", "--batch-size", "4", "--design", "all-examples", "--quiet", "--out", str(out)]
    )


def test_two_fresh_runs_agree_and_an_interrupted_one_resumes(tmp_path, capsys, monkeypatch, corpus):
    """The model is rebuilt from the campaign's seed: a second run, and a resume, score the models as the first did.

    The resume is of a run whose chunk was lost; its rebuilt model must match the one campaign.json fingerprinted.
    """
    # The plots are tests/test_report.py's (a second each); run_report draws through audit_report.
    monkeypatch.setattr(audit_report, "figure_png", lambda draw, **options: b"")
    config = tmp_path / "llama.json"
    config.write_text(json.dumps({"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1}))
    model = f"transformers:LlamaForCausalLM:{config}"
    for out in ("first", "second"):
        assert _audit(model, f"text:{corpus}", tmp_path / out) == 0, capsys.readouterr().err
    scores = np.loadtxt(tmp_path / "first" / "scores.csv", delimiter=",", skiprows=1, usecols=3)
    assert len(scores) > 0 and np.isfinite(scores).all()
    np.testing.assert_array_equal(
        np.loadtxt(tmp_path / "second" / "scores.csv", delimiter=",", skiprows=1, usecols=3), scores
    )
    shutil.rmtree(tmp_path / "first" / "chunks")
    (tmp_path / "first" / "scores.csv").unlink()
    assert main(["resume", str(tmp_path / "first"), "--quiet"]) == 0, capsys.readouterr().err
    np.testing.assert_array_equal(
        np.loadtxt(tmp_path / "first" / "scores.csv", delimiter=",", skiprows=1, usecols=3), scores
    )


@pytest.mark.parametrize(
    ("model", "config", "message"),
    [
        ("transformers:NoSuchModel", None, "transformers has no class 'NoSuchModel'; name a causal language model"),
        ("transformers:GPT2Config", None, "transformers.GPT2Config is no model class; name a causal language model"),
        ("transformers:BertForQuestionAnswering", None, "dpaudit does not audit BertForQuestionAnswering's task"),
        ("transformers:GPT2LMHeadModel", {"n_embed": 32}, "sets n_embed, which the config class has no field for"),
        ("transformers:GPT2LMHeadModel", {"vocab_size": 50257}, "sets vocab_size 50257, but the data's is 256"),
        ("transformers:GPT2LMHeadModel", {"n_positions": 32}, "sets n_positions 32, not the data's window of 64"),
    ],
)
def test_what_dpaudit_cannot_build_or_audit_is_refused_in_one_line(tmp_path, capsys, corpus, model, config, message):
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
        model = f"{model}:{tmp_path / 'config.json'}"
    assert _audit(model, f"text:{corpus}", tmp_path / "run") == 2
    one_line_error(capsys, message)
    assert not (tmp_path / "run").exists()


def test_a_classifier_on_data_without_token_ids_is_refused_in_one_line(tmp_path, capsys):
    assert _audit("transformers:BertForSequenceClassification", "digits", tmp_path / "run") == 2
    one_line_error(capsys, "a sequence classifier takes token ids, and the data holds none")


def test_a_classifier_is_built_for_the_token_ids_of_an_npz(tmp_path):
    """The npz's x stay token ids (docs/models.md §6); the vocabulary is their largest + 1, the classes its labels'."""
    x, y = _token_arrays()
    np.savez(tmp_path / "tokens.npz", x=x, y=y)
    config = CampaignConfig(
        model="transformers:BertForSequenceClassification", dataset=f"npz:{tmp_path / 'tokens.npz'}"
    )
    inputs = resolve.resolve(config)
    assert inputs.dataset.private.x.dtype == np.int64
    embedding = inputs.architecture.bert.embeddings.word_embeddings
    assert embedding.num_embeddings == x.max() + 1 == 32
    assert inputs.architecture.classifier.out_features == 2

"""Hugging Face models as they come (docs/models.md): raw outputs, tied weights, tasks from the class.

Every model is built from a tiny config (no download). A model whose forward returns a ``ModelOutput``, a dict
with ``logits`` or a tuple is read through its logits everywhere dpaudit calls it; GPT-2's ``lm_head`` is its
token embedding, one parameter trained once with the gradient of both uses.
"""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import pytest
import torch

from dpaudit import models
from dpaudit.cli import main
from dpaudit.data import text
from dpaudit.mechanisms.dpsgd import dp_sgd
from dpaudit.mechanisms.nonprivate import NonPrivate
from dpaudit.seeding import shadow_randomness
from dpaudit.training import engine

transformers = pytest.importorskip("transformers")


def gpt2(input_shape, num_classes):
    """A tiny GPT-2, as it comes: ``GPT2LMHeadModel`` (lm_head tied to wte), eager attention, no dropout."""
    config = transformers.GPT2Config(
        n_layer=1,
        n_head=2,
        n_embd=16,
        vocab_size=num_classes,
        n_positions=input_shape[0],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation="eager",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(config)


def bert(input_shape, num_classes, vocabulary=32):
    """A tiny ``BertForSequenceClassification`` over ``vocabulary`` token ids."""
    config = transformers.BertConfig(
        vocab_size=vocabulary,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=input_shape[0],
        num_labels=num_classes,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attn_implementation="eager",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return transformers.BertForSequenceClassification(config)


@pytest.mark.parametrize(
    "wrap",
    [
        lambda logits: transformers.modeling_outputs.CausalLMOutput(loss=None, logits=logits),
        lambda logits: {"logits": logits, "hidden_states": None},
        lambda logits: (logits, "past key values"),
        lambda logits: logits,
    ],
    ids=["ModelOutput", "dict", "tuple", "tensor"],
)
def test_output_logits_reads_what_hugging_face_models_return(wrap):
    logits = torch.randn(2, 3)
    assert models.output_logits(wrap(logits)) is logits


def test_the_task_comes_from_a_hugging_face_class():
    import peft

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = peft.get_peft_model(gpt2((8,), 16), peft.LoraConfig(r=2, target_modules=["lm_head"]))
    assert models.task_of(gpt2((8,), 16)) == "next-token"
    assert models.task_of(wrapped) == "next-token"  # peft's wrapper answers for the model it holds
    assert models.task_of(bert((8,), 2)) == "classification"


def test_a_raw_gpt2_audits_through_the_cli(tmp_path, monkeypatch):
    """ModelOutput forward and tied lm_head: LoRA-FA on the head trains, [S] Lemma 7.2 is left unmeasured."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(text.corpus()[: 40 * (text.SEQUENCE_LENGTH + 1)])  # 40 windows, 16 private
    out = tmp_path / "run"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(
            ["audit", "--model", "tests.test_hf_models:gpt2", "--dataset", f"text:{corpus}"]
            + ["--no-pretrain", "--rank", "2", "--models", "2", "--epochs", "1", "--quiet", "--out", str(out)]
        )
    assert rc == 0, err.getvalue()
    scores = np.loadtxt(out / "scores.csv", delimiter=",", skiprows=1, usecols=2)
    assert np.isfinite(scores).all() and len(scores) == 2
    # The full-weight retraining behind [S] Lemma 7.2 would move the tied embedding too: not measured.
    assert not (out / "measured.json").exists()


def test_a_tied_weight_is_one_parameter_trained_with_the_gradient_of_every_use():
    """GPT-2's lm_head is wte: full fine-tuning trains it once, with autograd's gradient (both uses), in float64."""
    base = gpt2((8,), 16).double().eval().requires_grad_(False)
    assert models.adapted_layers(base).keys() == {"lm_head"}
    shadow = engine.build(base, "full", None, shadow_randomness(0, np.arange(2)), torch.device("cpu"))
    assert shadow.trainable.keys() == {"transformer.wte.weight"} and shadow.n_models == 2
    x = torch.randint(16, (2, 3, 8), generator=torch.Generator().manual_seed(0))
    y = torch.randint(16, (2, 3, 8), generator=torch.Generator().manual_seed(1))
    gradients = engine.step_gradient_function(shadow, dp_sgd("dp-sgd", 1.0, 1.0))
    per_example = gradients(shadow.trainable, shadow.frozen, x, y, torch.ones(2, 3)).materialise()
    batch = engine.step_gradient_function(shadow, NonPrivate())(shadow.trainable, shadow.frozen, x, y, torch.ones(2, 3))
    for k in range(2):
        expected = []
        for i in range(3):
            model = gpt2((8,), 16).double()
            model.transformer.wte.weight.requires_grad_(True)
            logits = model(x[k, i : i + 1]).logits
            models.mean_loss("next-token", logits, y[k, i : i + 1]).backward()
            expected.append(model.transformer.wte.weight.grad)
        torch.testing.assert_close(per_example["transformer.wte.weight"][k], torch.stack(expected), atol=1e-10, rtol=0)
        torch.testing.assert_close(
            batch["transformer.wte.weight"][k], torch.stack(expected).mean(0), atol=1e-10, rtol=0
        )

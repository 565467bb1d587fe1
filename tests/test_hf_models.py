"""Hugging Face models as they come (docs/models.md): raw outputs, tied weights, tasks from the class.

Every model is built from a tiny config (no download). A model whose forward returns a ``ModelOutput``, a dict
with ``logits`` or a tuple is read through its logits everywhere dpaudit calls it; GPT-2's ``lm_head`` is its
token embedding, one parameter trained once with the gradient of both uses.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch

import dpaudit
from dpaudit import data as data_lib
from dpaudit import models
from dpaudit.campaign.store import RunStore
from dpaudit.cli import main
from dpaudit.config import CampaignConfig
from dpaudit.data import text
from dpaudit.errors import UsageError
from dpaudit.mechanisms.dpsgd import dp_sgd
from dpaudit.mechanisms.nonprivate import NonPrivate, lora_fa
from dpaudit.seeding import shadow_randomness
from dpaudit.training import engine, sampling
from dpaudit.training import gradients as gradients_lib
from tests.one_line import one_line_error

transformers = pytest.importorskip("transformers")
_CPU = torch.device("cpu")
_GPT2_BLOCK = ["transformer.h.0.attn.c_attn", "transformer.h.0.attn.c_proj", "transformer.h.0.mlp.c_fc"]


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
    subclass = type("MyGPT2", (transformers.GPT2LMHeadModel,), {"__module__": "mymodels"})
    assert models.task_of(subclass(gpt2((8,), 16).config)) == "next-token"  # a user's subclass: its base's task


def test_a_raw_gpt2_audits_through_the_cli(tmp_path, capsys):
    """ModelOutput forward, Conv1D layers, tied lm_head: LoRA-FA where peft users put it, [S] Lemma 7.2 unmeasured."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(text.corpus()[: 40 * (text.SEQUENCE_LENGTH + 1)])  # 40 windows, 16 private
    out = tmp_path / "run"
    rc = main(
        ["audit", "--model", "tests.test_hf_models:gpt2", "--dataset", f"text:{corpus}", "--no-pretrain"]
        + ["--rank", "2", "--models", "2", "--epochs", "1", "--quiet", "--out", str(out)]
    )
    err = capsys.readouterr().err
    assert rc == 0, err
    layers = ", ".join([*_GPT2_BLOCK, "transformer.h.0.mlp.c_proj"])
    assert f"LoRA adapts 4 layer(s): {layers}; the output head lm_head is left out" in err
    scores = np.loadtxt(out / "scores.csv", delimiter=",", skiprows=1, usecols=2)
    assert np.isfinite(scores).all() and len(scores) == 2
    # The full-weight retraining behind [S] Lemma 7.2 would move the tied embedding too: not measured.
    assert not (out / "measured.json").exists()


def test_a_tied_weight_is_one_parameter_trained_with_the_gradient_of_every_use():
    """GPT-2's lm_head is wte: full fine-tuning trains it once, with autograd's gradient (both uses), in float64.

    Its Conv1D weights train too, untransposed, with their plain gradients (materialised per example).
    """
    base = gpt2((8,), 16).double().eval().requires_grad_(False)
    conv1d = [*_GPT2_BLOCK, "transformer.h.0.mlp.c_proj"]
    assert list(models.adapted_layers(base)) == [*conv1d, "lm_head"]
    shadow = engine.build(base, "full", None, shadow_randomness(0, np.arange(2)), _CPU)
    trained = {"transformer.wte.weight", *(f"{name}.weight" for name in conv1d)}
    assert shadow.trainable.keys() == trained and shadow.n_models == 2
    x = torch.randint(16, (2, 3, 8), generator=torch.Generator().manual_seed(0))
    y = torch.randint(16, (2, 3, 8), generator=torch.Generator().manual_seed(1))
    gradients = engine.step_gradient_function(shadow, dp_sgd("dp-sgd", 1.0, 1.0))
    per_example = gradients(shadow.trainable, shadow.frozen, x, y, torch.ones(2, 3)).materialise()
    batch = engine.step_gradient_function(shadow, NonPrivate())(shadow.trainable, shadow.frozen, x, y, torch.ones(2, 3))
    for k in range(2):
        expected: dict[str, list[torch.Tensor]] = {name: [] for name in trained}
        for i in range(3):
            model = gpt2((8,), 16).double()
            parameters = dict(model.named_parameters())
            models.mean_loss("next-token", model(x[k, i : i + 1]).logits, y[k, i : i + 1]).backward()
            for name in trained:
                expected[name].append(parameters[name].grad)
        for name, example_gradients in expected.items():
            torch.testing.assert_close(per_example[name][k], torch.stack(example_gradients), atol=1e-10, rtol=0)
            torch.testing.assert_close(batch[name][k], torch.stack(example_gradients).mean(0), atol=1e-10, rtol=0)


def llama(input_shape, num_classes):
    """A tiny ``LlamaForCausalLM`` (untied head), eager attention."""
    config = transformers.LlamaConfig(
        vocab_size=num_classes,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=input_shape[0],
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        attn_implementation="eager",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(config)


_LLAMA_ATTENTION = ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj"]
_LLAMA_LINEAR = [
    *(f"model.layers.0.self_attn.{name}_proj" for name in "qkvo"),
    *(f"model.layers.0.mlp.{name}_proj" for name in ("gate", "up", "down")),
]


@pytest.mark.parametrize(
    ("targets", "adapted"),
    [
        (None, _LLAMA_LINEAR),  # the output head is left out by default
        (("all-linear",), _LLAMA_LINEAR),
        (("q_proj", "v_proj"), _LLAMA_ATTENTION),  # suffixes
        ((r".*\.(q|v)_proj",), _LLAMA_ATTENTION),  # a regular expression over the whole name
        (("model.layers.0.self_attn.q_proj", "lm_head"), [_LLAMA_ATTENTION[0], "lm_head"]),  # full names; the head
    ],
)
def test_lora_targets_are_matched_as_peft_matches_them(targets, adapted):
    assert list(models.lora_layers(llama((8,), 16), targets)) == adapted


@pytest.mark.parametrize(
    ("option", "adapted"),
    [
        ("q_proj,v_proj", _LLAMA_ATTENTION),  # names, split at commas
        (r".*\.(q|v)_pro.{1,1}", _LLAMA_ATTENTION),  # a regular expression, its comma kept
    ],
)
def test_the_command_lines_targets_are_names_or_one_regular_expression_with_its_commas(option, adapted):
    targets = CampaignConfig(mechanism="dp-lora", target_modules=option).target_modules
    assert list(models.lora_layers(llama((8,), 16), targets)) == adapted


def test_a_classifiers_head_is_left_out_by_default():
    assert "classifier" not in models.lora_layers(bert((8,), 2))
    assert "classifier" in models.lora_layers(bert((8,), 2), ("classifier", "query"))


@pytest.mark.parametrize(
    ("factory", "targets", "message"),
    [
        (llama, ("q_proj", "query"), "LoRA target(s) query name no"),
        (llama, ("(q",), "'(q' is no regular expression"),
    ],
)
def test_a_target_that_names_nothing_is_refused_in_one_line(factory, targets, message):
    with pytest.raises(UsageError, match=re.escape(message)) as refused:
        models.lora_layers(factory((8,), 16), targets)
    assert "\n" not in str(refused.value)


def test_lora_fa_on_the_targeted_layers_moves_each_of_them_and_says_which(tmp_path, capsys):
    """LoRA-FA with --target-modules (once refused): the printed layers are the adapted ones, and each one trains."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(text.corpus()[: 40 * (text.SEQUENCE_LENGTH + 1)])
    out = tmp_path / "run"
    rc = main(
        ["audit", "--model", "tests.test_hf_models:llama", "--dataset", f"text:{corpus}", "--no-pretrain"]
        + ["--target-modules", "q_proj,v_proj", "--rank", "2", "--models", "2", "--epochs", "1", "--quiet"]
        + ["--out", str(out)]
    )
    err = capsys.readouterr().err
    assert rc == 0, err
    assert f"LoRA adapts 2 layer(s): {', '.join(_LLAMA_ATTENTION)}; the output head lm_head is left out" in err
    assert not (out / "measured.json").exists()  # [S] Lemma 7.2 on two of eight layers: not measured
    # The same adapter in the engine: after one epoch every adapted layer's B has moved in every model.
    dataset = text.load(str(corpus))
    base = llama(dataset.input_shape, 256).eval().requires_grad_(False)
    randomness = shadow_randomness(0, np.arange(2))
    shadow = engine.build(base, "lora-fa", models.LoraSpec(2, targets=("q_proj", "v_proj")), randomness, _CPU)
    membership = np.ones((2, len(dataset.private)), dtype=bool)
    settings = sampling.TrainingConfig(epochs=1, batch_size=8, lr=0.1)
    engine.train(shadow, lora_fa(), dataset.private.x, dataset.private.y, membership, randomness, settings)
    moved = {name.split(".lora_B")[0].removeprefix("base_model.model.") for name in shadow.trainable}
    assert sorted(moved) == _LLAMA_ATTENTION
    assert all((tensor.flatten(1).abs().amax(1) > 0).all() for tensor in shadow.trainable.values())


def _token_arrays(vocabulary: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """60 sequences of 8 token ids below ``vocabulary``, labelled by whether the first is in its lower half."""
    x = np.random.default_rng(0).integers(vocabulary, size=(60, 8))
    return x, (x[:, 0] < vocabulary // 2).astype(np.int64)


def test_token_ids_reach_a_bert_classifier_as_they_are(tmp_path):
    """Integer ids are never standardised (once: floats, "Expected ... Long", exit 3); the canary is token ids too."""
    x, y = _token_arrays()
    dataset = data_lib.from_arrays(x, y, tokens=True)
    assert dataset.private.x.dtype == np.int64 and set(np.unique(dataset.private.x)) <= set(range(32))
    assert {tuple(row) for row in dataset.private.x} <= {tuple(row) for row in x}
    result = dpaudit.audit(
        bert((8,), 2),
        (x, y),
        dp_sgd("dp-lora", 1.0, 1.0),
        out=tmp_path,
        rank=2,
        models=2,
        epochs=1,
        pretrain=False,
        batch_size=8,
    )
    assert np.isfinite(result.metrics.auc) and result.analytic.epsilon > 0
    # The canary, random token ids (a float one would crash the embedding), labelled by the reference model.
    assert RunStore(tmp_path).plan().target_labels.tolist() in ([0], [1])


@pytest.mark.parametrize(
    ("x", "message"),
    [
        (
            _token_arrays(64)[0],
            "holds token id 63, but the input embedding of --model tests.test_hf_models:bert has 32",
        ),
        (np.where(np.arange(480).reshape(60, 8) == 25, 2.5, _token_arrays()[0]), "x[3, 1] is 2.5, but the model's"),
    ],
)
def test_token_ids_the_embedding_cannot_take_are_refused_in_one_line(tmp_path, capsys, x, message):
    np.savez(tmp_path / "tokens.npz", x=x, y=_token_arrays()[1])
    rc = main(
        ["audit", "--model", "tests.test_hf_models:bert", "--dataset", f"npz:{tmp_path / 'tokens.npz'}"]
        + ["--no-pretrain", "--rank", "2", "--models", "2", "--epochs", "1", "--quiet", "--out", str(tmp_path / "run")]
    )
    assert rc == 2
    one_line_error(capsys, message)


def _gpt2_lora(parameterization: str, models_count: int = 3) -> engine.ShadowModels:
    """Float64 GPT-2s with LoRA of rank 2 on its Conv1D layers (peft's fan_in_fan_out), as peft users target them."""
    base = gpt2((8,), 16).double().eval().requires_grad_(False)
    spec = models.LoraSpec(2, targets=("c_attn", "c_proj", "c_fc"))
    return engine.build(base, parameterization, spec, shadow_randomness(0, np.arange(models_count)), _CPU)


def test_conv1d_layers_are_adapted_and_the_batched_engine_equals_a_per_model_loop():
    """GPT-2's Conv1D (a transposed Linear) under LoRA-FA: every adapted layer moves, batched = looped to 1e-5."""
    rng = np.random.default_rng(0)
    x, y = rng.integers(16, size=(20, 8)), rng.integers(16, size=(20, 8))
    membership = rng.random((3, 20)) < 0.6
    randomness = shadow_randomness(0, np.arange(3))
    settings = sampling.TrainingConfig(epochs=2, batch_size=5, lr=0.5)
    batched = engine.train(_gpt2_lora("lora-fa"), lora_fa(), x, y, membership, randomness, settings)
    looped = engine.train_sequentially(_gpt2_lora("lora-fa"), lora_fa(), x, y, membership, randomness, settings)
    adapted = {name.split(".lora_B")[0].removeprefix("base_model.model.") for name in batched.trainable}
    assert sorted(adapted) == sorted([*_GPT2_BLOCK, "transformer.h.0.mlp.c_proj"])
    for name, tensor in batched.trainable.items():
        assert (tensor.flatten(1).abs().amax(1) > 0).all(), name
        torch.testing.assert_close(tensor, looped.trainable[name], atol=1e-5, rtol=0)


@pytest.mark.parametrize("mechanism", [lora_fa(), dp_sgd("dp-lora", 1.0, 1.0)], ids=lambda m: m.name)
def test_a_gpt2_with_fused_attention_trains_as_its_eager_twin_without_vmaps_per_model_fallback(mechanism):
    """sdpa, transformers' default attention, has no vmap rule: the engine's copies attend eagerly, the same bits."""
    rng = np.random.default_rng(0)
    x, y = rng.integers(16, size=(12, 8)), rng.integers(16, size=(12, 8))
    membership = rng.random((2, 12)) < 0.7
    randomness = shadow_randomness(0, np.arange(2))
    settings = sampling.TrainingConfig(epochs=1, batch_size=4, lr=0.5)
    spec = models.LoraSpec(2, targets=tuple(_GPT2_BLOCK))
    trained = {}
    for implementation in ("sdpa", "eager"):
        base = gpt2((8,), 16).eval().requires_grad_(False)
        base.set_attn_implementation(implementation)
        shadow = engine.build(base, mechanism.parameterization, spec, randomness, _CPU)
        assert base.config._attn_implementation == implementation  # the caller's model is left as it is
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*performance drop because we have not yet implemented")
            trained[implementation] = engine.train(shadow, mechanism, x, y, membership, randomness, settings)
    for name, tensor in trained["eager"].trainable.items():
        assert torch.equal(trained["sdpa"].trainable[name], tensor), name


def test_a_model_without_transformers_attention_is_used_as_it_is():
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    assert models.hugging_face.eager_attention(model) is model
    eager = gpt2((8,), 16)
    assert models.hugging_face.eager_attention(eager) is eager


def test_factored_per_example_gradients_of_conv1d_adapters_are_exact():
    """DP-LoRA's factored per-example gradients on GPT-2's Conv1D adapters equal vmap(grad)'s, in float64."""
    shadow = _gpt2_lora("lora", models_count=2)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # lora_B = 0 would hide lora_A's gradient
        for tensor in shadow.trainable.values():
            tensor.copy_(torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype))
    x, y = torch.randint(16, (2, 3, 8), generator=generator), torch.randint(16, (2, 3, 8), generator=generator)
    weights = torch.ones(2, 3)
    factored = engine.step_gradient_function(shadow, dp_sgd("dp-lora", 1.0, 1.0))
    dense = gradients_lib.gradient_function(shadow.module, per_example=True)
    expected = dense(shadow.trainable, shadow.frozen, x, y, weights)
    got = factored(shadow.trainable, shadow.frozen, x, y, weights)
    assert isinstance(got, gradients_lib.LinearExampleGradients)
    for name, tensor in got.materialise().items():
        torch.testing.assert_close(tensor, expected[name], atol=1e-10, rtol=1e-10)


def test_a_projection_of_transposed_conv1d_weights_is_refused_in_one_line(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(text.corpus()[: 40 * (text.SEQUENCE_LENGTH + 1)])
    rc = main(
        ["audit", "--model", "tests.test_hf_models:gpt2", "--dataset", f"text:{corpus}", "--mechanism", "m2"]
        + ["--no-pretrain", "--rank", "2", "--models", "2", "--epochs", "1", "--quiet", "--out", str(tmp_path / "run")]
    )
    assert rc == 2
    one_line_error(capsys, "transformer.h.0.attn.c_attn is a transformers Conv1D", "use a LoRA mechanism")
    assert not (tmp_path / "run").exists()


def test_pretraining_redraws_every_weight_of_a_gpt2_from_the_seed_conv1d_included():
    """Conv1D has no reset_parameters: GPT-2's own initialiser redraws it, so the factory's draw leaves no trace."""

    def built(global_seed: int) -> torch.nn.Module:
        torch.manual_seed(global_seed)
        config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32)
        return transformers.GPT2LMHeadModel(config)

    first, second = built(1), built(2)
    assert not torch.equal(first.transformer.h[0].attn.c_attn.weight, second.transformer.h[0].attn.c_attn.weight)
    models.initialise(first, 5)
    models.initialise(second, 5)
    for (name, weight), other in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(weight, other), name
    # GPT-2's initialiser: N(0, initializer_range = 0.02) for Conv1D weights.
    assert float(first.transformer.h[0].attn.c_attn.weight.detach().std()) == pytest.approx(0.02, rel=0.1)

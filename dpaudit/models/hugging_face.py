"""Hugging Face models named by their class: ``--model transformers:CLASS[:CONFIG.json]`` (docs/models.md §8).

The model is built offline from its config class, never downloaded: the data's sizes filled in (the vocabulary,
the classes, positions for the window length), small defaults for the rest (2 layers, width 64), the user's JSON
over both, and its weights drawn from the campaign's seed, so that two builds agree. transformers is imported
inside the functions here (seconds): ``dpaudit bounds`` never pays for it.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from dpaudit.errors import UsageError

PREFIX = "transformers:"
# Sizes of a small model where neither the data nor the user's config says: each is set where the config class has it
# (GPT-2's names, n_embd…, through its attribute_map).
SMALL = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
}
# Token ids a config may point at (GPT-2's bos/eos 50256): unset where the vocabulary has no such row.
_SPECIAL_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id")
_SUPPORTED = (
    "a causal language model (GPT2LMHeadModel, LlamaForCausalLM, any *ForCausalLM) or a sequence classifier"
    " (BertForSequenceClassification, any *ForSequenceClassification)"
)


def names_class(spec: str | None) -> bool:
    """Whether ``--model`` ``spec`` names a transformers class (``transformers:CLASS[:CONFIG.json]``)."""
    return spec is not None and spec.startswith(PREFIX)


def _parts(spec: str) -> tuple[str, str | None]:
    """``spec``'s class name and config path (None: no user config)."""
    name, _, path = spec.removeprefix(PREFIX).partition(":")
    return name, path or None


@functools.cache
def task_names() -> dict[str, str]:
    """Class name → task of the classes dpaudit audits (docs/models.md §3).

    transformers' causal-LM auto mapping (``next-token``) and its sequence-classification one (``classification``).
    """
    from transformers.models.auto import modeling_auto  # lazy: seconds to import

    names = {}
    for task, mapping in (
        ("classification", modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES),
        ("next-token", modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
    ):
        for value in mapping.values():
            names.update(dict.fromkeys((value,) if isinstance(value, str) else value, task))
    return names


def model_class(spec: str) -> tuple[Any, str]:
    """The transformers class ``spec`` names and its task, refused in one line unless dpaudit audits its task.

    Raises:
        UsageError: transformers has no such class, it is no ``PreTrainedModel``, or its task is neither causal
            language modelling nor sequence classification (a question-answering model…).
    """
    import transformers  # lazy: seconds to import

    name, _ = _parts(spec)
    found = getattr(transformers, name, None) if name.isidentifier() else None
    if not (isinstance(found, type) and issubclass(found, transformers.PreTrainedModel)):
        what = f"transformers has no class {name!r}" if found is None else f"transformers.{name} is no model class"
        raise UsageError(f"--model {spec}: {what}; name {_SUPPORTED}")
    task = task_names().get(name)
    if task is None:
        raise UsageError(f"--model {spec}: dpaudit does not audit {name}'s task; name {_SUPPORTED}")
    return found, task


def build(
    spec: str, input_shape: tuple[int, ...], num_classes: int, *, seed: int, vocabulary: int | None = None
) -> nn.Module:
    """The model ``spec`` names, built from its config class with its weights drawn from ``seed``.

    Args:
        spec: ``transformers:CLASS`` or ``transformers:CLASS:CONFIG.json`` (the user's config values, a JSON object
            of the config class's fields, e.g. written by ``config.to_json_file``).
        input_shape: (T,): windows of T token ids.
        num_classes: the vocabulary of next-token data, the classes of a classifier's.
        seed: torch's generator is seeded from it around the build (a private fork), so that two builds (a
            campaign and its resume, two fresh runs) give the same weights.
        vocabulary: a classifier's token vocabulary (the data's largest id + 1); None: the config's ``vocab_size``
            must say.

    Returns:
        The model, with ``vocab_size``, ``num_labels`` (classifiers) and the position count (T where the config's
        is unset) filled in from the data, eager attention and dropout 0 unless the config says otherwise.
    """
    import transformers  # lazy: seconds to import

    cls, task = model_class(spec)
    config_class = cls.config_class
    assert config_class is not None, "a transformers model class names its config class"
    aliases = dict(getattr(config_class, "attribute_map", {}))
    defaults = config_class()
    known = {*defaults.to_dict(), *inspect.signature(config_class.__init__).parameters, *aliases}
    known |= {"num_labels", "attn_implementation"}
    given = {aliases.get(key, key): value for key, value in _user_config(spec, known).items()}

    def name(field: str) -> str:
        return aliases.get(field, field)

    values: dict[str, object] = {name(field): size for field, size in SMALL.items() if hasattr(defaults, field)}
    values.update({field: 0.0 for field, value in defaults.to_dict().items() if _dropout(field, value)})
    values["attn_implementation"] = "eager"  # torch's fused attention has no vmap rule on CPU (docs/models.md §3)
    vocab = name("vocab_size")
    # Sizes the data fixes: the logits' last dimension (the vocabulary of next-token data, a classifier's classes).
    required = {vocab: num_classes} if task == "next-token" else {"num_labels": num_classes}
    for field, needed in required.items():
        if given.get(field, needed) != needed:
            raise UsageError(
                f"--model {spec}: the config sets {field} {given[field]}, but the data's is {needed}: leave {field}"
                " out, dpaudit fills it in"
            )
    values.update(required)
    if task == "classification" and vocab not in given:  # a larger vocabulary than the data's ids is the user's
        if vocabulary is None:
            raise UsageError(
                f"--model {spec}: a sequence classifier takes token ids, and the data holds none: give --dataset"
                " npz:PATH with integer token ids x (n, T), or set vocab_size in the config"
            )
        values[vocab] = vocabulary
    positions = name("max_position_embeddings")
    if hasattr(defaults, positions):
        window = input_shape[0]
        values[positions] = window
        if not isinstance(given.get(positions, window), int) or given.get(positions, window) < window:
            raise UsageError(
                f"--model {spec}: the config sets {positions} {given[positions]!r}, not the data's window of {window}"
                f" tokens or more: set it to at least {window} or leave it out"
            )
    values.update(given)
    vocabulary_size = int(values[name("vocab_size")])  # type: ignore[call-overload]
    for field in _SPECIAL_TOKENS:
        token = getattr(defaults, field, None)
        if field not in given and isinstance(token, int) and token >= vocabulary_size:
            values[field] = None
    config = config_class(**values)
    with torch.random.fork_rng(devices=[]):  # module initialisers draw from the global generator: seed a private fork
        torch.manual_seed(seed)
        model = cls(config)
    assert isinstance(model, transformers.PreTrainedModel), "the class was checked to be a PreTrainedModel"
    return model


def eager_attention(model: nn.Module) -> nn.Module:
    """``model``, or a copy of it whose transformers models attend eagerly where they use another implementation.

    torch's fused attention (transformers' default, ``sdpa``) has no ``vmap`` batching rule, so under the engine's
    ``vmap`` torch runs it model by model, and warns; eager attention is the same function, rounded otherwise. 16 raw
    ``GPT2LMHeadModel``s (2 layers of width 64, one epoch of 128 windows of 64 tokens, one thread) trained with lora
    in 3.71 s eagerly against 4.30 s with ``sdpa``, with dp-lora in 6.87 against 7.36 s (docs/performance.md §12).
    Found by duck typing (a module whose ``config`` names its attention implementation): transformers is not
    imported for other models.
    """
    if all(_attention(module) in (None, "eager") for module in model.modules()):
        return model
    model = copy.deepcopy(model)
    attend_eagerly(model)
    return model


def attend_eagerly(model: nn.Module) -> None:
    """:func:`eager_attention` in place, on a model dpaudit owns (a copy): nothing where no module attends otherwise."""
    for module in model.modules():
        if _attention(module) not in (None, "eager"):  # after an outer model's switch its submodels attend eagerly
            cast(Any, module).set_attn_implementation("eager")  # a transformers PreTrainedModel


def _attention(module: nn.Module) -> str | None:
    """The attention implementation of a transformers model (``config._attn_implementation``); None for any other."""
    if not callable(getattr(module, "set_attn_implementation", None)):
        return None
    implementation = getattr(getattr(module, "config", None), "_attn_implementation", None)
    return implementation if isinstance(implementation, str) else None


def _dropout(field: str, value: object) -> bool:
    """Whether config field ``field`` is a dropout probability (``*dropout*``, GPT-2's ``*_pdrop``) that is set."""
    return isinstance(value, float) and ("dropout" in field or field.endswith("pdrop"))


def _user_config(spec: str, known: set[str]) -> dict:
    """The JSON object of ``spec``'s config path ({} without one), its keys checked against the config class's."""
    _, path = _parts(spec)
    if path is None:
        return {}
    try:
        values = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"--model {spec}: cannot read the config {path} ({error}); give a JSON file") from None
    if not isinstance(values, dict):
        raise UsageError(f"--model {spec}: the config {path} holds a {type(values).__name__}, not a JSON object")
    unknown = sorted(set(values) - known)
    if unknown:
        raise UsageError(
            f"--model {spec}: the config {path} sets {', '.join(unknown)}, which the config class has no field for;"
            f" fix the name(s), e.g. {', '.join(sorted(known & {*SMALL, 'vocab_size', 'max_position_embeddings'}))}"
        )
    return values

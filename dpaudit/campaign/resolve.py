"""Names to objects, in one place: ``--dataset``, ``--model`` and ``--mechanism`` become what a campaign audits.

The catalogue (:mod:`dpaudit.mechanisms.catalogue`) says which names exist and which options apply to each, and
:class:`dpaudit.config.CampaignConfig` checks them; this resolver sits above both and builds the objects: a
:class:`dpaudit.data.Dataset` (:func:`load_dataset`), the base model (built-in, ``MODULE:FACTORY`` or
``transformers:CLASS``) and the
:class:`dpaudit.mechanisms.base.Mechanism` (:func:`mechanism`, by the factories of ``_FACTORIES``). Each factory
imports its mechanism's module when called, so resolving one name loads one mechanism family.
:func:`mechanism_options` is the factories' inverse: the config options a mechanism object holds, which
``dpaudit.audit`` records for an object it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from torch import nn

from dpaudit import data as data_lib
from dpaudit import models
from dpaudit.config import PYTHON_OBJECT, CampaignConfig
from dpaudit.errors import UsageError
from dpaudit.mechanisms import catalogue
from dpaudit.mechanisms.base import Mechanism
from dpaudit.models import hugging_face


@dataclass
class Inputs:
    """What a campaign audits: its dataset, its base model (untrained when it is to be pretrained), its mechanism."""

    dataset: data_lib.Dataset
    architecture: nn.Module
    mechanism: Mechanism


def load_dataset(
    spec: str, tokens: bool = False, window: int | None = None, tokenizer: str | None = None
) -> data_lib.Dataset:
    """The dataset ``spec`` (``CampaignConfig.dataset``) names.

    ``digits``, ``breast-cancer``, ``synthetic``, ``cifar10:PATH``, ``npz:PATH`` (:func:`dpaudit.data.from_npz`,
    its ``x`` token ids where ``tokens``), ``csv:PATH`` (:func:`dpaudit.data.from_csv`), ``text`` or ``text:PATH``
    (:func:`dpaudit.data.text.load`, encoded by ``tokenizer``), ``tokens:PATH``
    (:func:`dpaudit.data.text.from_token_npz`); text and tokens in windows of ``window`` tokens.
    """
    embedded: dict[str, Callable[[], data_lib.Dataset]] = {
        "digits": data_lib.digits,
        "breast-cancer": data_lib.breast_cancer,
        "synthetic": data_lib.synthetic,
    }
    if spec in embedded:
        return embedded[spec]()
    kind, _, path = spec.partition(":")
    if kind in ("text", "tokens"):
        from dpaudit.data import text  # the text path only when asked for

        if kind == "text":
            return text.load(path or None, window, tokenizer)
        if path:
            return text.from_token_npz(path, window)
    from_path: dict[str, Callable[[str], data_lib.Dataset]] = {
        "cifar10": data_lib.cifar10,
        "npz": lambda path: data_lib.from_npz(path, tokens),
        "csv": data_lib.from_csv,
    }
    if kind in from_path and path:
        return from_path[kind](path)
    raise UsageError(
        f"unknown dataset {spec!r}: use digits, breast-cancer, synthetic, cifar10:PATH, npz:PATH, csv:PATH, text,"
        " text:PATH or tokens:PATH"
    )


def _non_private(config: CampaignConfig) -> Mechanism:
    from dpaudit.mechanisms.nonprivate import NonPrivate

    return NonPrivate()


def _lora_fa(config: CampaignConfig) -> Mechanism:
    from dpaudit.mechanisms.nonprivate import lora_fa

    return lora_fa()


def _noisy_projection(config: CampaignConfig) -> Mechanism:
    from dpaudit.mechanisms.wishart import NoisyProjection

    assert config.noise is not None and config.clip is not None and config.rank is not None, "config fills them"
    return NoisyProjection(config.rank, config.noise, config.clip, config.mechanism, config.resample_projection)


def _sketch(config: CampaignConfig) -> Mechanism:
    from dpaudit.mechanisms.sketch import NoisyLoraFa

    assert config.noise is not None, "CampaignConfig fills σ_g for the sketch"
    return NoisyLoraFa(config.noise)


def _dp_sgd(config: CampaignConfig) -> Mechanism:
    from dpaudit.mechanisms.dpsgd import dp_sgd
    from dpaudit.mechanisms.mutants import MutatedDpSgd

    assert config.noise is not None and config.clip is not None, "CampaignConfig fills σ and C for DP-SGD"
    correct = dp_sgd(config.mechanism, config.noise, config.clip, config.denoise)
    if config.mutant is None:
        return correct
    return MutatedDpSgd(correct, catalogue.MUTANTS[config.mutant], config.batch_size)


def _prism(config: CampaignConfig) -> Mechanism:
    from dpaudit.mechanisms.prism import PrismMechanism

    assert config.noise is not None and config.clip is not None and config.rank is not None, "config fills them"
    scale = models.LoraSpec(config.rank, config.alpha).scale
    return PrismMechanism(config.noise, config.clip, scale, rank=config.rank)


# Name → its factory, from a config that checked which options apply (the catalogue): one entry per catalogue name.
_FACTORIES: dict[str, Callable[[CampaignConfig], Mechanism]] = {
    "none": _non_private,
    "lora-fa": _lora_fa,
    "m1": _noisy_projection,
    "m2": _noisy_projection,
    "sketch": _sketch,
    "dp-sgd": _dp_sgd,
    "dp-lora": _dp_sgd,
    "dp-lora-fa": _dp_sgd,
    "prism": _prism,
}


def mechanism(config: CampaignConfig) -> Mechanism:
    """The mechanism ``config.mechanism`` with σ = ``config.noise``, C = ``config.clip``, r = ``config.rank``.

    ``config`` has checked which of them apply (:data:`dpaudit.mechanisms.catalogue.MECHANISMS`), so each is given
    only to a mechanism that uses it.
    """
    return _FACTORIES[config.mechanism](config)


# The config option a catalogue mechanism keeps in which attribute (the factories above set them).
_OPTION_ATTRIBUTES = {
    "noise": ("noise_multiplier", "noise_std"),
    "clip": ("clip_norm",),
    "denoise": ("denoise",),
    "resample_projection": ("resample",),
}
MECHANISM_OPTIONS = tuple(_OPTION_ATTRIBUTES)


def mechanism_options(mechanism: Mechanism) -> dict:
    """The config options a catalogue mechanism object holds (σ, C, denoising, resampling), those it has."""
    return {
        option: getattr(mechanism, attribute)
        for option, attributes in _OPTION_ATTRIBUTES.items()
        for attribute in attributes
        if hasattr(mechanism, attribute)
    }


def resolve(config: CampaignConfig) -> Inputs:
    """The dataset, base model and mechanism that the config's names (--dataset, --model, --mechanism) stand for."""
    for option, spec in (("--model", config.model), ("--dataset", config.dataset), ("--mechanism", config.mechanism)):
        if spec is not None and spec.startswith(PYTHON_OBJECT):
            raise UsageError(
                f"{option} {spec} is a Python object given to dpaudit.audit, which no name can rebuild: continue"
                " this run from Python, with dpaudit.audit(..., out=RUN_DIR) and the same objects"
            )
    dataset = load_dataset(config.dataset, window=config.window, tokenizer=config.tokenizer)
    if config.model is None:
        architecture: nn.Module = models.for_input(dataset.input_shape, dataset.num_classes, dataset.task)
        models.initialise(architecture, config.seed)  # the built-in model's weights: from the seed, never global
    else:
        named_class = hugging_face.names_class(config.model)
        npz = config.dataset.startswith("npz:")
        if named_class and npz:
            dataset = load_dataset(config.dataset, tokens=True)  # token ids, as they are (docs/models.md §6)
        architecture = models.from_factory(
            config.model, dataset.input_shape, dataset.num_classes, seed=config.seed, vocabulary=_vocabulary(dataset)
        )
        if npz and not named_class and models.input_vocabulary(architecture) is not None:
            dataset = load_dataset(config.dataset, tokens=True)  # token ids, as they are (docs/models.md §6)
    return Inputs(dataset, architecture, mechanism(config))


def _vocabulary(dataset: data_lib.Dataset) -> int | None:
    """The token vocabulary of ``dataset``: next-token data's, or its largest token id + 1; None: no token ids."""
    if dataset.task == "next-token":
        return dataset.num_classes
    parts = (dataset.public.x, dataset.private.x, dataset.test.x)
    if not all(np.issubdtype(x.dtype, np.integer) for x in parts):
        return None
    return max(int(x.max(initial=0)) for x in parts) + 1

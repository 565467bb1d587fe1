"""``dpaudit.audit`` and ``dpaudit.audit_training``: audits of your own objects and training code from Python.

``audit`` runs a membership-inference campaign of your model, data and mechanism objects; ``audit_training`` calls
your own training function as a black box on neighbouring datasets and judges it against the privacy it claims.

The command line names what it audits (``--model MODULE:FACTORY``, ``--dataset npz:PATH``, ``--mechanism dp-lora``)
and :mod:`dpaudit.campaign.resolve` turns the names into objects; here the objects are given, and the run
directory records their fingerprints (campaign.json: data, model architecture and starting weights, mechanism
parameters, dpaudit version) so that continuing it with other objects is refused, naming what differs.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

import numpy as np
from torch import nn

from dpaudit import analysis, models
from dpaudit import data as data_lib
from dpaudit.analysis.training import TrainingAnalysis, analyse_training
from dpaudit.campaign import resolve as resolver
from dpaudit.campaign import runner
from dpaudit.config import PYTHON_OBJECT, TRAINING_MECHANISMS, CampaignConfig, Execution
from dpaudit.data import training_sets
from dpaudit.errors import UsageError
from dpaudit.mechanisms.base import Mechanism
from dpaudit.reporting import run_report

# Options the objects decide, so not settings of audit(): the data object has its windows and tokens already.
_FROM_OBJECTS = ("mechanism", "dataset", "model", "window", "tokenizer", *resolver.MECHANISM_OPTIONS)
_EXECUTION_FIELDS = tuple(field.name for field in dataclasses.fields(Execution))

_Arguments = ParamSpec("_Arguments")
_Result = TypeVar("_Result")


def _usage_errors_for_calls(function: Callable[_Arguments, _Result]) -> Callable[_Arguments, _Result]:
    """``function`` refusing, as a :class:`UsageError` naming its arguments, a call its signature cannot bind.

    An argument given twice or missing, or a keyword it has not, is bad input like any other: Python's TypeError
    would be a traceback.
    """
    signature = inspect.signature(function)

    @functools.wraps(function)
    def checked(*args: _Arguments.args, **kwargs: _Arguments.kwargs) -> _Result:
        try:
            signature.bind(*args, **kwargs)
        except TypeError as error:
            misplaced = _execution_hint(set(kwargs) - set(signature.parameters))
            arguments = ", ".join(
                f"**{name}" if parameter.kind is parameter.VAR_KEYWORD else name
                for name, parameter in signature.parameters.items()
            )
            raise UsageError(f"{function.__name__}(): {error}{misplaced}; its arguments are {arguments}") from None
        return function(*args, **kwargs)

    return checked


def _execution_hint(names) -> str:
    """For keywords among ``names`` that are :class:`Execution`'s fields: where they go instead."""
    misplaced = [name for name in _EXECUTION_FIELDS if name in names]
    if not misplaced:
        return ""
    given = ", ".join(f"{name}=..." for name in misplaced)
    return f" ({', '.join(misplaced)} says how it runs: give execution=dpaudit.config.Execution({given}))"


def _run_directory(out) -> Path:
    """``out`` as a path; refused unless it is a non-empty path (an empty one would write into the current one)."""
    if not isinstance(out, str | os.PathLike) or not os.fspath(out):
        raise UsageError(f"out must be a non-empty path of the run directory, got {out!r}: give e.g. out='runs/audit'")
    return Path(out)


@_usage_errors_for_calls
def audit(
    model: nn.Module,
    data: data_lib.Dataset | tuple[np.ndarray, np.ndarray],
    mechanism: Mechanism,
    *,
    out: str | Path,
    attack: str | None = None,
    execution: Execution | None = None,
    **settings,
) -> analysis.CampaignAnalysis:
    """Audit ``mechanism`` fine-tuning ``model`` on ``data``; the run directory ``out`` gets the CLI's files.

    Args:
        model: the base model, any ``torch.nn.Module`` with Linear/Conv2d layers for the mechanism to train; it is
            copied, never changed, and pretrained on the public split unless ``pretrain=False``.
        data: a :class:`dpaudit.data.Dataset`, or arrays ``(x, y)`` (x (n, *input_shape), y (n,) integer labels),
            split 40/40/20 (public, private, test) as ``--dataset npz:PATH``'s.
        mechanism: a mechanism object of :mod:`dpaudit.mechanisms` (e.g. ``dp_sgd("dp-lora", 1.0, 1.0)``,
            ``lora_fa()``), whose parameters are the campaign's noise, clip and options; or your own
            :class:`dpaudit.mechanisms.base.Mechanism` subclass (a ``name`` that is not a registered mechanism's),
            whose :meth:`~dpaudit.mechanisms.base.Mechanism.privacy` event the audit is judged against (saved in
            the run directory's privacy.json); ``rank`` then gives it a LoRA adapter of that rank.
        out: the run directory; one that holds this very campaign is continued.
        attack: the membership score (``dpaudit audit --attack``); None: the campaign's default.
        execution: how it runs (:class:`dpaudit.config.Execution`); None: the defaults, without a progress bar.
        **settings: any other :class:`dpaudit.config.CampaignConfig` field (``rank``, ``alpha``, ``models``,
            ``epochs``, ``batch_size``, ``lr``, ``seed``, ``design``, ``pretrain``, ``target_modules``, ``schedule``…).

    Returns:
        The same :class:`dpaudit.analysis.Analysis` as ``dpaudit audit`` (a :class:`~dpaudit.analysis.CampaignAnalysis`:
        its fields, and the campaign's config, attack, accuracies, sketch claim and secret exposure), whose report
        files are written to ``out``.

    Raises:
        UsageError: an argument given twice or missing, a setting that is no CampaignConfig field (one of
            Execution's is named as such), an ``out`` that is no non-empty path, settings the objects decide
            (dataset, model, mechanism and its parameters), objects of the wrong type, a config that does not
            validate, an attack that does not apply to it (:func:`dpaudit.analysis.check_attack`), or a run
            directory holding a different campaign.
    """
    decided = sorted(set(settings) & set(_FROM_OBJECTS))
    if decided:
        raise UsageError(
            f"audit() takes {', '.join(decided)} from its model, data and mechanism objects, not as settings:"
            " leave them out"
        )
    settable = sorted({field.name for field in dataclasses.fields(CampaignConfig)} - set(_FROM_OBJECTS))
    unknown = sorted(set(settings) - set(settable))
    if unknown:
        raise UsageError(
            f"audit() has no setting {', '.join(unknown)}{_execution_hint(unknown)}; its settings are"
            f" {', '.join(settable)} (dpaudit.config.CampaignConfig's fields), besides out, attack and execution"
        )
    out = _run_directory(out)
    if not isinstance(model, nn.Module):
        raise UsageError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(mechanism, Mechanism):
        raise UsageError(
            f"mechanism must be a dpaudit.mechanisms.base.Mechanism, got {type(mechanism).__name__}: build one"
            " with dpaudit.mechanisms or subclass Mechanism"
        )
    tokens = models.input_vocabulary(model) is not None  # token ids stay as they are (docs/models.md §6)
    dataset = data if isinstance(data, data_lib.Dataset) else data_lib.from_arrays(*_pair(data), tokens=tokens)
    registered = mechanism.name in TRAINING_MECHANISMS
    config = CampaignConfig(
        mechanism=mechanism.name if registered else _object_name(mechanism),
        dataset=f"{PYTHON_OBJECT}{dataset.name}",
        model=_object_name(model),
        **(resolver.mechanism_options(mechanism) if registered else {}),
        **settings,
    )
    if registered:
        _check_registered(config, mechanism)
    elif (config.rank is None) != (mechanism.parameterization == "full"):
        raise UsageError(
            f"mechanism {mechanism.name!r} trains parameterization {mechanism.parameterization!r}: give rank=r for a"
            " LoRA one (lora, lora-fa), none for full fine-tuning"
        )
    analysis.check_attack(config, attack)
    inputs = resolver.Inputs(dataset, copy.deepcopy(model), mechanism)
    store = runner.run(config, execution or Execution(progress=False), out, inputs)
    result = analysis.analyse(store, attack)
    run_report.write_run(result, store.root)
    return result


def _pair(data) -> tuple[np.ndarray, np.ndarray]:
    if not (isinstance(data, tuple | list) and len(data) == 2):
        raise UsageError(f"data must be a dpaudit.data.Dataset or arrays (x, y), got {type(data).__name__}")
    return data[0], data[1]


def _examples(name: str, pair) -> tuple[np.ndarray, np.ndarray]:
    """Arrays ``(x, y)`` as a training function takes them.

    Float32 features and int64 labels (integers required), or int64 token windows and their next tokens, (n, L) each.
    """
    if not (isinstance(pair, tuple | list) and len(pair) == 2):
        raise UsageError(f"{name} must be arrays (x, y), got {type(pair).__name__}")
    y = np.asarray(pair[1])
    if y.ndim != 1:  # next-token data: (n, L) token windows and their next tokens
        return training_sets.token_windows(name, pair[0], y)
    x = np.asarray(pair[0], dtype=np.float32)
    if not np.issubdtype(y.dtype, np.integer):
        raise UsageError(f"the labels y of {name} must be integers (class indices), got dtype {y.dtype}")
    return x, y.astype(np.int64)


def _object_name(thing: object) -> str:
    """``python:module.Class``: the config's name of an object no name rebuilds."""
    return f"{PYTHON_OBJECT}{type(thing).__module__}.{type(thing).__qualname__}"


def _check_registered(config: CampaignConfig, mechanism: Mechanism) -> None:
    """The analysis bounds the mechanism the config names: refuse an object that is another one."""
    described = resolver.mechanism(config)
    if repr(described) != repr(mechanism) or type(described) is not type(mechanism):
        raise UsageError(
            f"mechanism {mechanism!r} differs from {described!r}, the {config.mechanism} mechanism its settings"
            " describe, whose privacy the analysis bounds: build it as the registry does (e.g. prism's lora_scale"
            " = alpha / rank)"
        )


@_usage_errors_for_calls
def audit_training(
    model: nn.Module,
    train,
    data: tuple[np.ndarray, np.ndarray],
    *,
    claim,
    out: str | Path,
    trials: int = 200,
    neighbours: str = "add-remove",
    design: str = "many-run",
    canaries: int | None = None,
    seed: int = 0,
    delta: float = 1e-5,
    null: bool = False,
    statistics: dict | None = None,
    canary: tuple[np.ndarray, np.ndarray] | None = None,
    pretrain: tuple[np.ndarray, np.ndarray] | None = None,
    execution: Execution | None = None,
) -> TrainingAnalysis:
    """Audit your own training function against the privacy it claims (``dpaudit audit-training``).

    Args:
        model: the starting model; every trial trains a copy of it (it is never changed), pretrained first with
            ``pretrain``.
        train: ``train(model, x, y, seed) -> torch.nn.Module``: trains a copy of ``model`` on exactly ``x``, ``y``
            with all of its randomness from ``seed`` and returns it. A picklable callable (a module-level function
            or an object of a module-level class) runs in worker processes.
        data: ``(x, y)``, the training set as it is (n ≥ 1): (n, ...) features and (n,) integer class labels, or
            next-token data, (n, L) integer token ids and (n, L) their next tokens (``y[i, t]`` follows
            ``x[i, t]``: :class:`dpaudit.data.text.TextDataset`'s layout); the model then maps (n, L) tokens to
            (n, L, V) logits (a Hugging Face model's ``.logits`` too). docs/training-audit.md §6.
        claim: what the training code claims: a privacy event of :mod:`dpaudit.mechanisms.privacy` (e.g.
            ``SubsampledGaussian(σ, q, T)``, ``ApproxDp(ε, δ)``), an opacus accountant after training (its history),
            or a mapping ``{"noise", "sample_rate", "steps"}`` / ``{"epsilon", "delta"}``.
        out: the run directory; one holding this very audit is continued.
        trials: calls of ``train``; many-run: half with the canary (IN), half without (OUT), an even number.
        neighbours: ``add-remove`` (D = data + canary, D′ = data) or ``replace-one`` (the canary replaces a row).
        design: ``many-run`` (one canary, one membership bit per call) or ``one-run`` (each call trains on a random
            half of ``canaries`` canaries; Steinke et al. 2023).
        canaries: M, the one-run design's canaries.
        seed: every random draw of the audit (the canary, the IN/OUT assignment, each call's seed) comes from it.
        delta: the δ of the ε lower bounds (an (ε, δ) claim's own δ is used for it).
        null: never insert the canary (IN trials train on D′ too): any ε > 0 found is a false positive.
        statistics: your own statistics, name → ``STATISTIC(start, trained, x_c, y_c) -> float``, higher for IN.
        canary: your own canaries ``(x_c, y_c)``: (M, ...) features shaped like ``x``'s rows and (M,) labels (for
            next-token data (M, L) windows and (M, L) next tokens), M = 1 for many-run and ``canaries`` for one-run;
            None: dpaudit draws them (docs/training-audit.md §2).
        pretrain: a public set ``(x_pub, y_pub)``, shaped like ``data`` (not the audited training set): the model
            is first trained on it, once and non-privately, as a campaign pretrains its base
            (:func:`dpaudit.models.pretrain`, deterministic in ``seed``), and every trial starts from that model;
            classification data only.
        execution: how it runs (:class:`dpaudit.config.Execution`: ``workers``, ``backend="dask"`` and
            ``scheduler`` for a cluster, ``progress``; its ``device`` and ``chunk_size`` are a campaign's); None:
            one worker process per CPU core, without a progress bar.

    Returns:
        A :class:`dpaudit.analysis.Analysis`, as :func:`audit` returns (a
        :class:`~dpaudit.analysis.training.TrainingAnalysis`: its fields, what was audited and every statistic's
        metrics), a row per call of ``train``: the ε lower bounds and the verdict against the claim (``analytic``);
        ``out`` gets summary.json, report.html, report.md and the ROC plots.
    """
    from dpaudit.reporting.training_report import write_training_report
    from dpaudit.training_audit import claims, runner

    out = _run_directory(out)
    if not isinstance(model, nn.Module):
        raise UsageError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(train):
        raise UsageError(f"train must be a function train(model, x, y, seed) -> nn.Module, got {type(train).__name__}")
    x, y = _examples("data", data)
    if pretrain is not None and y.ndim == 2:
        raise UsageError(
            "pretrain applies to classification data (dpaudit.models.pretrain); pretrain a language model in your"
            " model factory instead"
        )
    event = claims.claim_event(claim)
    settings = runner.AuditSettings(
        trials=trials,
        neighbours=neighbours,
        design=design,
        seed=seed,
        delta=claims.claim_delta(event, delta),
        canaries=canaries,
        null=null,
    )
    named = train if hasattr(train, "__qualname__") else type(train)
    names = {"trainer": f"{named.__module__}:{named.__qualname__}", "model": type(model).__qualname__}
    store = runner.run(
        model,
        train,
        x,
        y,
        event,
        out,
        settings,
        names=names,
        statistics=statistics,
        canaries=canary,
        pretrain=None if pretrain is None else _examples("pretrain", pretrain),
        execution=execution or Execution(progress=False),
    )
    result = analyse_training(store)
    write_training_report(result, store.root)
    return result

"""Shadow models trained in chunks: what a worker gets (:class:`Setup`) and what it returns (outputs on disk).

A chunk of models is trained by the engine with the campaign's mechanism, one torch thread and the campaign's
precision, and returns only its outputs on the targets and the population (:class:`.store.ChunkOutputs`);
models whose outputs are not finite are refused (:class:`Diverged`) rather than stored as finished.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from dpaudit import data as data_lib
from dpaudit import models
from dpaudit.campaign.store import ChunkOutputs
from dpaudit.config import CampaignConfig
from dpaudit.data import text
from dpaudit.mechanisms.base import Mechanism
from dpaudit.seeding import ModelRandomness, shadow_randomness
from dpaudit.training import canaries as canary_lib
from dpaudit.training import engine, sampling
from dpaudit.user_code import blamed_on_user, source_files

_LOGIT_ELEMENTS = 2**24  # next-token logits materialised at once while a chunk's outputs are summarised (64 MiB)


@dataclass(frozen=True)
class ShadowSettings:
    """The config's settings as shadow training takes them, decoded once (:func:`settings_of`).

    ``training``: epochs, batch size, learning rate and schedule; ``lora``: the adapter (None for full fine-tuning);
    ``precision``: fp32 or bf16 (autocast); ``observe``: what the gradient canaries record.
    """

    seed: int
    training: sampling.TrainingConfig
    lora: models.LoraSpec | None
    precision: str
    observe: str


@dataclass
class Setup:
    """Everything a chunk needs to train its models, decoded from the config once; picklable, sent to each worker.

    ``settings`` are the config's settings as the engine and the canaries take them (:class:`ShadowSettings`);
    workers never see the :class:`dpaudit.config.CampaignConfig`.
    """

    settings: ShadowSettings
    dataset: data_lib.Dataset
    base: nn.Module
    mechanism: Mechanism
    pool_x: np.ndarray  # the fine-tuning pool (private split, plus the canary in the canary design)
    pool_y: np.ndarray
    pool_membership: np.ndarray  # (models, pool) bool: what each model trains on
    target_index: np.ndarray  # (targets,) pool rows the attack targets (none for gradient canaries)
    layout: sampling.BatchLayout
    canaries: canary_lib.GradientCanaries | None = None  # gradient canaries, inserted by the engine
    canary_membership: np.ndarray | None = None  # (models, canaries) bool: which gradient canaries each model gets
    # Next-token campaigns with secret canaries: the windows of the candidates the secrets' exposure is ranked in.
    exposure_candidates: np.ndarray | None = None
    # The user's model as its option names it (``--model mymodels:make``), whose failures while training are the
    # user's errors (:func:`dpaudit.user_code.blamed_on_user`); None: dpaudit's built-in model.
    users_model: str | None = None
    # Whether a Poisson step computes each model alone on its sampled examples (engine.train's exact_batches),
    # decided once for a run's session (with_exact_batches); None: the engine decides per chunk.
    exact_batches: bool | None = None

    @property
    def models(self) -> int:
        """The campaign's shadow model count."""
        return len(self.pool_membership)

    @property
    def targets_x(self) -> np.ndarray:
        return self.pool_x[self.target_index]

    @property
    def targets_y(self) -> np.ndarray:
        return self.pool_y[self.target_index]


def lora_spec(config: CampaignConfig) -> models.LoraSpec | None:
    """The LoRA adapter ``config`` trains or measures; None for full fine-tuning (no rank)."""
    if config.rank is None:
        return None
    return models.LoraSpec(config.rank, config.alpha, config.target_modules)


def training_settings(config: CampaignConfig) -> sampling.TrainingConfig:
    """The engine's SGD settings of ``config``."""
    return sampling.TrainingConfig(
        epochs=config.epochs,
        batch_size=config.batch_size,
        lr=config.lr,
        momentum=config.momentum,
        schedule=config.schedule,
        optimizer=config.optimizer,
        weight_decay=config.weight_decay or 0.0,
    )


def settings_of(config: CampaignConfig) -> ShadowSettings:
    """``config`` decoded for shadow training (:class:`ShadowSettings`)."""
    return ShadowSettings(
        config.seed, training_settings(config), lora_spec(config), config.precision, str(config.observe)
    )


@contextmanager
def one_thread_precision(precision: str, device: torch.device) -> Iterator[None]:
    """One torch thread (:func:`dpaudit.models.one_thread`) and the campaign's precision."""
    with models.one_thread(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        yield


def train_models(
    setup: Setup,
    randomness: list[ModelRandomness],
    membership: np.ndarray,
    device: torch.device,
    on_step: Callable[[int], None] | None = None,
    canaries: canary_lib.CanaryRun | None = None,
) -> engine.ShadowModels:
    """Models of ``setup`` with ``randomness`` and ``membership`` rows trained on ``device``, one torch thread."""
    shadow = engine.build(setup.base, setup.mechanism.parameterization, setup.settings.lora, randomness, device)
    with one_thread_precision(setup.settings.precision, device):
        engine.train(
            shadow,
            setup.mechanism,
            setup.pool_x,
            setup.pool_y,
            membership,
            randomness,
            setup.settings.training,
            setup.layout,
            on_step,
            canaries,
            exact_batches=setup.exact_batches,
        )
    return shadow


def with_exact_batches(setup: Setup, device: torch.device) -> Setup:
    """``setup`` with the engine's choice for its Poisson steps on ``device`` made once (:attr:`Setup.exact_batches`).

    Each model alone on the examples it sampled, or the chunk's models together on batches padded to fixed blocks,
    as :func:`dpaudit.training.engine.exact_batches_default` chooses for the model and the device: the same
    arithmetic either way, whichever is faster there. Shuffled steps: False (the models together).
    """
    alone = False
    if setup.mechanism.sampling == "poisson" and device.type == "cpu":
        randomness = shadow_randomness(setup.settings.seed, np.arange(1))
        with blamed_on_model(setup, "counting the operations of one example's forward pass"):
            shadow = engine.build(setup.base, setup.mechanism.parameterization, setup.settings.lora, randomness, device)
            alone = engine.exact_batches_default(shadow, setup.pool_x, device)
    return dataclasses.replace(setup, exact_batches=alone)


def engine_words(setup: Setup, device: torch.device, chunk_size: int, workers: int) -> str:
    """How the engine computes ``setup``'s shadow models on ``device``, in words (the report's "engine" row)."""
    where = f"batched, {chunk_size} models a chunk, {workers} worker{'s' if workers > 1 else ''} on {device}"
    if setup.mechanism.sampling != "poisson":
        return f"{where}; each step computes the chunk's models together"
    if setup.exact_batches:
        return (
            f"{where}; each Poisson step computes each model alone on the examples it sampled (for a model of this"
            " size on CPU, faster than the models together on padded batches)"
        )
    return f"{where}; each Poisson step computes the chunk's models together, their batches padded to fixed blocks"


class Diverged(Exception):
    """Shadow models whose outputs are not finite (their training diverged); ``args[0]``: their indices."""


def train_chunk(
    setup: Setup, indices: np.ndarray, device: torch.device, on_step: Callable[[int], None] | None = None
) -> ChunkOutputs:
    """Train shadow models ``indices`` and return their outputs on the targets and the population (test split).

    Training and scoring run on one torch thread (:func:`dpaudit.models.one_thread`), in a worker or in the driver
    alike. Raises :class:`Diverged` rather than return non-finite outputs (which would be stored as finished), and a
    :class:`dpaudit.errors.UsageError` naming the user's model if it fails (in a worker, so that the error, not a
    traceback of another process, reaches the driver).
    """
    # One retained heap for the chunk's training and the summaries of its outputs (engine.retained_heap).
    stage = f"training shadow models {indices[0]}-{indices[-1]}"
    with blamed_on_model(setup, stage), models.one_thread(), engine.retained_heap():
        return _trained_chunk(setup, indices, device, on_step)


def blamed_on_model(setup: Setup, stage: str) -> AbstractContextManager:
    """:func:`dpaudit.user_code.blamed_on_user` for ``setup``'s model during ``stage``; nothing for dpaudit's own."""
    if setup.users_model is None:
        return nullcontext()
    return blamed_on_user(setup.users_model, stage, source_files(list(setup.base.modules())))


def _trained_chunk(
    setup: Setup, indices: np.ndarray, device: torch.device, on_step: Callable[[int], None] | None
) -> ChunkOutputs:
    randomness = shadow_randomness(setup.settings.seed, indices)
    canaries = None
    if setup.canaries is not None and setup.canary_membership is not None:
        canaries = canary_lib.CanaryRun(setup.canaries, setup.canary_membership[indices], setup.settings.observe)
    shadow = train_models(setup, randomness, setup.pool_membership[indices], device, on_step, canaries)
    observations = shadow.canary_observations
    forward, k, test = functools.partial(engine.logits, shadow), len(indices), setup.dataset.test
    candidates = None
    if setup.exposure_candidates is not None:
        windows = setup.exposure_candidates
        candidates = outputs_of(setup, forward, windows[:, :-1], windows[:, 1:], k)[..., 0]
    outputs = ChunkOutputs(
        indices=np.asarray(indices, dtype=np.int64),
        target_outputs=outputs_of(setup, forward, setup.targets_x, setup.targets_y, k).astype(np.float32),
        population_outputs=outputs_of(setup, forward, test.x, test.y, k).astype(np.float32),
        canary_observations=None if observations is None else observations.cpu().numpy(),
        candidate_log_likelihoods=candidates,
    )
    produced = (outputs.target_outputs, outputs.population_outputs, outputs.canary_observations, candidates)
    finite = np.logical_and.reduce([np.isfinite(a.reshape(len(a), -1)).all(axis=1) for a in produced if a is not None])
    if not finite.all():
        raise Diverged(tuple(int(i) for i in outputs.indices[~finite]))
    return outputs


def outputs_of(
    setup: Setup, forward: Callable[[np.ndarray], torch.Tensor], x: np.ndarray, y: np.ndarray, models: int = 1
) -> np.ndarray:
    """The outputs of ``models`` models on examples (x, y), as :class:`dpaudit.store.Plan` defines them.

    ``forward``: logits of the base model, or of K shadow models (:func:`dpaudit.engine.logits`). Classification:
    the logits. Next-token: :func:`dpaudit.text.sequence_summaries`, from the logits of a few sequences at a time.
    """
    if setup.dataset.task != "next-token":
        return forward(x).cpu().numpy()
    rows = max(1, _LOGIT_ELEMENTS // (models * x.shape[1] * setup.dataset.num_classes))
    parts = []
    for first in range(0, max(len(x), 1), rows):  # no sequences still run one empty batch: a (…, 0, 2) result
        logits = forward(x[first : first + rows])
        parts.append(text.sequence_summaries(logits, torch.from_numpy(y[first : first + rows]).to(logits.device)))
    return torch.cat(parts, dim=-2).cpu().numpy()

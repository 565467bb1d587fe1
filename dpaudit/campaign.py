"""A membership-inference campaign: plan, shadow training in chunks, canary scores ([W] App. F.1).

Data flow (ARCHITECTURE.md): config → :class:`Setup` (pretrained base, canary, membership plan) → chunks of
shadow models trained by the engine → per-model canary logits → scores → statistics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import nn

from attacks import canary as canary_lib
from attacks import designs, scores as score_lib
from dpaudit import data as data_lib
from dpaudit import engine, models
from dpaudit.config import CampaignConfig
from dpaudit.mechanisms import Mechanism, registry
from dpaudit.seeding import ModelRandomness, campaign_rng, shadow_randomness


@dataclass(frozen=True)
class Canary:
    """The static-poison canary (x_q, y_q) of [W] App. F.1, SPEC §3."""

    x: np.ndarray  # (1, *input_shape)
    label: int


@dataclass
class Setup:
    """Everything every chunk needs, derived deterministically from the config."""

    config: CampaignConfig
    dataset: data_lib.Dataset
    base: nn.Module
    mechanism: Mechanism
    canary: Canary
    pool_x: np.ndarray  # private pool followed by the canary
    pool_y: np.ndarray
    group_in: np.ndarray  # (models,) bool: the design's IN group
    canary_in: np.ndarray  # (models,) bool: the model trains with the canary (= group_in unless null campaign)
    layout: engine.BatchLayout
    device: torch.device

    @property
    def lora(self) -> models.LoraSpec:
        return models.LoraSpec(self.config.rank, self.config.alpha)

    def membership(self, indices: np.ndarray) -> np.ndarray:
        """(len(indices), n_pool) rows: every private example, plus the canary for IN models."""
        rows = np.ones((len(indices), len(self.pool_y)), dtype=bool)
        rows[:, -1] = self.canary_in[indices]
        return rows


@dataclass(frozen=True)
class CampaignResult:
    """Per-model outputs on the attack's targets (here the canary: T = 1) and the scores derived from them."""

    setup: Setup
    target_logits: np.ndarray  # (models, targets, classes)
    scores: np.ndarray  # (models,) higher = more likely IN: the negated canary loss
    test_accuracy: np.ndarray  # (models,)
    seconds: float


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device; use --device cpu")
    return torch.device(name)


def prepare(config: CampaignConfig) -> Setup:
    """Pretrain the base on public data, craft the canary with a reference model, and draw the IN/OUT plan."""
    device = resolve_device(config.device)
    dataset = data_lib.load(config.dataset)
    architecture = models.for_input(dataset.input_shape, dataset.num_classes)
    mechanism = registry.build(config)
    if mechanism.parameterization != "full":
        models.check_rank(architecture, config.rank)  # before pretraining: bad input fails fast
    base = models.pretrain(architecture, dataset.public.x, dataset.public.y, seed=config.seed)
    x_q = canary_lib.draw_canary_input((1, *dataset.input_shape), campaign_rng(config.seed, "canary"))
    x_q = x_q.astype(np.float32)
    canary_label = _reference_label(config, dataset, base, mechanism, x_q, device)
    is_in = designs.single_canary_design(config.models, config.seed)
    # A null campaign keeps the design's two groups but trains neither on the canary.
    canary_in = np.zeros_like(is_in) if config.null else is_in
    pool_x = np.concatenate([dataset.private.x, x_q])
    pool_y = np.concatenate([dataset.private.y, [canary_label]])
    layout = engine.BatchLayout.for_members(len(pool_y), config.batch_size)
    return Setup(config, dataset, base, mechanism, Canary(x_q, canary_label), pool_x, pool_y, is_in,
                 canary_in, layout, device)


def _reference_label(config, dataset, base, mechanism, x_q, device) -> int:
    """y_q = argmin of a reference model's logits, the model trained on D (no canary) by the same procedure."""
    randomness = [ModelRandomness(config.seed, 0, role="reference")]
    shadow = engine.build(base, mechanism.parameterization, models.LoraSpec(config.rank, config.alpha),
                          randomness, device)
    membership = np.ones((1, len(dataset.private)), dtype=bool)
    engine.train(shadow, mechanism, dataset.private.x, dataset.private.y, membership, randomness,
                 _training(config))
    return canary_lib.least_likely_label(engine.logits(shadow, x_q)[0, 0].cpu().numpy())


def _training(config: CampaignConfig) -> engine.TrainingConfig:
    return engine.TrainingConfig(epochs=config.epochs, batch_size=config.batch_size, lr=config.lr,
                                 momentum=config.momentum)


def train_chunk(setup: Setup, indices: np.ndarray, on_step: Callable[[int], None] | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """Train shadow models ``indices``; return their target logits (K, T, classes) and test accuracies (K,)."""
    randomness = shadow_randomness(setup.config.seed, indices)
    shadow = engine.build(setup.base, setup.mechanism.parameterization, setup.lora, randomness, setup.device)
    engine.train(shadow, setup.mechanism, setup.pool_x, setup.pool_y, setup.membership(indices), randomness,
                 _training(setup.config), setup.layout, on_step)
    target_logits = engine.logits(shadow, setup.canary.x).cpu().numpy()
    test_logits = engine.logits(shadow, setup.dataset.test.x).cpu().numpy()
    return target_logits, (test_logits.argmax(-1) == setup.dataset.test.y).mean(axis=1)


def canary_scores(setup: Setup, target_logits: np.ndarray) -> np.ndarray:
    """(models,) membership scores: the negated canary loss ([W] App. F.1; higher = more likely IN)."""
    return -score_lib.cross_entropy_loss(target_logits, np.array([setup.canary.label]))[:, 0]


def run(config: CampaignConfig, progress: bool = True) -> CampaignResult:
    """Prepare, then train all shadow models chunk by chunk with a progress bar over models."""
    from tqdm.auto import tqdm

    start = time.perf_counter()
    setup = prepare(config)
    chunks = np.array_split(np.arange(config.models), -(-config.models // config.chunk_size))
    logits, accuracy = [], []
    with tqdm(total=config.models, unit="model", disable=not progress, desc=f"{config.mechanism} r={config.rank}",
              bar_format="{l_bar}{bar}| {n:.0f}/{total} [{elapsed}<{remaining}, {rate_fmt}]") as bar:
        for chunk in chunks:
            per_step = len(chunk) / (config.epochs * setup.layout.steps)
            chunk_logits, chunk_accuracy = train_chunk(setup, chunk, lambda _: bar.update(per_step))
            logits.append(chunk_logits)
            accuracy.append(chunk_accuracy)
    target_logits = np.concatenate(logits)
    return CampaignResult(setup, target_logits, canary_scores(setup, target_logits), np.concatenate(accuracy),
                          time.perf_counter() - start)

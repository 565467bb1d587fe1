"""Batched shadow-model training: K models at once on stacked parameters (torch.func).

Each model is the same module evaluated with its own tensors through ``functional_call``; ``vmap`` runs all K
in one pass. The frozen pretrained base is shared (``in_dims=None``), never copied K times. Every model has its
own membership row, data order and mechanism randomness (:mod:`dpaudit.seeding`), so a model's result does not
depend on which other models it is trained with.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from dpaudit import models as model_lib
from dpaudit.errors import UsageError
from dpaudit.mechanisms.base import Mechanism, Step
from dpaudit.seeding import ModelRandomness

SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True)
class TrainingConfig:
    """SGD with momentum; ``cosine`` anneals to ``min_lr`` over all steps ([W] App. F.1)."""

    epochs: int = 30
    batch_size: int = 32
    lr: float = 0.1
    momentum: float = 0.9
    schedule: str = "cosine"
    min_lr: float = 1e-4

    def __post_init__(self):
        if self.epochs < 1:
            raise UsageError(f"--epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise UsageError(f"--batch-size must be >= 1, got {self.batch_size}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise UsageError(f"--lr must be a positive number, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise UsageError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.schedule not in SCHEDULES:
            raise UsageError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")


@dataclass
class ShadowModels:
    """K models of one architecture: ``module`` evaluated with ``shared`` ∪ ``frozen[k]`` ∪ ``trainable[k]``.

    ``shared`` tensors are the same for every model; ``frozen`` (e.g. LoRA-FA's per-model ``lora_A``) and
    ``trainable`` tensors are stacked with a leading model dimension K.
    """

    module: nn.Module
    shared: dict[str, torch.Tensor]
    frozen: dict[str, torch.Tensor]
    trainable: dict[str, torch.Tensor]

    @property
    def n_models(self) -> int:
        return next(iter(self.trainable.values())).shape[0]


def build(base: nn.Module, parameterization: str, lora: model_lib.LoraSpec | None,
          randomness: Sequence[ModelRandomness], device: torch.device) -> ShadowModels:
    """K = len(randomness) copies of the pretrained ``base`` ready to fine-tune with ``parameterization``.

    LoRA factors start as in [W] App. E: ``lora_A`` i.i.d. N(0, 1/r) from each model's "init" stream (frozen
    under ``lora-fa``, trained under ``lora``), ``lora_B = 0`` so every model starts at the base function.
    """
    if parameterization not in model_lib.PARAMETERIZATIONS:
        raise UsageError(f"unknown parameterization {parameterization!r}: use one of "
                         f"{', '.join(model_lib.PARAMETERIZATIONS)}")
    k = len(randomness)
    if parameterization == "full":
        module = base
        weights = {f"{name}.weight" for name in model_lib.adapted_layers(base)}
        tensors = {name: p.detach().to(device) for name, p in base.named_parameters()}
        trainable = {name: t.expand(k, *t.shape).clone() for name, t in tensors.items() if name in weights}
        shared = {name: t for name, t in tensors.items() if name not in weights}
        return ShadowModels(module, shared, {}, trainable)
    if lora is None:
        raise UsageError(f"parameterization {parameterization!r} needs a LoRA rank")
    module = model_lib.attach_lora(base, lora)
    tensors = {name: p.detach() for name, p in module.named_parameters()}
    a_names = [name for name in tensors if ".lora_A." in name]
    generators = [model.torch("init") for model in randomness]
    lora_a = {name: torch.stack([model_lib.draw_lora_a(tuple(tensors[name].shape), lora.rank, g)
                                 for g in generators]).to(device)
              for name in a_names}
    # Each model's stream yields its factors in layer order, as in WishartProjection.setup: both realisations of
    # LoRA-FA (SPEC §1.2) share A.
    lora_b = {name: torch.zeros(k, *t.shape, device=device) for name, t in tensors.items() if ".lora_B." in name}
    shared = {name: t.to(device) for name, t in tensors.items() if ".lora_" not in name}
    if parameterization == "lora-fa":
        return ShadowModels(module, shared, lora_a, lora_b)
    return ShadowModels(module, shared, {}, {**lora_a, **lora_b})


@dataclass(frozen=True)
class BatchLayout:
    """Steps per epoch and padded batch width, fixed by the largest member count of the whole campaign.

    Every model's epoch is ``steps`` batches of its own members, spread evenly (sizes differ by at most one) and
    padded with weight-0 slots to ``width``. Deriving both from the campaign (not from the models trained
    together) keeps each model's arithmetic independent of chunking.
    """

    steps: int
    width: int

    @classmethod
    def for_members(cls, max_members: int, batch_size: int) -> "BatchLayout":
        steps = math.ceil(max_members / batch_size)
        return cls(steps, math.ceil(max_members / steps))


def shuffled_batches(membership: np.ndarray, randomness: Sequence[ModelRandomness], layout: BatchLayout,
                     epochs: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per step: pool indices (K, width) and example weights (K, width), each model in its own shuffled order.

    Model k visits each of its members (``membership[k]``) once per epoch, in an order from its "data" stream.
    """
    members = [np.flatnonzero(row) for row in membership]
    if any(len(m) == 0 for m in members):
        raise UsageError("a shadow model has no training examples: check the membership plan")
    if max(map(len, members)) > layout.steps * layout.width:
        raise ValueError("batch layout too small for the membership plan")
    rngs = [model.numpy("data") for model in randomness]
    for _ in range(epochs):
        index = np.zeros((len(members), layout.steps, layout.width), dtype=np.int64)
        weight = np.zeros((len(members), layout.steps, layout.width), dtype=np.float32)
        for k, (rows, rng) in enumerate(zip(members, rngs)):
            for s, batch in enumerate(np.array_split(rng.permutation(rows), layout.steps)):
                index[k, s, :len(batch)] = batch
                weight[k, s, :len(batch)] = 1.0
        for s in range(layout.steps):
            yield index[:, s], weight[:, s]


def _loss_functions(module: nn.Module):
    """Batch-mean and single-example cross-entropy as functions of (trainable, frozen, shared, data)."""

    def batch_loss(trainable, frozen, shared, x, y, w):
        logits = functional_call(module, {**shared, **frozen, **trainable}, (x,))
        losses = nn.functional.cross_entropy(logits, y, reduction="none")
        return (w * losses).sum() / w.sum().clamp(min=1.0)

    def example_loss(trainable, frozen, shared, x, y):
        logits = functional_call(module, {**shared, **frozen, **trainable}, (x.unsqueeze(0),))
        return nn.functional.cross_entropy(logits, y.unsqueeze(0))

    return batch_loss, example_loss


def gradient_function(module: nn.Module, per_example: bool) -> Callable:
    """(trainable, frozen, shared, x, y, w) → gradients for K models: (K, ...) or per example (K, b, ...)."""
    batch_loss, example_loss = _loss_functions(module)
    if not per_example:
        return vmap(grad(batch_loss), in_dims=(0, 0, None, 0, 0, 0))
    per_model = vmap(grad(example_loss), in_dims=(None, None, None, 0, 0))
    models = vmap(per_model, in_dims=(0, 0, None, 0, 0))
    return lambda trainable, frozen, shared, x, y, w: models(trainable, frozen, shared, x, y)


def train(shadow: ShadowModels, mechanism: Mechanism, x: np.ndarray, y: np.ndarray, membership: np.ndarray,
          randomness: Sequence[ModelRandomness], config: TrainingConfig,
          layout: BatchLayout | None = None, on_step: Callable[[int], None] | None = None) -> ShadowModels:
    """Fine-tune the K models of ``shadow`` in place on their members of the pool (x, y) with ``mechanism``.

    ``membership`` is a (K, n_pool) boolean matrix; ``layout`` defaults to the one these K models need alone
    (a campaign passes its own so that chunking does not matter). The optimiser is torch's SGD with momentum over the stacked
    tensors (elementwise, so stacking does not change any model's arithmetic).
    """
    if membership.shape != (shadow.n_models, len(y)):
        raise ValueError(f"membership has shape {membership.shape}, expected ({shadow.n_models}, {len(y)})")
    device = next(iter(shadow.trainable.values())).device
    pool_x = torch.from_numpy(x).to(device)
    pool_y = torch.from_numpy(y).to(device)
    params = {name: t.clone() for name, t in shadow.trainable.items()}
    optimiser = torch.optim.SGD(list(params.values()), lr=config.lr, momentum=config.momentum)
    layout = layout or BatchLayout.for_members(int(membership.sum(axis=1).max()), config.batch_size)
    total = config.epochs * layout.steps
    schedule = (torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, T_max=total, eta_min=config.min_lr)
                if config.schedule == "cosine" else None)
    state = mechanism.setup({name: t.shape[1:] for name, t in params.items()}, randomness)
    gradients = gradient_function(shadow.module, mechanism.per_example)
    batches = shuffled_batches(membership, randomness, layout, config.epochs)
    for step, (index, weight) in enumerate(batches):
        index_t = torch.from_numpy(index).to(device)
        weight_t = torch.from_numpy(weight).to(device)
        grads = gradients(params, shadow.frozen, shadow.shared, pool_x[index_t], pool_y[index_t], weight_t)
        update = mechanism.transform(Step(grads, weight_t, step), state)
        for name, p in params.items():
            p.grad = update[name]
        optimiser.step()
        if schedule is not None:
            schedule.step()
        if on_step is not None:
            on_step(step)
    shadow.trainable = {name: p.detach() for name, p in params.items()}
    return shadow


@torch.no_grad()
def logits(shadow: ShadowModels, x: np.ndarray, batch_size: int = 4096) -> torch.Tensor:
    """(K, n, classes) logits of every model on the same inputs ``x`` (n, ...)."""
    forward = vmap(lambda trainable, frozen, inputs: functional_call(
        shadow.module, {**shadow.shared, **frozen, **trainable}, (inputs,)), in_dims=(0, 0, None))
    device = next(iter(shadow.trainable.values())).device
    inputs = torch.from_numpy(x).to(device)
    parts = [forward(shadow.trainable, shadow.frozen, inputs[i:i + batch_size])
             for i in range(0, len(inputs), batch_size)]
    return torch.cat(parts, dim=1)


def train_sequentially(shadow: ShadowModels, mechanism: Mechanism, x: np.ndarray, y: np.ndarray,
                       membership: np.ndarray, randomness: Sequence[ModelRandomness], config: TrainingConfig,
                       layout: BatchLayout | None = None) -> ShadowModels:
    """The plain per-model loop the batched engine is checked and benchmarked against.

    Each model is a real ``nn.Module`` (a deep copy loaded with its tensors) trained with autograd and its own
    ``torch.optim.SGD``, on the same batches and mechanism randomness as :func:`train`.
    """
    if mechanism.per_example:
        raise ValueError("the per-model reference loop covers batch-gradient mechanisms only")
    layout = layout or BatchLayout.for_members(int(membership.sum(axis=1).max()), config.batch_size)
    inputs, labels = torch.from_numpy(x), torch.from_numpy(y)
    trained: dict[str, list[torch.Tensor]] = {name: [] for name in shadow.trainable}
    for k in range(shadow.n_models):
        module = copy.deepcopy(shadow.module)
        values = {**shadow.shared, **{n: t[k] for n, t in {**shadow.frozen, **shadow.trainable}.items()}}
        params = dict(module.named_parameters())
        with torch.no_grad():
            for name, value in values.items():
                params[name].copy_(value)
        for name, p in params.items():
            p.requires_grad_(name in shadow.trainable)
        optimiser = torch.optim.SGD([params[n] for n in shadow.trainable], lr=config.lr, momentum=config.momentum)
        schedule = (torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, T_max=config.epochs * layout.steps,
                                                                eta_min=config.min_lr)
                    if config.schedule == "cosine" else None)
        state = mechanism.setup({n: t.shape[1:] for n, t in shadow.trainable.items()}, randomness[k:k + 1])
        batches = shuffled_batches(membership[k:k + 1], randomness[k:k + 1], layout, config.epochs)
        for step, (index, weight) in enumerate(batches):
            batch = torch.from_numpy(index[0][weight[0] > 0])
            optimiser.zero_grad()
            nn.functional.cross_entropy(module(inputs[batch]), labels[batch]).backward()
            grads = {n: params[n].grad.unsqueeze(0) for n in shadow.trainable}
            update = mechanism.transform(Step(grads, torch.from_numpy(weight), step), state)
            for n in shadow.trainable:
                params[n].grad = update[n][0]
            optimiser.step()
            if schedule is not None:
                schedule.step()
        for name in trained:
            trained[name].append(params[name].detach().clone())
    shadow.trainable = {name: torch.stack(stack) for name, stack in trained.items()}
    return shadow

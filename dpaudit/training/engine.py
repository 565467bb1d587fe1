"""Batched shadow-model training: K models at once on stacked parameters (torch.func).

Each model is the same module evaluated with its own tensors through ``functional_call``; ``vmap`` runs all K
in one pass. The frozen pretrained base is one tensor seen by every model through a stride-0 view, never copied
K times. Every model has its own membership row, data order and mechanism randomness (:mod:`dpaudit.seeding`),
so a model's result does not depend on which other models it is trained with.
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import functools
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

import numpy as np
import torch
from torch import nn
from torch.func import vmap
from torch.profiler import record_function
from torch.utils.flop_counter import FlopCounterMode

from dpaudit import background
from dpaudit import models as model_lib
from dpaudit.errors import UsageError
from dpaudit.mechanisms.base import Mechanism, Step
from dpaudit.models.adapters import merged_adapters
from dpaudit.models.transformer import flash_attention
from dpaudit.seeding import ModelRandomness
from dpaudit.training.gradients import (
    BlockedExampleGradients,
    GroupedExampleGradients,
    PaddedExampleGradients,
    example_gradient_function,
    gradient_function,
    joined,
    shared_base,
    shared_layers_of,
    token_sequences,
)
from dpaudit.training.passes import StepPasses
from dpaudit.training.sampling import BatchLayout, PoissonLayout, TrainingConfig, poisson_batches, shuffled_batches

# The step's phases as torch.profiler sees them (benchmarks' --profile; docs/performance.md).
FORWARD_BACKWARD, MECHANISM, OPTIMISER = PHASES = (
    "dpaudit: forward and backward",
    "dpaudit: mechanism",
    "dpaudit: optimiser",
)


class StepObserver(Protocol):
    """Examples the engine adds to every step without a data row, and what it observes of them.

    The engine calls ``start`` before the first step, ``insert`` on each step's gradients (returning them and the
    example weights with the observer's examples appended), ``record`` after each update and ``finish`` after the
    last step, whose result it leaves in ``ShadowModels.canary_observations``. Gradient canaries
    (:class:`dpaudit.training.canaries.CanaryRun`) are the one implementation; the engine knows nothing else of them.
    """

    def start(self, params, randomness, sample_rate: float | None, steps_per_epoch: int, epochs: int) -> None: ...

    def insert(self, gradients, weights: torch.Tensor, per_example: bool) -> tuple: ...

    def record(self, direction: dict[str, torch.Tensor] | None, params: dict[str, torch.Tensor], lr: float) -> None: ...

    def finish(self, params: dict[str, torch.Tensor]) -> torch.Tensor: ...


# glibc's mallopt parameters (malloc.h), the thresholds set back (the mmap threshold's largest adapted value on 64-bit
# glibc, and the trim threshold it pairs with it), and the retained size
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_ADAPTED_MMAP_THRESHOLD = 32 * 2**20
_RETAINED_BYTES = 2**30
_retaining = 0  # retained_heap blocks open in this process: the outermost one sets and restores the thresholds
# Threads can open blocks at once: the count and glibc's thresholds (the process's) change together under this
# lock, so that the last block to close, in whichever thread, restores them.
_retaining_lock = threading.Lock()


@contextmanager
def retained_heap() -> Iterator[None]:
    """Inside the block, memory freed stays in the process's heap for the next allocation.

    glibc's malloc serves a block above its mmap threshold (which adapts, up to 32 MiB) with fresh pages from the
    kernel and unmaps them when it is freed, so each of a step's large activations (a chunk of 16 byte-level
    transformers: (16, 2048, 256) floats, 32 MiB) costs the kernel's page faults and zeroing again at every
    step: batched, the transformer's elementwise ops ran 2-6x slower per element than the per-model loop's small
    tensors, and a third of the CPU time was the kernel's (docs/performance.md §5). Thresholds of 1 GiB keep such
    blocks in the heap. The last block to close returns the heap's free memory to the system and sets the
    thresholds that glibc adapts to after freeing large blocks (32 MiB, the mmap threshold's largest adapted value,
    and a trim threshold of twice that): once set, glibc adapts them no more, and its defaults of 128 KiB would map
    every later allocation above them afresh (a per-model loop run after the engine in one process ran 1.6x slower,
    docs/performance.md §16). Only the main thread's heap is kept so: another thread's arena, 64 MiB at most,
    maps blocks of tens of MiB afresh now and then (measured: every one, in some runs), which is why the
    campaign's driver trains in its main thread. Changes no number (torch aligns every tensor to 64 bytes either
    way); does nothing where malloc is not glibc's.
    """
    global _retaining
    libc = ctypes.CDLL(None)
    glibc = hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim")
    with _retaining_lock:
        if glibc and not _retaining:
            libc.mallopt(_M_MMAP_THRESHOLD, _RETAINED_BYTES)
            libc.mallopt(_M_TRIM_THRESHOLD, _RETAINED_BYTES)
        _retaining += 1
    try:
        yield
    finally:
        with _retaining_lock:
            _retaining -= 1
            if glibc and not _retaining:
                libc.mallopt(_M_MMAP_THRESHOLD, _ADAPTED_MMAP_THRESHOLD)
                libc.mallopt(_M_TRIM_THRESHOLD, 2 * _ADAPTED_MMAP_THRESHOLD)
                libc.malloc_trim(0)


@dataclasses.dataclass
class ShadowModels:
    """K models of one architecture: ``module`` evaluated with ``frozen[k]`` ∪ ``trainable[k]``.

    Both are stacked with a leading model dimension K. ``frozen`` holds the pretrained base (one tensor, seen by
    every model through a stride-0 view) and per-model frozen tensors (e.g. LoRA-FA's ``lora_A``).
    ``canary_observations``: what :func:`train` observed of its gradient canaries (:mod:`.canaries`), if any.
    """

    module: nn.Module
    frozen: dict[str, torch.Tensor]
    trainable: dict[str, torch.Tensor]
    canary_observations: torch.Tensor | None = None

    @property
    def n_models(self) -> int:
        return next(iter(self.trainable.values())).shape[0]

    def model(self, k: int) -> nn.Module:
        """Model k as a plain module: a deep copy of ``module`` holding its tensors, only the trained ones trainable."""
        module = copy.deepcopy(self.module)
        parameters = dict(module.named_parameters())
        with torch.no_grad():
            for name, tensor in {**self.frozen, **self.trainable}.items():
                parameters[name].copy_(tensor[k])
        for name, parameter in parameters.items():
            parameter.requires_grad_(name in self.trainable)
        return module


def build(
    base: nn.Module,
    parameterization: str,
    lora: model_lib.LoraSpec | None,
    randomness: Sequence[ModelRandomness],
    device: torch.device,
) -> ShadowModels:
    """K = len(randomness) copies of the pretrained ``base`` ready to fine-tune with ``parameterization``.

    LoRA factors start as in [W] App. E: ``lora_A`` i.i.d. N(0, 1/r) from each model's "init" stream (frozen
    under ``lora-fa``, trained under ``lora``), ``lora_B = 0`` so every model starts at the base function. A
    transformers model attends eagerly in the copies (:func:`dpaudit.models.hugging_face.eager_attention`).
    """
    if parameterization not in model_lib.PARAMETERIZATIONS:
        raise UsageError(
            f"unknown parameterization {parameterization!r}: use one of {', '.join(model_lib.PARAMETERIZATIONS)}"
        )
    k = len(randomness)
    if parameterization == "full":
        # vmap has no batching rule for torch's fused attention; a copy only where the attention is switched
        module = base = model_lib.hugging_face.eager_attention(base)
        # A tied weight (GPT-2's lm_head is its token embedding) is trained under the one name named_parameters
        # gives it; functional_call ties its other names to it.
        names = {id(p): name for name, p in base.named_parameters()}
        weights = {names[id(layer.weight)] for layer in model_lib.adapted_layers(base).values()}
        tensors = {name: p.detach().to(device) for name, p in base.named_parameters()}
        trainable = {name: t.expand(k, *t.shape).clone() for name, t in tensors.items() if name in weights}
        base_views = {name: _per_model_view(t, k) for name, t in tensors.items() if name not in weights}
        return ShadowModels(module, base_views, trainable)
    if lora is None:
        raise UsageError(f"parameterization {parameterization!r} needs a LoRA rank")
    module = model_lib.attach_lora(base, lora)  # a copy
    model_lib.hugging_face.attend_eagerly(module)
    tensors = {name: p.detach() for name, p in module.named_parameters()}
    a_names = [name for name in tensors if ".lora_A." in name]
    generators = [model.torch("init") for model in randomness]
    lora_a = {
        name: torch.stack([model_lib.draw_lora_a(tuple(tensors[name].shape), lora.rank, g) for g in generators]).to(
            device, tensors[name].dtype
        )
        for name in a_names
    }
    # Each model's stream yields its factors in layer order, as in WishartProjection.setup: both realisations of
    # LoRA-FA (docs/theory.md §1.2) share A.
    lora_b = {
        name: torch.zeros(k, *t.shape, device=device, dtype=t.dtype)
        for name, t in tensors.items()
        if ".lora_B." in name
    }
    base_views = {name: _per_model_view(t.to(device), k) for name, t in tensors.items() if ".lora_" not in name}
    if parameterization == "lora-fa":
        return ShadowModels(module, {**base_views, **lora_a}, lora_b)
    return ShadowModels(module, base_views, {**lora_a, **lora_b})


def _per_model_view(tensor: torch.Tensor, k: int) -> torch.Tensor:
    """The frozen base as a (K, ...) stride-0 view: every model gets it without a copy.

    Passing it per model (in_dims=0) rather than once (in_dims=None) costs ~4% speed and keeps each model's
    arithmetic independent of K: with in_dims=None, vmap fuses the K models' rows into one large GEMM whose
    blocking, and so rounding, changes with K (seen: a model's canary logits changed in the last bits with the
    chunk size). Stride 0 at K = 1 too, where ``expand`` would keep a stride: the engine tells the shared base
    by it (:func:`gradients.shared_base`), and a seed-CNN model trained alone otherwise ran its base
    convolutions per model and differed in its last bits from it trained with others.
    """
    return tensor.as_strided((k, *tensor.shape), (0, *tensor.stride()), tensor.storage_offset())


def _gathered(
    batches: Iterator[tuple[np.ndarray, np.ndarray]],
    x: np.ndarray,
    y: np.ndarray,
    blocks: Callable[[int], list[slice]],
    device: torch.device,
):
    """Per step of ``batches``: the example weights as a tensor and, per block, its slots, inputs and labels.

    The example weights are (K, w); per block of the step come its slots and the
    gathered inputs (K, width, ...) and labels (K, width), each block contiguous.

    Gathered with numpy: the engine runs this on its background thread, where a torch op could start an OpenMP
    team that competes with the engine's own (:mod:`dpaudit.background`).
    """
    for index, weight in batches:
        yield (
            torch.from_numpy(weight).to(device),
            [
                (
                    block,
                    torch.from_numpy(x[index[:, block]]).to(device),
                    torch.from_numpy(y[index[:, block]]).to(device),
                )
                for block in blocks(index.shape[1])
            ],
        )


@retained_heap()
def train(
    shadow: ShadowModels,
    mechanism: Mechanism,
    x: np.ndarray,
    y: np.ndarray,
    membership: np.ndarray,
    randomness: Sequence[ModelRandomness],
    config: TrainingConfig,
    layout: BatchLayout | None = None,
    on_step: Callable[[int], None] | None = None,
    canaries: StepObserver | None = None,
    models_per_group: int | None = None,
    exact_batches: bool | None = None,
) -> ShadowModels:
    """Fine-tune the K models of ``shadow`` in place on their members of the pool (x, y) with ``mechanism``.

    Batches are shuffled, or Poisson-sampled with expected size ``config.batch_size`` for a mechanism with
    ``sampling = "poisson"`` (:class:`PoissonLayout`). The optimiser (:func:`optimiser_of`) is torch's over the stacked
    tensors (elementwise, so stacking does not change any model's arithmetic), unless the mechanism owns its
    update; the hooks ``initialise``, ``update`` and ``finish`` (no-ops by default) are documented in
    :class:`dpaudit.mechanisms.base.Mechanism`. On CPU a step's forward and backward passes run on torch's threads
    at once, one torch thread each (:mod:`dpaudit.training.passes`), where there are several whatever K is (each
    model's exact Poisson batch; groups of sequence models): their numbers are then a one-thread run's.

    Args:
        shadow: the K models (:func:`build`); their ``trainable`` tensors, (K, ...) each, are the ones trained.
        mechanism: maps each step's per-example (or batch) gradients to the update.
        x: the pool's inputs, (n_pool, ...) as the model takes them.
        y: the pool's labels, (n_pool,) (next-token tasks: (n_pool, L) targets).
        membership: (K, n_pool) boolean; model k trains on the pool examples whose entry is True.
        randomness: the K models' random streams (:func:`dpaudit.seeding.shadow_randomness`), which draw their
            batches, the mechanism's state and its noise.
        config: learning rate, momentum, epochs, batch size and schedule.
        layout: the batch layout shared by the campaign's chunks; None: the one these K models need alone (a
            campaign passes its own so that chunking does not matter).
        on_step: called with the step index (0, 1, … over all epochs) after each step, e.g. for a progress bar.
        canaries: gradient canaries appended to the steps' examples and observed (a :class:`StepObserver`).
        models_per_group: at most how many of the K models a forward and backward pass computes, the others
            following in further passes of the same step; None: chosen by the inputs (:func:`_models_per_pass`).
            Changes no model's numbers, only the step's speed.
        exact_batches: under Poisson sampling, whether each model computes its step alone on the examples it
            sampled, rather than the chunk's models together on batches padded to the layout's blocks (then
            ``models_per_group`` applies); None: chosen by the model's size and the device
            (:func:`exact_batches_default`). A model's numbers do not depend on its companions either way.

    Returns:
        ``shadow`` itself, its ``trainable`` tensors replaced by the trained ones (detached), and with the
        canaries' observations in ``shadow.canary_observations`` when ``canaries`` is given.

    Raises:
        ValueError: ``membership`` is not (K, n_pool), or a Poisson-sampling mechanism is not per-example.
    """
    if membership.shape != (shadow.n_models, len(y)):
        raise ValueError(f"membership has shape {membership.shape}, expected ({shadow.n_models}, {len(y)})")
    device = next(iter(shadow.trainable.values())).device
    params = {name: t.clone() for name, t in shadow.trainable.items()}
    optimiser = optimiser_of(list(params.values()), config, fused=True)  # one pass over the weights per step
    layout = layout or BatchLayout.for_members(int(membership.sum(axis=1).max()), config.batch_size)
    if mechanism.sampling == "poisson":
        if not mechanism.per_example:
            raise ValueError(
                f"mechanism {mechanism.name!r} samples Poisson batches, which the engine computes "
                f"per example only (clipped sums divided by the expected batch size)"
            )
        poisson = PoissonLayout.for_batch_layout(layout, config.batch_size)
        alone = exact_batches_default(shadow, x, device) if exact_batches is None else exact_batches
        steps, expected_batch_size, sample_rate = poisson.steps, poisson.expected_batch_size, poisson.sample_rate
        blocks = _one_block if alone else poisson.blocks
        models_per_group = 1 if alone else models_per_group
        batches = poisson_batches(membership, randomness, poisson, config.epochs)
    else:
        steps, expected_batch_size, sample_rate, alone, blocks = layout.steps, None, None, False, _one_block
        batches = shuffled_batches(membership, randomness, layout, config.epochs)
    schedule = (
        torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, T_max=config.epochs * steps, eta_min=config.min_lr)
        if config.schedule == "cosine"
        else None
    )
    state = mechanism.setup({name: t.shape[1:] for name, t in params.items()}, randomness)
    with torch.no_grad():
        mechanism.initialise(params, state)
    if canaries is not None:
        canaries.start(params, randomness, sample_rate, steps, config.epochs)
    threads = _pass_threads(x, device, alone)
    gradients_of = functools.partial(_module_step_gradient_function, shadow, mechanism, alone)
    with StepPasses(shadow.module, gradients_of, threads) as passes:
        for step, (weight_t, examples) in enumerate(background.ahead(_gathered(batches, x, y, blocks, device))):
            with record_function(FORWARD_BACKWARD):
                per_pass = _models_per_pass(examples[0][1], threads) if models_per_group is None else models_per_group
                groups = model_groups(shadow.n_models, per_pass)
                grads = _step_gradients(passes, params, shadow.frozen, weight_t, examples, groups, alone)
            # The mechanism's arithmetic (clipping, sums, noise, PRISM's algebra) in the weights' precision: bf16
            # autocast (--precision bf16) is for the model's forward and backward passes only.
            with torch.autocast(device.type, enabled=False):
                if canaries is not None:
                    grads, weight_t = canaries.insert(grads, weight_t, mechanism.per_example)
                current = Step(grads, weight_t, step, expected_batch_size, config.epochs * steps, params)
                lr = optimiser.param_groups[0]["lr"]
                direction = None
                if mechanism.update is not None:
                    with torch.no_grad(), record_function(MECHANISM):
                        mechanism.update(params, current, state, lr)
                    optimiser.step()  # no gradients: changes nothing, keeps the schedule's bookkeeping in order
                else:
                    with record_function(MECHANISM):
                        direction = mechanism.transform(current, state)
                    for name, p in params.items():
                        p.grad = direction[name]
                    with record_function(OPTIMISER):
                        optimiser.step()
                if canaries is not None:
                    canaries.record(direction, params, lr)
            if schedule is not None:
                schedule.step()
            if on_step is not None:
                on_step(step)
    with torch.no_grad():
        mechanism.finish(params, state, config.lr)
    if canaries is not None:
        shadow.canary_observations = canaries.finish(params)
    shadow.trainable = {name: p.detach() for name, p in params.items()}
    return shadow


def model_groups(n_models: int, models_per_group: int | None) -> list[slice]:
    """The consecutive groups of models a step's passes take in turn, as equal in size as can be.

    As few groups as hold at most ``models_per_group`` models each (None: one group). Equal sizes because a
    batched GEMM splits its K products between threads: a lone model in the last group leaves a thread idle
    (measured: groups of 5 or 3 of 16 transformers, at 2 threads, were slower than of 4 or 8).

    Raises:
        ValueError: ``models_per_group`` is below 1.
    """
    if models_per_group is not None and models_per_group < 1:
        raise ValueError(f"models_per_group is {models_per_group}: a pass computes at least 1 model (None: all)")
    groups = 1 if models_per_group is None else math.ceil(n_models / models_per_group)
    size = math.ceil(n_models / groups)
    return [slice(start, min(start + size, n_models)) for start in range(0, n_models, size)]


# Token positions that one forward and backward pass over a group of sequence models computes at most
# (docs/performance.md §13).
_POSITIONS_PER_PASS = 2**14


def _models_per_pass(inputs: torch.Tensor, threads: int) -> int | None:
    """How many models a pass of a step on ``inputs`` (K, width, ...) computes, ``threads`` at once: None for all K.

    Token sequences ((K, b, T) ids): as many as hold :data:`_POSITIONS_PER_PASS` positions, and at most a
    ``threads``-th of the K models, so that every thread has a pass. The byte-level transformer's DP-SGD step (16
    models, 3136 positions a model) ran 1.0-1.4x faster in groups of 4 than in one pass, as the machine's state
    varied, never slower alone; the noise-free one (2048 a model) as fast in groups of 8. A group's activations are
    a quarter of the chunk's and stay in the caches. Other inputs: all K in one pass, which the MLP needs (groups
    of 8 of 32 models were 1.5-1.7x slower, and 2 groups of 16 at once on 2 threads 1.8x slower than one pass on
    both) and the seed CNN does not mind (2 groups of 2 CIFAR-shaped models at once on 2 threads: 1.00x).
    """
    if not token_sequences(inputs):
        return None
    return max(1, min(_POSITIONS_PER_PASS // math.prod(inputs.shape[1:]), math.ceil(inputs.shape[0] / threads)))


def _pass_threads(x: np.ndarray, device: torch.device, exact_batches: bool) -> int:
    """On how many threads a step's passes run at once (:mod:`.passes`): torch's count on CPU, else 1.

    Only where a step has several passes whatever its K: exact Poisson batches (a model each) and token sequences
    (:func:`_models_per_pass`). A step of one pass of all K models (an MLP's, a CNN's) keeps torch's threads inside it.
    """
    threads = torch.get_num_threads() if device.type == "cpu" else 1
    if threads == 1 or exact_batches:
        return threads
    # The pool's first row as a step's (1, 1, ...) inputs; a copy: torch warns on a view of a read-only pool.
    return threads if token_sequences(torch.from_numpy(x[:1].copy())[None]) else 1


def _one_block(width: int) -> list[slice]:
    """A step computed as one block of all its ``width`` slots (shuffled steps; exact Poisson batches)."""
    return [slice(0, width)]


# Matmul and convolution FLOPs of one example's forward pass from which a model computes its Poisson steps alone on
# CPU: DP-SGD alone against padded together was 0.36x, 0.79x, 1.12x and 1.32x at the seed CNN's 1.3, 5.4, 12.2 and
# 21.6 MFLOP (8², 16², 24² and 32² images) and 1.2-1.5x at the byte-level transformer's 16.8 (docs/performance.md §14).
_FLOPS_TO_COMPUTE_ALONE = 10**7


def exact_batches_default(shadow: ShadowModels, x: np.ndarray, device: torch.device) -> bool:
    """Whether a Poisson step computes each model alone on its sampled examples (:func:`train`'s ``exact_batches``).

    On CPU, where one example's forward pass is :data:`_FLOPS_TO_COMPUTE_ALONE` or more (counted on the pool's
    first example): a model's GEMMs and convolutions over its batch then run nearly as fast as K models' together,
    and the padding to the layout's blocks (the first ~1.5x the mean batch) is saved. Smaller models (an MLP's 50
    kFLOP) keep the padded batched step, whose GEMMs one model alone would leave too small. A GPU keeps it too.
    """
    if device.type != "cpu" or len(x) == 0:
        return False
    tensors = {name: t[0] for name, t in {**shadow.frozen, **shadow.trainable}.items()}
    example = torch.from_numpy(x[:1].copy()).to(device)  # a copy: torch warns on a view of a read-only pool
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model_lib.functional_forward(shadow.module, tensors, example)
    return counter.get_total_flops() >= _FLOPS_TO_COMPUTE_ALONE


def _step_gradients(passes: StepPasses, params, frozen, weight_t, examples, groups: list[slice], exact_batches: bool):
    """One step's gradients of the K models, a pass per group of models, a block of examples at a time in a pass.

    Per-example gradients come back as one :class:`PerExampleGradients` (blocks joined along the examples, groups
    along the models); batch gradients as (K, ...) tensors. ``exact_batches``: each group is one model and one
    block, of which the model computes only its sampled examples (the first slots of its row).
    """
    widths = tuple(block.stop - block.start for block, _, _ in examples)

    def one_pass(gradients: Callable, models: slice):
        """The group's batch gradients (a dict), or its per-example gradients."""
        model_params = {name: t[models] for name, t in params.items()}
        model_frozen = {name: t[models] for name, t in frozen.items()}
        if exact_batches:
            ((_, block_x, block_y),) = examples
            # A model that sampled nothing computes one slot of padding (weight 0): the step still has its shape.
            count = max(1, int(weight_t[models].count_nonzero()))
            sampled = (models, slice(0, count))
            computed = gradients(model_params, model_frozen, block_x[sampled], block_y[sampled], weight_t[sampled])
            return PaddedExampleGradients(computed, count, widths[0])
        parts = tuple(
            gradients(model_params, model_frozen, block_x[models], block_y[models], weight_t[models, block])
            for block, block_x, block_y in examples
        )
        return parts[0] if len(parts) == 1 else BlockedExampleGradients(parts, widths)

    per_group = passes.map(one_pass, groups)
    if len(per_group) == 1:
        return per_group[0]
    if isinstance(per_group[0], dict):  # batch gradients
        return joined(per_group)
    return GroupedExampleGradients(tuple(per_group), tuple(models.stop - models.start for models in groups))


def optimiser_of(tensors: list[torch.Tensor], config: TrainingConfig, fused: bool) -> torch.optim.Optimizer:
    """The optimiser ``config`` names over ``tensors``: SGD with momentum, or AdamW with β1 = momentum.

    Both act elementwise (AdamW's moments, bias correction and decoupled decay are per element, its step count
    shared), so on (K, ...) stacks of K models' tensors they are K independent optimisers.
    """
    if config.optimizer == "adamw":
        return torch.optim.AdamW(
            tensors, lr=config.lr, betas=(config.momentum, 0.999), weight_decay=config.weight_decay, fused=fused
        )
    return torch.optim.SGD(tensors, lr=config.lr, momentum=config.momentum, fused=fused)


def _module_step_gradient_function(shadow: ShadowModels, mechanism: Mechanism, alone: bool, module: nn.Module):
    """:func:`step_gradient_function` of ``shadow``'s models computed with ``module`` (a copy of ``shadow.module``)."""
    return step_gradient_function(dataclasses.replace(shadow, module=module), mechanism, alone)


def step_gradient_function(shadow: ShadowModels, mechanism: Mechanism, alone: bool = False) -> Callable:
    """(trainable, frozen, x, y, w) → a step's gradients of ``shadow``'s K models, as ``mechanism`` takes them.

    Per example (:func:`example_gradient_function`) for a per-example mechanism, else each model's batch gradient.
    ``alone``: each call computes one model, without the models' ``vmap`` (a Poisson step's exact batches; per
    example only).
    """
    if mechanism.per_example:
        return example_gradient_function(shadow.module, list(shadow.trainable), alone)
    if alone:
        raise ValueError("models computed alone are a Poisson step's exact batches, computed per example")
    return gradient_function(shadow.module, per_example=False)


@torch.no_grad()
@retained_heap()
def logits(shadow: ShadowModels, x: np.ndarray, batch_size: int = 4096) -> torch.Tensor:
    """(K, n, classes) logits of every model on the same inputs ``x`` (n, ...)."""
    frozen, frozen_dims = shared_base(shared_layers_of(shadow.module), shadow.frozen)
    forward = vmap(
        lambda trainable, frozen, inputs: model_lib.functional_forward(shadow.module, {**frozen, **trainable}, inputs),
        in_dims=(0, frozen_dims, 0),
    )
    device = next(iter(shadow.trainable.values())).device
    inputs = torch.from_numpy(x).to(device)
    # Inputs per model too (a view), so that no GEMM spans several models (see _per_model_view). No inputs (a
    # gradient canary has none) still run one empty batch, which gives the (K, 0, classes) result. Adapters merged
    # (convolutions too, at any size): one product per layer instead of three, and no backward pass to pay for it.
    with merged_adapters(), flash_attention():
        parts = [
            forward(shadow.trainable, frozen, _per_model_view(inputs[i : i + batch_size], shadow.n_models))
            for i in range(0, max(len(inputs), 1), batch_size)
        ]
    return torch.cat(parts, dim=1)


def train_sequentially(
    shadow: ShadowModels,
    mechanism: Mechanism,
    x: np.ndarray,
    y: np.ndarray,
    membership: np.ndarray,
    randomness: Sequence[ModelRandomness],
    config: TrainingConfig,
    layout: BatchLayout | None = None,
) -> ShadowModels:
    """The plain per-model loop the batched engine is checked and benchmarked against.

    Each model is a real ``nn.Module`` (a deep copy loaded with its tensors) trained with autograd and its own
    ``torch.optim.SGD``, on the same batches and mechanism randomness as :func:`train`.
    """
    if mechanism.per_example:
        raise ValueError("the per-model reference loop covers batch-gradient mechanisms only")
    layout = layout or BatchLayout.for_members(int(membership.sum(axis=1).max()), config.batch_size)
    inputs, labels = torch.from_numpy(x), torch.from_numpy(y)
    task = model_lib.task_of(shadow.module)
    trained: dict[str, list[torch.Tensor]] = {name: [] for name in shadow.trainable}
    for k in range(shadow.n_models):
        module = shadow.model(k)
        params = dict(module.named_parameters())
        optimiser = optimiser_of([params[n] for n in shadow.trainable], config, fused=False)
        schedule = (
            torch.optim.lr_scheduler.CosineAnnealingLR(
                optimiser, T_max=config.epochs * layout.steps, eta_min=config.min_lr
            )
            if config.schedule == "cosine"
            else None
        )
        state = mechanism.setup({n: t.shape[1:] for n, t in shadow.trainable.items()}, randomness[k : k + 1])
        batches = shuffled_batches(membership[k : k + 1], randomness[k : k + 1], layout, config.epochs)
        for step, (index, weight) in enumerate(batches):
            batch = torch.from_numpy(index[0][weight[0] > 0])
            optimiser.zero_grad()
            model_lib.mean_loss(task, model_lib.forward(module, inputs[batch]), labels[batch]).backward()
            grads = {n: _gradient(params[n]).unsqueeze(0) for n in shadow.trainable}
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


def _gradient(parameter: torch.Tensor) -> torch.Tensor:
    """``parameter.grad`` after a backward pass that reached it."""
    if parameter.grad is None:
        raise RuntimeError("a trained tensor has no gradient: the loss does not depend on it")
    return parameter.grad

"""A membership-inference campaign: plan, shadow training in chunks on workers, outputs streamed to the store.

Data flow (docs/architecture.md §1): config → :class:`Setup` (pretrained base, targets, membership plan; saved to the
run directory before any shadow model trains) → chunks of shadow models trained by the engine in worker
processes (joblib: loky locally, dask across machines) → per-chunk outputs written atomically by the driver →
:mod:`dpaudit.analysis` turns them into scores and statistics.

Designs: ``canary`` ([W] App. F.1: a static-poison canary, IN for half of the models), ``all-examples``
(every private example a target, IN for exactly half of the models; Carlini et al. 2022) and ``one-run`` (M
canaries, each IN with probability ½ independently in every model; Steinke et al. 2023). The canary is an input
(``--canary input``) or a crafted gradient the engine inserts (``--canary gradient``, :mod:`dpaudit.training.canaries`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import copy
import dataclasses
import functools
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path

import numpy as np
import torch

from dpaudit import models, parallel
from dpaudit.campaign import plan, resolve, sketch_inputs
from dpaudit.campaign.shadow import Diverged, Setup, engine_words, train_chunk, with_exact_batches
from dpaudit.campaign.store import ChunkOutputs, RunStore
from dpaudit.config import CampaignConfig, Execution
from dpaudit.errors import UsageError
from dpaudit.mechanisms import catalogue

_CPU_CHUNK_RANGE = (16, 128)  # models per chunk: small enough to balance workers, large enough to batch well


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda asked for, but torch sees no CUDA device; use --device cpu")
    return torch.device(name)


def _cpu_chunk_size(models: int, workers: int) -> int:
    """Two chunks per worker, within :data:`_CPU_CHUNK_RANGE`.

    Larger chunks batch better (the default audit's 256 MLPs on 2 workers: 9.3-9.4 s at 64 models a chunk, 11.0-11.2 s
    at 32); two per worker let one that starts late catch up.
    """
    return int(np.clip(math.ceil(models / (2 * workers)), *_CPU_CHUNK_RANGE))


def _auto_chunk_size(setup: Setup, device: torch.device, workers: int) -> int:
    """CPU: :func:`_cpu_chunk_size`. CUDA: as many models as half the free memory holds."""
    n = setup.models
    if device.type != "cuda":
        return _cpu_chunk_size(n, workers)
    free, _ = torch.cuda.mem_get_info(device)
    # float32 copies per parameter: weights, grads, the optimiser's state (SGD's momentum, AdamW's two moments), a copy
    copies = {"sgd": 4, "adamw": 5}[setup.settings.training.optimizer]
    per_model_params = sum(p.numel() for p in setup.base.parameters()) * 4 * copies
    activations = setup.layout.width * sum(models.output_dim(m) for m in models.adapted_layers(setup.base).values())
    per_model = per_model_params + activations * 4 * 8 * int(np.prod(setup.dataset.input_shape[1:]) or 1)
    return int(max(1, min(n, free // 2 // per_model)))


def _chunk_task(setup: Setup, indices: np.ndarray, device_name: str) -> ChunkOutputs:
    """A worker's job: train one chunk on its device; only the outputs travel back.

    A dask worker's parent is its nanny: it watches that from its first chunk (loky's from its start).
    """
    parallel.exit_with_parent(os.getppid())
    return train_chunk(setup, indices, torch.device(device_name))


def _import_training_code(lora: bool) -> None:
    """A helper's first job, while the driver still plans: import what a :class:`Setup` and training need.

    torch, and peft for LoRA (which pulls in transformers): seconds per process.
    """
    import dpaudit.campaign.shadow  # noqa: F401

    if lora:
        import peft  # noqa: F401


def _worker_count(execution: Execution, device: torch.device) -> int:
    """``--workers``, else one per GPU on CUDA, one per core on the CPU."""
    return execution.workers or _gpus(device) or os.cpu_count() or 1


def _gpus(device: torch.device) -> int:
    """CUDA devices a campaign on ``device`` spreads its chunks over: 0 on the CPU."""
    return torch.cuda.device_count() if device.type == "cuda" else 0


def _helpers(config: CampaignConfig, execution: Execution, device: torch.device) -> int:
    """Worker processes that train chunks beside the driver: ``workers − 1``, or 0 where the driver does not.

    ``workers − 1`` on CPU with loky where the campaign has more than one chunk; 0 otherwise (one worker trains in
    the driver; on a GPU or with dask every chunk goes to joblib's workers). On CPU the driver is one of the workers:
    it has the training code imported already, while each new process spends seconds importing torch and peft (more
    than a small campaign's training on a core).
    """
    workers = _worker_count(execution, device)
    chunk_size = execution.chunk_size or _cpu_chunk_size(config.models, workers)
    if device.type != "cpu" or execution.backend == "dask" or workers == 1 or config.models <= chunk_size:
        return 0
    return workers - 1


def run(
    config: CampaignConfig,
    execution: Execution,
    out: Path,
    inputs: resolve.Inputs | None = None,
    rank_given: bool = True,
) -> RunStore:
    """Train every shadow model not yet in the run directory ``out``; return the store holding all outputs.

    Finished chunks are never retrained; a chunk killed half-way is retrained from its start. Per-model
    randomness depends on (seed, model index) only, so chunk size, worker count and order change nothing (bit for bit
    at LoRA ranks that are multiples of 4; at other ranks, MKL's GEMMs can round in the last bits with a model's
    memory offset in its chunk; DP-SGD on a CNN, a chunk of one model rounds otherwise, docs/performance.md §8).
    One process trains a run directory at a time (:meth:`RunStore.lock`).

    Args:
        config: the campaign (validated at construction); a run directory that holds another campaign is refused,
            naming what differs.
        execution: how it runs: device, worker count, chunk size, cluster scheduler, progress bar; none of it
            changes the numbers.
        out: the run directory; created if missing, continued if it holds this campaign.
        inputs: the dataset, base model and mechanism objects; None: resolved from the config's names
            (:func:`.resolve.resolve`); :func:`dpaudit.audit` passes the objects the config describes.
        rank_given: False where ``config.rank`` is the default rank: one larger than the model's layers take is
            lowered to the largest they take (:func:`.plan.check_inputs`), and the campaign runs at that rank.

    Returns:
        The :class:`RunStore` of ``out``, every shadow model's chunk written (read it with
        :func:`dpaudit.analysis.analyse`).

    Raises:
        UsageError: the inputs do not fit the config, the directory holds a different campaign or is locked, or a
            shadow model diverged (non-finite outputs; nothing of its chunk is stored).
    """
    store = RunStore(out)
    device = resolve_device(execution.device)
    helpers = _helpers(config, execution, device)
    # The helpers start now and import the training code while the driver plans.
    executor = parallel.helper_processes(helpers) if helpers else None
    lora = config.rank is not None
    started = [executor.submit(_import_training_code, lora) for _ in range(helpers)] if executor else []
    try:
        # A refused campaign leaves no directory: the lock below creates it.
        config, inputs = plan.check_inputs(config, resolve.resolve(config) if inputs is None else inputs, rank_given)
        with store.lock():
            try:
                _run_locked(config, execution, store, inputs, device, executor, started)
            except Diverged as diverged:
                raise _divergence_error(config, store, inputs.architecture, diverged.args[0]) from None
    finally:
        if executor is not None:  # idle by now, or busy with a chunk no one waits for after an error
            executor.terminate(kill_workers=True)
    return store


def _divergence_error(
    config: CampaignConfig, store: RunStore, architecture: torch.nn.Module, models: tuple[int, ...]
) -> UsageError:
    shown = ", ".join(map(str, models[:10])) + (", …" if len(models) > 10 else "")
    finished = int(store.finished().sum())
    again = (
        f"run `dpaudit audit` with the new values and --out {store.root} (no model has finished, so the directory"
        " starts over)"
        if finished == 0
        else f"run the campaign with the new values into a new --out ({finished} finished models in {store.root}"
        " belong to this configuration)"
    )
    return UsageError(
        f"shadow model(s) {shown} diverged (non-finite outputs) with --lr {config.lr:g} and --batch-size"
        f" {config.batch_size}; nothing of theirs was stored: {plan.divergence_fix(architecture)}, then {again}"
    )


def _run_locked(
    config: CampaignConfig,
    execution: Execution,
    store: RunStore,
    inputs: resolve.Inputs,
    device: torch.device,
    executor: Executor | None,
    started: list[Future],
) -> None:
    import joblib
    from tqdm.auto import tqdm

    start = time.perf_counter()
    setup = plan.prepare(config, store, device, inputs)
    store.make_chunks_directory()
    gpus = _gpus(device)
    workers = _worker_count(execution, device)
    todo = np.flatnonzero(~store.finished())
    chunk_size = execution.chunk_size or _auto_chunk_size(setup, device, workers)
    chunks = [todo[i : i + chunk_size] for i in range(0, len(todo), chunk_size)]
    engine_description = None
    if chunks:
        setup = with_exact_batches(setup, device)
        engine_description = engine_words(setup, device, len(chunks[0]), min(workers, len(chunks)))
    devices = [f"cuda:{i % gpus}" if gpus else str(device) for i in range(len(chunks))]
    # The bar counts model-steps, whole numbers, and shows them as models: a model's fractions of a step summed
    # as floats could pass the total.
    steps = _steps_per_model(setup)
    bar = tqdm(
        total=config.models * steps,
        initial=(config.models - len(todo)) * steps,
        unit="model",
        unit_scale=1 / steps,
        disable=not execution.progress,
        desc=config.mechanism if config.rank is None else f"{config.mechanism} r={config.rank}",
        bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} [{elapsed}<{remaining}, {rate_fmt}]",
    )
    measure = _measures_sketch_inputs(config, setup, store)
    with bar:
        if executor is not None and len(chunks) > 1:
            # The driver measures once it has no chunk left, while the helpers finish their last ones.
            _train_beside_helpers(setup, chunks, store, bar, executor, started, steps, measure)
            measure = False
        elif workers == 1 or len(chunks) <= 1:
            for chunk, device_name in zip(chunks, devices):
                store.write_chunk(train_chunk(setup, chunk, torch.device(device_name), _on_step(bar, chunk)))
        else:
            with parallel.joblib_backend(execution, workers):
                jobs = (joblib.delayed(_chunk_task)(setup, chunk, d) for chunk, d in zip(chunks, devices))
                for outputs in joblib.Parallel(n_jobs=workers, return_as="generator_unordered")(jobs):
                    store.write_chunk(outputs)
                    bar.update(len(outputs.indices) * steps)
    if measure:
        store.write_measurements(sketch_inputs.measure_sketch_inputs(setup))
    store.record_seconds(time.perf_counter() - start, engine_description)


def _measures_sketch_inputs(config: CampaignConfig, setup: Setup, store: RunStore) -> bool:
    """Whether the campaign measures [S] Lemma 7.2's inputs after training: sketch claims, not measured yet.

    They are measured on LoRA-FA retrained as full-weight training of every layer: where LoRA leaves layers out (the
    transformer's head, --target-modules), adapts a tied weight (GPT-2's lm_head, whose full-weight update would move
    its embedding too) or a transposed one (a Conv1D, which the full-weight realisation would project on its output
    dimension), that is another training, so nothing is measured.
    """
    adapted = models.adapted_layers(setup.base)
    every_layer = set(models.lora_layers(setup.base, config.target_modules)) == set(adapted)
    tied = models.tied_parameters(setup.base)
    plain = not any(id(layer.weight) in tied or models.transposed(layer) for layer in adapted.values())
    applies = config.mechanism in catalogue.applying("sketch-claim") and every_layer and plain
    return applies and store.needs_measurements()


def _train_beside_helpers(
    setup: Setup,
    chunks: list[np.ndarray],
    store: RunStore,
    bar,
    executor: Executor,
    started: list[Future],
    steps: int,
    measure: bool,
) -> None:
    """Train ``chunks`` here and on the ``executor``'s helper processes (one ``started`` import each), at once.

    The driver trains its chunks in the main thread: glibc keeps freed memory for reuse in the main thread's heap
    only (engine.retained_heap); a thread's own arena maps a step's large activations afresh now and then, page
    faults and all. Another thread hands chunks to the helpers and writes what they return. Each side takes the
    next chunk when it is free; every finished chunk is written as it comes (a kill loses only the chunks in
    training). Where ``measure``, the driver measures [S] Lemma 7.2's inputs once it has no chunk left, while the
    helpers finish theirs (after them, it took 1 s of the default audit's 14). An error here stops the handing out
    of chunks and is raised once the helpers' chunks in training are written; an error in a helper stops the
    driver's chunk at its next step and is raised; Ctrl-C is raised without waiting for the helpers.
    """
    queue, lock = collections.deque(chunks), threading.Lock()
    stop, interrupted = threading.Event(), threading.Event()
    failures: list[BaseException] = []
    # The driver trains its own copy of the model and mechanism: training swaps a module's parameters for batched
    # tensors (functional_call), and the helpers' tasks are pickled from ``setup`` meanwhile.
    own = dataclasses.replace(setup, base=copy.deepcopy(setup.base), mechanism=copy.deepcopy(setup.mechanism))

    def next_chunk() -> np.ndarray | None:
        with lock:
            return None if stop.is_set() or not queue else queue.popleft()

    def write(outputs: ChunkOutputs, model_steps: int) -> None:
        with lock:  # both threads write chunks and advance the bar
            store.write_chunk(outputs)
            bar.update(model_steps)

    def fail(error: BaseException) -> None:
        with lock:
            if not stop.is_set():  # the first error is raised; the other side's is a consequence of stopping
                failures.append(error)
                stop.set()

    def step(advance: Callable[[int], None], number: int) -> None:
        if stop.is_set():
            raise _Abandoned
        with lock:
            advance(number)

    def hand_out() -> None:  # one chunk per helper at a time
        try:
            for future in started:  # the helpers have imported the training code
                future.result()
            pending: set[Future] = set()
            while not interrupted.is_set():
                while len(pending) < len(started) and (chunk := next_chunk()) is not None:
                    pending.add(executor.submit(_chunk_task, setup, chunk, "cpu"))
                if not pending:
                    return
                done, pending = concurrent.futures.wait(pending, 0.1, concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    outputs = future.result()
                    write(outputs, len(outputs.indices) * steps)
        except BaseException as error:  # raised in the main thread below
            fail(error)

    helpers = threading.Thread(target=hand_out, name="dpaudit-helper-chunks")
    helpers.start()
    try:
        while (chunk := next_chunk()) is not None:
            on_step = functools.partial(step, _on_step(bar, chunk))
            write(train_chunk(own, chunk, torch.device("cpu"), on_step), 0)
        if measure and not stop.is_set():
            measured = sketch_inputs.measure_sketch_inputs(own)
            with lock:  # beside the other thread's writes
                store.write_measurements(measured)
    except _Abandoned:
        pass  # a helper failed: its error is raised below
    except Exception as error:
        fail(error)
    except BaseException:
        stop.set()
        interrupted.set()
        raise
    finally:
        helpers.join()
    if failures:
        raise failures[0]


class _Abandoned(Exception):
    """The driver's chunk, stopped at a step because the campaign is failing elsewhere (nothing of it is stored)."""


def _steps_per_model(setup: Setup) -> int:
    return setup.settings.training.epochs * setup.layout.steps


def _on_step(bar, chunk: np.ndarray) -> Callable[[int], None]:
    """A chunk trained in this process advances the progress bar (in model-steps) at every step."""
    return functools.partial(_advance, bar, len(chunk))


def _advance(bar, models: int, _step: int) -> None:
    """A chunk's ``on_step``: one step of its ``models`` on the progress bar."""
    bar.update(models)

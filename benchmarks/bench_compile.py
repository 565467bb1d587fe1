"""torch.compile (inductor, CPU) of the batched engine's step: ms/step eager vs compiled, warm-up, exactness.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_compile.py [--model transformer|cnn] [--models 16]
        [--examples 128] [--repeats 3] [--dynamic] [--mode default|max-autotune]
        [--variants "compiled forward" "compiled grad"]

The noise-free step of :func:`dpaudit.training.engine.train` (``vmap`` of the batch loss over the K models, one
backward pass of their sum: :func:`dpaudit.training.gradients.gradient_function`) is replaced, in this process
only, by a compiled one, in two ways:

- ``compiled forward``: ``torch.compile`` of the vmapped, summed loss; AOT autograd compiles its backward, which
  ``torch.autograd.grad`` runs as the eager step does;
- ``compiled grad``: ``torch.compile`` of ``torch.func.grad`` of that loss, forward and backward in one graph.

Settings: the byte-level transformer of ``bench_transformer.py`` (d_model 64, 2 layers, T = 64, lora-fa r = 8)
or the seed CNN of ``bench_engine.py`` (CIFAR-shaped images, lora-fa r = 16), batch 32. Each timed run is one
epoch of ``engine.train`` (a fresh copy of the same models, same batches) after one untimed run per step function
(the compiled ones compile there: their warm-up is that run's time less their best run's); ms/step is the best
of ``--repeats`` runs, taking turns. Printed per compiled step: ms/step, the ratio eager / compiled, the warm-up
seconds, graphs compiled, the largest weight difference to eager after the epoch, whether repeated runs gave
identical bits, a digest of the weights (compare it across processes), and chunk invariance: whether model 0
trained alone (K = 1) gets the same bits as with 3 companions (K = 4), each K a separate compilation under
``dynamic=False`` (the default; ``--dynamic`` compiles with dynamic shapes). One torch thread: a compiled step is
one function of one module, which the engine's passes on several threads at once (:mod:`dpaudit.training.passes`)
would share. Results: docs/performance.md §7.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from collections.abc import Callable
from unittest import mock

import numpy as np
import torch
from bench_gpu import cifar_shaped, frozen_seed_cnn  # the benchmarks folder is on sys.path when run as a script
from torch.func import vmap

from dpaudit import models, seeding
from dpaudit.data import text
from dpaudit.mechanisms.nonprivate import NonPrivate
from dpaudit.models.transformer import CausalTransformer
from dpaudit.training import engine, gradients, sampling

VARIANTS = ("compiled forward", "compiled grad")


def compiled_gradient_function(
    module: torch.nn.Module, frozen: dict, variant: str, dynamic: bool, mode: str
) -> Callable:
    """:func:`gradients.gradient_function`'s batch gradients (trainable, frozen, x, y, w) → (K, ...), compiled.

    ``frozen`` fixes the ``vmap`` in_dims (a shared layer's base once), which the compiled graph bakes in.
    """
    batch_loss, _ = gradients._loss_functions(module)
    shared_layers = gradients.shared_layers_of(module)
    _, frozen_dims = gradients.shared_base(shared_layers, frozen)
    losses = vmap(batch_loss, in_dims=(0, frozen_dims, 0, 0, 0))

    def total(trainable, frozen, x, y, w):
        return losses(trainable, frozen, x, y, w).sum()

    if variant == "compiled grad":
        summed_gradients = torch.compile(torch.func.grad(total), dynamic=dynamic, mode=mode)

        def step(trainable, frozen, x, y, w):
            shared, _ = gradients.shared_base(shared_layers, frozen)
            return {name: g.contiguous() for name, g in summed_gradients(trainable, shared, x, y, w).items()}

        return step
    compiled_total = torch.compile(total, dynamic=dynamic, mode=mode)

    def step(trainable, frozen, x, y, w):
        shared, _ = gradients.shared_base(shared_layers, frozen)
        with torch.enable_grad():
            recorded = {name: t.detach().requires_grad_() for name, t in trainable.items()}
            sums = torch.autograd.grad(
                compiled_total(recorded, shared, x, y, w), list(recorded.values()), materialize_grads=True
            )
        return {name: g.contiguous() for name, g in zip(recorded, sums)}

    return step


def setting(model: str, examples: int) -> tuple[torch.nn.Module, np.ndarray, np.ndarray, int]:
    """(frozen base, x, y, LoRA rank) of ``bench_transformer.py`` or ``bench_engine.py``'s CNN."""
    if model == "transformer":
        dataset = text.load(length=64)
        torch.manual_seed(0)
        base = CausalTransformer(64, d_model=64, layers=2).eval().requires_grad_(False)
        return base, dataset.private.x[:examples], dataset.private.y[:examples], 8
    return frozen_seed_cnn(), *cifar_shaped(examples), 16


def digest(trainable: dict[str, torch.Tensor]) -> str:
    """The first 12 hex digits of the SHA-256 of the trained tensors' bytes, in name order."""
    hashed = hashlib.sha256()
    for name in sorted(trainable):
        hashed.update(trainable[name].contiguous().numpy().tobytes())
    return hashed.hexdigest()[:12]


def chunk_invariant(trainers: dict[int, Callable], name: str) -> bool:
    """Whether model 0 gets the same bits trained alone (K = 1) as with 3 companions (K = 4), with step ``name``."""
    alone, together = trainers[1](name), trainers[4](name)
    return all(torch.equal(alone[n][0], together[n][0]) for n in alone)


def yes_no(answer: bool) -> str:
    return "yes" if answer else "no"


def graphs_compiled() -> int:
    """Graphs dynamo has handed to inductor in this process so far."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("transformer", "cnn"), default="transformer")
    parser.add_argument("--models", type=int, default=16)
    parser.add_argument("--examples", type=int, default=128, help="private examples each model trains on")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per step function; the fastest counts")
    parser.add_argument("--dynamic", action="store_true", help="compile with dynamic shapes (default: static)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=VARIANTS, help="compiled steps timed")
    parser.add_argument("--mode", choices=("default", "max-autotune"), default="default", help="torch.compile's mode")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch._dynamo.config.cache_size_limit = 64  # each K is its own graph under static shapes: none may fall back

    base, x, y, rank = setting(args.model, args.examples)
    batch_size = 32
    mechanism = NonPrivate(parameterization="lora-fa")
    config = sampling.TrainingConfig(epochs=1, batch_size=batch_size, lr=0.05)
    layout = sampling.BatchLayout.for_members(len(y), batch_size)
    steps = layout.steps

    def trainer(count: int) -> Callable[[str], dict[str, torch.Tensor]]:
        """Trains models 0..count-1 for one epoch with a step function, from the same start each time."""
        randomness = seeding.shadow_randomness(0, range(count))
        shadow = engine.build(base, "lora-fa", models.LoraSpec(rank), randomness, torch.device("cpu"))
        start = shadow.trainable
        membership = np.ones((count, len(y)), dtype=bool)
        step_functions = {
            variant: compiled_gradient_function(shadow.module, shadow.frozen, variant, args.dynamic, args.mode)
            for variant in args.variants
        }

        def train(variant: str) -> dict[str, torch.Tensor]:
            shadow.trainable = {name: t.clone() for name, t in start.items()}
            if variant == "eager":
                engine.train(shadow, mechanism, x, y, membership, randomness, config, layout)
            else:
                compiled = step_functions[variant]
                with mock.patch.object(engine, "step_gradient_function", lambda *_: compiled):
                    engine.train(shadow, mechanism, x, y, membership, randomness, config, layout)
            return shadow.trainable

        return train

    train = trainer(args.models)
    names = ("eager", *args.variants)
    first, seconds, results, graphs = {}, {name: [] for name in names}, {name: [] for name in names}, {}
    for name in names:
        before = graphs_compiled()
        started = time.perf_counter()
        results[name].append(train(name))
        first[name] = time.perf_counter() - started
        graphs[name] = graphs_compiled() - before
    for _ in range(args.repeats):
        for name in names:
            started = time.perf_counter()
            results[name].append(train(name))
            seconds[name].append(time.perf_counter() - started)
    chunked = {count: trainer(count) for count in (1, 4)}
    eager_ms = 1000 * min(seconds["eager"]) / steps
    print(
        f"{args.model}, {args.models} models, {len(y)} examples, batch {batch_size}, lora-fa r={rank}, noise-free, "
        f"{steps} steps, 1 thread, {'dynamic' if args.dynamic else 'static'} shapes, mode {args.mode}, "
        f"torch {torch.__version__}"
    )
    print(
        f"  {'eager':>16}: {eager_ms:8.1f} ms/step  (runs {', '.join(f'{s:.2f}' for s in seconds['eager'])} s)  "
        f"weights {digest(results['eager'][0])}"
    )
    for variant in args.variants:
        ms = 1000 * min(seconds[variant]) / steps
        gap = max((results[variant][0][n] - results["eager"][0][n]).abs().max().item() for n in results["eager"][0])
        repeatable = all(
            torch.equal(run[n], results[variant][0][n]) for run in results[variant][1:] for n in results[variant][0]
        )
        print(
            f"  {variant:>16}: {ms:8.1f} ms/step  (runs {', '.join(f'{s:.2f}' for s in seconds[variant])} s)  "
            f"weights {digest(results[variant][0])}  eager/compiled {eager_ms / ms:.2f}x\n"
            f"  {'':>16}  warm-up {first[variant] - min(seconds[variant]):.1f} s, graphs {graphs[variant]}, "
            f"max diff vs eager {gap:.1e}, repeatable {yes_no(repeatable)}, "
            f"K=1 vs K=4 bit-identical {yes_no(chunk_invariant(chunked, variant))}"
        )
    print(f"  {'eager':>16}: K=1 vs K=4 bit-identical {yes_no(chunk_invariant(chunked, 'eager'))}")
    print(f"  graphs compiled in all (K = {args.models}, 1 and 4, every compiled step): {graphs_compiled()}")


if __name__ == "__main__":
    main()

"""Batched engine on CUDA vs a plain per-model CUDA loop: seed CNN, CIFAR-shaped images made in memory.

    .venv/bin/python benchmarks/bench_gpu.py [--models 64] [--epochs 20] [--private 5000] [--loop-models 4]
    .venv/bin/python benchmarks/bench_gpu.py --device cpu --models 4 --epochs 1 --private 200 --loop-models 2

Needs no data on disk: ``--private`` images (3×32×32, 10 classes, a class-dependent mean plus Gaussian noise) are
drawn in memory; the seed CNN of [W] App. F.1 (:func:`dpaudit.models.seed_cnn`) is initialised from a fixed seed,
not pretrained (the arithmetic does not depend on the weights). Each model trains on a random half of the pool
(membership as in a campaign), batch size 32, for ``--epochs``. Settings: noise-free LoRA-FA and DP-LoRA-FA
(σ = 1, C = 1, Poisson batches), each in fp32 (TF32 matmuls and convolutions allowed: stated in the output) and
bf16 autocast. Baselines: noise-free LoRA-FA against :func:`engine.train_sequentially` (one ``nn.Module``
per model, autograd, ``torch.optim.SGD``); DP-LoRA-FA, which that loop does not cover, against the batched engine
run on one model at a time. The loops train ``--loop-models`` models (their rate is per model, so fewer suffice).
Prints models/s, peak GPU memory, the projected time for 1000 and for 20 000 models (chunks of ``--models``) and
the ratio to the loop. Without CUDA (and without ``--device cpu``) it says so in one line and exits 0;
``--device cpu`` runs the same code path on the CPU (a smoke check, not a measurement).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np
import torch

from dpaudit import models, seeding
from dpaudit.mechanisms.dpsgd import dp_sgd
from dpaudit.mechanisms.nonprivate import NonPrivate
from dpaudit.training import engine, sampling

PROJECTED_MODELS = (1000, 20_000)


def cifar_shaped(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` standardised 3×32×32 float32 images with labels 0..9: a class mean image plus unit Gaussian noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(10, size=n)
    means = rng.normal(scale=0.5, size=(10, 3, 32, 32))
    return (means[labels] + rng.normal(size=(n, 3, 32, 32))).astype(np.float32), labels.astype(np.int64)


def frozen_seed_cnn() -> torch.nn.Module:
    """[W] App. F.1's CNN, fixed-seed weights, frozen, in eval mode (as :func:`dpaudit.models.pretrain` leaves it)."""
    model = models.seed_cnn(3, 10)
    models.initialise(model, 0)
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


def timed(device: torch.device, run: Callable[..., None], *arguments) -> tuple[float, float | None]:
    """Seconds of ``run(*arguments)`` (the device synchronised before and after), its peak GPU memory in GiB (CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    run(*arguments)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return time.perf_counter() - start, torch.cuda.max_memory_allocated(device) / 2**30
    return time.perf_counter() - start, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=64, help="models trained at once (one chunk)")
    parser.add_argument("--loop-models", type=int, default=4, help="models the per-model loops train")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--private", type=int, default=5000, help="size of the private pool")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu for a smoke run of the code path")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device (torch.cuda.is_available() is False); nothing measured")
        return
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True

    x, y = cifar_shaped(args.private)
    base = frozen_seed_cnn()
    count = max(args.models, args.loop_models)
    membership = np.random.default_rng(1).random((count, args.private)) < 0.5
    randomness = seeding.shadow_randomness(0, range(count))
    config = sampling.TrainingConfig(epochs=args.epochs, batch_size=32, lr=0.05)
    warm_up = sampling.TrainingConfig(epochs=1, batch_size=32, lr=0.05)
    spec = models.LoraSpec(args.rank)
    mechanisms = {
        "LoRA-FA (noise-free)": NonPrivate(parameterization="lora-fa"),
        "DP-LoRA-FA": dp_sgd("dp-lora-fa", 1.0, 1.0),
    }

    def batched(mechanism, rows: range, training: sampling.TrainingConfig) -> None:
        shadow = engine.build(base, "lora-fa", spec, [randomness[i] for i in rows], device)
        engine.train(shadow, mechanism, x, y, membership[rows], [randomness[i] for i in rows], training)

    def loop(mechanism, rows: range, training: sampling.TrainingConfig) -> None:
        if mechanism.per_example:  # the plain loop covers batch-gradient mechanisms: the engine, one model at a time
            for row in rows:
                batched(mechanism, range(row, row + 1), training)
            return
        shadow = engine.build(base, "lora-fa", spec, [randomness[i] for i in rows], device)
        engine.train_sequentially(shadow, mechanism, x, y, membership[rows], [randomness[i] for i in rows], training)

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke run, not a measurement)"
    print(
        f"seed CNN on {args.private} CIFAR-shaped images (in memory), LoRA-FA r = {args.rank}, {args.epochs} epochs, "
        f"batch 32, {args.models} models per chunk, loops of {args.loop_models} models; {gpu}"
    )
    if device.type == "cuda":
        print("fp32 runs allow TF32 (torch.backends.cuda.matmul.allow_tf32 = cudnn.allow_tf32 = True)")
    print(
        f"  {'mechanism':<21} {'precision':<9} {'batched models/s':>16} {'loop models/s':>13} {'ratio':>6} "
        f"{'GPU GiB':>7} " + " ".join(f"{f'{n} models':>13}" for n in PROJECTED_MODELS)
    )
    for name, mechanism in mechanisms.items():
        for precision in ("fp32", "bf16"):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                batched(mechanism, range(2), warm_up)  # vmap tracing, cuDNN autotuning, allocator warm-up
                loop(mechanism, range(1), warm_up)
                seconds, memory = timed(device, batched, mechanism, range(args.models), config)
                loop_seconds, _ = timed(device, loop, mechanism, range(args.loop_models), config)
            rate, loop_rate = args.models / seconds, args.loop_models / loop_seconds
            projected = [math.ceil(n / args.models) * seconds for n in PROJECTED_MODELS]
            print(
                f"  {name:<21} {precision:<9} {rate:16.2f} {loop_rate:13.2f} {rate / loop_rate:5.1f}x "
                f"{'-' if memory is None else f'{memory:.2f}':>7} "
                + " ".join(f"{_duration(value):>13}" for value in projected)
            )


def _duration(seconds: float) -> str:
    """``seconds`` as minutes below two hours, else hours."""
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


if __name__ == "__main__":
    main()

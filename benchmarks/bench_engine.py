"""Batched engine vs a plain per-model loop, MLP and seed CNN: models/s, ratio, GFLOP/s and utilisation of a peak.

    .venv/bin/python benchmarks/bench_engine.py [--models 32] [--epochs 3] [--parameterization lora-fa]
        [--cnn-models 4] [--cnn-examples 256] [--threads 2] [--repeats 3] [--profile]

Same models, same seeds, one run: each trainer's fastest of ``--repeats`` timed runs, the trainers taking turns
after an untimed run of two models (:func:`bench_dpsgd.best_seconds`). The MLP (64-128-128-10) trains on digits'
private part; the seed CNN of [W] App. F.1 on in-memory CIFAR-shaped images (``bench_gpu.cifar_shaped``; fewer
models and examples: a CPU run). Each trainer's floating-point operations are counted in a further untimed run
(``torch.utils.flop_counter``: matmuls and convolutions, forward and backward); achieved GFLOP/s = that count / the
fastest timed run's seconds. The peak is measured in the same run at the same thread count: the fastest of several
fp32 1024×1024 matmuls (``torch.mm``), before and after the trainers, so utilisation = achieved / peak says how far
the engine is from the machine's arithmetic peak (small per-model GEMMs and elementwise work keep it well below).
``--profile`` then prints where one epoch of each batched trainer's steps spends its time (:mod:`step_profile`;
docs/performance.md).
"""

from __future__ import annotations

import argparse
import functools

import numpy as np
import torch
from bench_dpsgd import Trainer, best_seconds  # the benchmarks folder is on sys.path when run as a script
from bench_gpu import cifar_shaped, frozen_seed_cnn
from step_profile import matmul_peak_gflops, print_profile

from dpaudit import data, models, seeding
from dpaudit.mechanisms.nonprivate import NonPrivate
from dpaudit.training import engine, sampling


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=32, help="MLP models")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--parameterization", choices=models.PARAMETERIZATIONS, default="lora-fa")
    parser.add_argument("--cnn-models", type=int, default=4)
    parser.add_argument("--cnn-examples", type=int, default=256, help="private pool of the CNN")
    parser.add_argument("--cnn-epochs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs per trainer, taking turns; the fastest counts"
    )
    parser.add_argument("--profile", action="store_true", help="then profile one epoch of each batched trainer")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    digits = data.digits()
    images = cifar_shaped(args.cnn_examples)
    settings = {
        "MLP 64-128-128-10 (digits)": (
            models.pretrain(models.mlp(64, 10), digits.public.x, digits.public.y),
            digits.private.x,
            digits.private.y,
            args.models,
            args.epochs,
        ),
        f"seed CNN (CIFAR-shaped, {args.cnn_examples} images)": (
            frozen_seed_cnn(),
            *images,
            args.cnn_models,
            args.cnn_epochs,
        ),
    }
    mechanism = NonPrivate(parameterization=args.parameterization)
    spec = models.LoraSpec(args.rank)
    peaks = [matmul_peak_gflops()]
    lines = []
    for label, (base, x, y, count, epochs) in settings.items():
        randomness = seeding.shadow_randomness(0, range(count))
        config = sampling.TrainingConfig(epochs=epochs)
        build = functools.partial(engine.build, base, args.parameterization, spec)
        results: dict[str, engine.ShadowModels] = {}
        trainers = {
            name: Trainer(name, train, build, mechanism, x, y, randomness, config, results)
            for name, train in (("batched", engine.train), ("per-model loop", engine.train_sequentially))
        }
        seconds = best_seconds(trainers, count, args.repeats)
        rates = {name: count / value for name, value in seconds.items()}
        for name, trainer in trainers.items():
            lines.append((label, name, rates[name], trainer.flops() / seconds[name] / 1e9))
        gap = max(
            (results["batched"].trainable[n] - results["per-model loop"].trainable[n]).abs().max().item()
            for n in results["batched"].trainable
        )
        lines.append((label, rates["batched"] / rates["per-model loop"], f"{gap:.1e} after {epochs} epoch(s)"))
        print(f"{label}: {count} models, {epochs} epochs, {len(y)} examples, {args.parameterization} r={args.rank}")
    peaks.append(matmul_peak_gflops())
    peak = max(peaks)
    print(f"measured fp32 matmul peak: {peak:.1f} GFLOP/s ({args.threads} threads; 1024×1024 torch.mm, best of 20)")
    for line in lines:
        if len(line) == 4:
            label, name, rate, gflops = line
            print(
                f"  {label:<34} {name:>15}: {rate:8.2f} models/s  {gflops:7.2f} GFLOP/s  "
                f"{100 * gflops / peak:5.1f}% of the peak"
            )
        else:
            label, ratio, gap = line
            print(f"  {label:<34} ratio batched / per-model loop: {ratio:.2f}x  (max weight difference {gap})")
    if args.profile:
        for label, (base, x, y, count, _) in settings.items():
            randomness = seeding.shadow_randomness(0, range(count))
            config = sampling.TrainingConfig(epochs=1)
            membership = np.ones((count, len(y)), dtype=bool)
            shadow = engine.build(base, args.parameterization, spec, randomness, torch.device("cpu"))
            print_profile(
                f"{label}, {count} models batched, {args.parameterization}, {args.threads} thread(s)",
                functools.partial(engine.train, shadow, mechanism, x, y, membership, randomness, config),
                sampling.BatchLayout.for_members(len(y), config.batch_size).steps,
            )


if __name__ == "__main__":
    main()

"""Batched engine vs a plain per-model loop: same models, same seeds, one run; prints models/s and the ratio.

.venv/bin/python benchmarks/bench_engine.py [--models 32] [--epochs 3] [--parameterization lora-fa]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from dpaudit import data, engine, models, seeding
from dpaudit.mechanisms.nonprivate import NonPrivate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--parameterization", choices=models.PARAMETERIZATIONS, default="lora-fa")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    dataset = data.digits()
    base = models.pretrain(models.mlp(64, 10), dataset.public.x, dataset.public.y)
    x, y = dataset.private.x, dataset.private.y
    membership = np.ones((args.models, len(y)), dtype=bool)
    randomness = seeding.shadow_randomness(0, range(args.models))
    mechanism = NonPrivate(parameterization=args.parameterization)
    config = engine.TrainingConfig(epochs=args.epochs)
    spec = models.LoraSpec(args.rank)
    rates, results = {}, {}
    for name, trainer in (("batched", engine.train), ("per-model loop", engine.train_sequentially)):
        shadow = engine.build(base, args.parameterization, spec, randomness, torch.device("cpu"))
        start = time.perf_counter()
        results[name] = trainer(shadow, mechanism, x, y, membership, randomness, config)
        rates[name] = args.models / (time.perf_counter() - start)
        print(
            f"{name:>15}: {rates[name]:8.2f} models/s  ({args.models} models, {args.epochs} epochs, "
            f"{len(y)} examples, {args.parameterization} r={args.rank}, {args.threads} threads)"
        )
    gap = max(
        (results["batched"].trainable[n] - results["per-model loop"].trainable[n]).abs().max().item()
        for n in results["batched"].trainable
    )
    print(
        f"ratio batched / per-model loop: {rates['batched'] / rates['per-model loop']:.2f}x  "
        f"(max weight difference {gap:.1e})"
    )


if __name__ == "__main__":
    main()

"""Batched engine vs a plain per-model loop on the byte-level transformer: models/s and the ratio.

Both train the same models (same seeds, batches, SGD) on sequences of the embedded corpus (``--dataset text``),
non-private, with the next-token loss. The base is a randomly initialised transformer: pretraining it would
change no timing.

.venv/bin/python benchmarks/bench_transformer.py [--models 16] [--epochs 1] [--parameterization lora]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from dpaudit import engine, models, seeding, text
from dpaudit.mechanisms.nonprivate import NonPrivate
from dpaudit.transformer import CausalTransformer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--examples", type=int, default=256, help="private sequences each model trains on")
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--parameterization", choices=models.PARAMETERIZATIONS, default="lora")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    dataset = text.load(length=args.length)
    x, y = dataset.private.x[: args.examples], dataset.private.y[: args.examples]
    torch.manual_seed(0)
    base = CausalTransformer(args.length, d_model=args.d_model, layers=args.layers).eval().requires_grad_(False)
    membership = np.ones((args.models, len(y)), dtype=bool)
    randomness = seeding.shadow_randomness(0, range(args.models))
    mechanism = NonPrivate(parameterization=args.parameterization)
    config = engine.TrainingConfig(epochs=args.epochs, batch_size=args.batch_size, lr=0.05)
    spec = models.LoraSpec(args.rank)
    setting = (
        f"{args.models} models, {args.epochs} epoch(s), {len(y)} sequences of {args.length}, d_model {args.d_model}, "
        f"{args.layers} layers, {args.parameterization} r={args.rank}, CPU, {args.threads} threads"
    )
    rates, results = {}, {}
    for name, trainer in (("batched", engine.train), ("per-model loop", engine.train_sequentially)):
        shadow = engine.build(base, args.parameterization, spec, randomness, torch.device("cpu"))
        start = time.perf_counter()
        results[name] = trainer(shadow, mechanism, x, y, membership, randomness, config)
        rates[name] = args.models / (time.perf_counter() - start)
        print(f"{name:>15}: {rates[name]:8.2f} models/s  ({setting})")
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

"""Batched engine vs a plain per-model loop on the byte-level transformer: models/s and the ratio.

Both train the same models (same seeds, batches, SGD) on sequences of the embedded corpus (``--dataset text``),
non-private, with the next-token loss. Then the DP-SGD baseline on the same factors (dp-lora for lora, dp-lora-fa
for lora-fa; σ = 1, C = 1, Poisson batches from each model's stream): the engine against opacus's default per-model
loop (:func:`bench_dpsgd.opacus_loop`, hooks). On CPU the engine computes each model alone on its sampled examples,
as opacus does (``engine.train``'s ``exact_batches``); "padded blocks" is the engine computing the models together
on batches padded to the Poisson layout's blocks (its only way before, and a GPU's). Each side's time is the
fastest of ``--repeats`` runs, taking turns, after an untimed run of two models (:func:`bench_dpsgd.best_seconds`:
the side timed first no longer pays the process's first-call costs). The base is a randomly initialised
transformer: pretraining it would change no timing.

.venv/bin/python benchmarks/bench_transformer.py [--models 16] [--epochs 1] [--parameterization lora] [--repeats 3]
    [--profile]

``--profile`` then prints where the batched engine's steps spend their time (:mod:`step_profile`;
docs/performance.md), noise-free and under the DP-SGD baseline on the same factors (dp-lora for lora, dp-lora-fa for
lora-fa; σ = 1, C = 1, Poisson batches).
"""

from __future__ import annotations

import argparse
import functools

import numpy as np
import torch
from bench_dpsgd import Trainer, best_seconds, opacus_loop  # the benchmarks folder is on sys.path when run as a script
from step_profile import print_profile

from dpaudit import models, seeding
from dpaudit.data import text
from dpaudit.mechanisms.dpsgd import DP_SGD_PARAMETERIZATIONS, dp_sgd
from dpaudit.mechanisms.nonprivate import NonPrivate
from dpaudit.models.transformer import CausalTransformer
from dpaudit.training import engine, sampling


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
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per side; the fastest counts")
    parser.add_argument("--profile", action="store_true", help="then profile the batched engine, noise-free and DP")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    dataset = text.load(length=args.length)
    x, y = dataset.private.x[: args.examples], dataset.private.y[: args.examples]
    torch.manual_seed(0)
    base = CausalTransformer(args.length, d_model=args.d_model, layers=args.layers).eval().requires_grad_(False)
    membership = np.ones((args.models, len(y)), dtype=bool)
    randomness = seeding.shadow_randomness(0, range(args.models))
    mechanism = NonPrivate(parameterization=args.parameterization)
    config = sampling.TrainingConfig(epochs=args.epochs, batch_size=args.batch_size, lr=0.05)
    spec = models.LoraSpec(args.rank)
    setting = (
        f"{args.models} models, {args.epochs} epoch(s), {len(y)} sequences of {args.length}, d_model {args.d_model}, "
        f"{args.layers} layers, {args.parameterization} r={args.rank}, CPU, {args.threads} threads"
    )
    results: dict[str, engine.ShadowModels] = {}
    build = functools.partial(engine.build, base, args.parameterization, spec)
    trainers = {
        name: Trainer(name, train, build, mechanism, x, y, randomness, config, results)
        for name, train in (("batched", engine.train), ("per-model loop", engine.train_sequentially))
    }
    seconds = best_seconds(trainers, args.models, args.repeats)
    rates = {name: args.models / value for name, value in seconds.items()}
    for name, rate in rates.items():
        print(f"{name:>15}: {rate:8.2f} models/s  ({setting})")
    gap = max(
        (results["batched"].trainable[n] - results["per-model loop"].trainable[n]).abs().max().item()
        for n in results["batched"].trainable
    )
    print(
        f"ratio batched / per-model loop: {rates['batched'] / rates['per-model loop']:.2f}x  "
        f"(max weight difference {gap:.1e} after {args.epochs} epoch(s))"
    )
    dp_name = next(name for name, p in DP_SGD_PARAMETERIZATIONS.items() if p == args.parameterization)
    poisson = sampling.PoissonLayout.for_members(len(y), config.batch_size)

    def dp_engine(exact_batches: bool):
        def train(count: int) -> None:
            shadow = engine.build(base, args.parameterization, spec, randomness[:count], torch.device("cpu"))
            mechanism = dp_sgd(dp_name, 1.0, 1.0)
            engine.train(
                shadow, mechanism, x, y, membership[:count], randomness[:count], config, exact_batches=exact_batches
            )

        return train

    def dp_opacus(count: int) -> None:
        shadow = engine.build(base, args.parameterization, spec, randomness[:count], torch.device("cpu"))
        opacus_loop(shadow, x, y, membership[:count], randomness[:count], poisson, config, 1.0, 1.0, "hooks")

    dp_trainers = {"engine": dp_engine(True), "padded blocks": dp_engine(False), "opacus loop": dp_opacus}
    seconds = best_seconds(dp_trainers, args.models, args.repeats)
    dp_rates = {name: args.models / value for name, value in seconds.items()}
    for name, rate in dp_rates.items():
        print(f"{name:>15}: {rate:8.2f} models/s  ({dp_name}, σ = 1, C = 1, {setting})")
    exact, padded = (dp_rates[name] / dp_rates["opacus loop"] for name in ("engine", "padded blocks"))
    print(
        f"ratio engine / opacus per-model loop ({dp_name}): {exact:.2f}x with each model on its Poisson batch "
        f"({poisson.expected_batch_size} expected), {padded:.2f}x with the models together on padded blocks "
        f"(the first {poisson.width} wide)"
    )
    if args.profile:
        for name, profiled_mechanism in ((args.parameterization, mechanism), (dp_name, dp_sgd(dp_name, 1.0, 1.0))):
            shadow = engine.build(base, args.parameterization, spec, randomness, torch.device("cpu"))
            print_profile(
                f"transformer, {name}, {setting}",
                functools.partial(engine.train, shadow, profiled_mechanism, x, y, membership, randomness, config),
                args.epochs * sampling.BatchLayout.for_members(len(y), config.batch_size).steps,
            )


if __name__ == "__main__":
    main()

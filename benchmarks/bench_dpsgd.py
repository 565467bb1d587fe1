"""Batched DP-SGD shadow training vs an opacus per-model loop, and PRISM vs DP-LoRA step time ([P] Table 5).

Part 1: the same K models (same base, same Poisson batches from each model's "data" stream, σ, C, b, SGD with
momentum) trained by the batched engine and by opacus (GradSampleModule + DPOptimizer, one model at a time), at
each torch intra-op thread count of ``--threads``; each side's time is its fastest of ``--repeats`` runs after an
untimed warm-up. Prints models/s per thread count and the ratio of the two sides' best settings. Part 2: seconds
per step of the batched engine for PRISM and DP-LoRA on the same LoRA models ([P] Table 5: PRISM ≈ 2×).

    .venv/bin/python benchmarks/bench_dpsgd.py [--models 64] [--epochs 1] [--threads 1 2] [--hidden 128 128]

opacus's loop costs ~2 ms per model and step, mostly per-call overhead, and gains little from a second thread.
The engine's cost is the arithmetic (forward/backward of the padded Poisson batch, the clipped sum) plus one
normal per weight and model, which it draws on its background thread (:mod:`dpaudit.background`): with one
intra-op thread that thread has the second core to itself; with two, OpenMP's spinning workers compete with it.
"""

from __future__ import annotations

import argparse
import copy
import time
import warnings

import numpy as np
import torch
from torch import nn

from dpaudit import data, engine, models, seeding
from dpaudit.mechanisms.dpsgd import dp_sgd
from dpaudit.mechanisms.prism import PrismMechanism


def opacus_loop(base: nn.Module, x: np.ndarray, y: np.ndarray, membership: np.ndarray, randomness: list,
                layout: engine.PoissonLayout, config: engine.TrainingConfig, noise: float, clip: float) -> None:
    """DP-SGD of each model in turn with opacus, on the engine's Poisson batches (adapted weights trained)."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    inputs, labels = torch.from_numpy(x), torch.from_numpy(y)
    weights = {f"{name}.weight" for name in models.adapted_layers(base)}
    for k in range(len(randomness)):
        module = copy.deepcopy(base).train()
        for name, p in module.named_parameters():
            p.requires_grad_(name in weights)
        sampled = GradSampleModule(module)
        sgd = torch.optim.SGD([p for p in sampled.parameters() if p.requires_grad], lr=config.lr,
                              momentum=config.momentum)
        optimiser = DPOptimizer(sgd, noise_multiplier=noise, max_grad_norm=clip,
                                expected_batch_size=layout.expected_batch_size)
        for index, weight in engine.poisson_batches(membership[k:k + 1], randomness[k:k + 1], layout, config.epochs):
            batch = torch.from_numpy(index[0][weight[0] > 0])
            optimiser.zero_grad()
            nn.functional.cross_entropy(sampled(inputs[batch]), labels[batch]).backward()
            optimiser.step()


def best_seconds(train, count: int, repeats: int) -> float:
    """Fastest of ``repeats`` timed calls ``train(count)``, after one untimed call on two models (first-call
    costs: vmap tracing, opacus's hooks, allocator warm-up)."""
    train(2)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        train(count)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--noise", type=float, default=1.0)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch intra-op thread counts")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per side; the fastest counts")
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 128], help="MLP hidden widths")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", module="opacus")  # secure-RNG advice, irrelevant to timing

    dataset = data.digits()
    base = models.pretrain(models.mlp(64, 10, tuple(args.hidden)), dataset.public.x, dataset.public.y)
    x, y = dataset.private.x, dataset.private.y
    membership = np.ones((args.models, len(y)), dtype=bool)
    randomness = seeding.shadow_randomness(0, range(args.models))
    config = engine.TrainingConfig(epochs=args.epochs, schedule="constant")
    layout = engine.PoissonLayout.for_members(len(y), config.batch_size)
    setting = (f"{args.models} models, {args.epochs} epoch(s) of {layout.steps} Poisson steps, b = "
               f"{layout.expected_batch_size}, σ = {args.noise}, C = {args.clip}")

    def batched_engine(count: int) -> None:
        shadow = engine.build(base, "full", None, randomness[:count], torch.device("cpu"))
        engine.train(shadow, dp_sgd("dp-sgd", args.noise, args.clip), x, y, membership[:count],
                     randomness[:count], config)

    def per_model(count: int) -> None:
        opacus_loop(base, x, y, membership[:count], randomness[:count], layout, config, args.noise, args.clip)

    print(f"DP-SGD ({setting}, MLP {'-'.join(map(str, (64, *args.hidden, 10)))} on digits), models/s")
    print(f"  {'threads':>7}  {'batched engine':>14}  {'opacus per model':>16}  {'ratio':>6}")
    best = {"engine": 0.0, "opacus": 0.0}
    for threads in args.threads:
        torch.set_num_threads(threads)
        batched, looped = (args.models / best_seconds(train, args.models, args.repeats)
                           for train in (batched_engine, per_model))
        best = {"engine": max(best["engine"], batched), "opacus": max(best["opacus"], looped)}
        print(f"  {threads:>7}  {batched:14.2f}  {looped:16.2f}  {batched / looped:5.2f}x")
    print(f"  ratio batched / opacus, each at its best thread count: {best['engine'] / best['opacus']:.2f}x")

    torch.set_num_threads(min(args.threads))
    seconds = {}
    for name, mechanism in (("dp-lora", dp_sgd("dp-lora", args.noise, args.clip)),
                            ("prism", PrismMechanism(args.noise, args.clip))):
        def lora_engine(count: int) -> None:
            shadow = engine.build(base, "lora", models.LoraSpec(args.rank), randomness[:count], torch.device("cpu"))
            engine.train(shadow, mechanism, x, y, membership[:count], randomness[:count], config)

        seconds[name] = best_seconds(lora_engine, args.models, args.repeats) / (args.epochs * layout.steps)
    print(f"LoRA r = {args.rank} ({setting}, {min(args.threads)} thread(s))")
    for name, value in seconds.items():
        print(f"  {name:>8}: {1e3 * value:8.1f} ms per step ({1e3 * value / args.models:.2f} ms per model-step)")
    print(f"  ratio PRISM / DP-LoRA step time: {seconds['prism'] / seconds['dp-lora']:.2f}x ([P] Table 5: ≈ 2x)")


if __name__ == "__main__":
    main()

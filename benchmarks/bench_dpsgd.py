"""Batched DP-SGD shadow training vs an opacus per-model loop, and PRISM vs DP-LoRA step time ([P] Table 5).

Part 1: the same K models (same base, same Poisson batches from each model's "data" stream, σ, C, b, SGD with
momentum) trained by the batched engine and by opacus (GradSampleModule + DPOptimizer, one model at a time);
prints models/s of both and their ratio. Part 2: seconds per step of the batched engine for PRISM and for
DP-LoRA on the same LoRA models ([P] Table 5 reports PRISM ≈ 2× DP-LoRA's step time).

    .venv/bin/python benchmarks/bench_dpsgd.py [--models 64] [--epochs 1] [--threads 2] [--hidden 128 128]

opacus's loop costs ~2 ms of mostly per-call overhead per model and step; the batched engine's cost is the
arithmetic itself (forward/backward of the padded Poisson batch, the clipped sum, σC noise for every weight), so
the ratio grows with threads and shrinks with model width.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--noise", type=float, default=1.0)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 128], help="MLP hidden widths")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", module="opacus")  # secure-RNG advice, irrelevant to timing

    dataset = data.digits()
    base = models.pretrain(models.mlp(64, 10, tuple(args.hidden)), dataset.public.x, dataset.public.y)
    x, y = dataset.private.x, dataset.private.y
    membership = np.ones((args.models, len(y)), dtype=bool)
    randomness = seeding.shadow_randomness(0, range(args.models))
    config = engine.TrainingConfig(epochs=args.epochs, schedule="constant")
    layout = engine.PoissonLayout.for_members(len(y), config.batch_size)
    setting = (f"{args.models} models, {args.epochs} epoch(s) of {layout.steps} Poisson steps, b = "
               f"{layout.expected_batch_size}, σ = {args.noise}, C = {args.clip}, {args.threads} threads")

    shadow = engine.build(base, "full", None, randomness, torch.device("cpu"))
    start = time.perf_counter()
    engine.train(shadow, dp_sgd("dp-sgd", args.noise, args.clip), x, y, membership, randomness, config)
    batched = args.models / (time.perf_counter() - start)
    start = time.perf_counter()
    opacus_loop(base, x, y, membership, randomness, layout, config, args.noise, args.clip)
    looped = args.models / (time.perf_counter() - start)
    print(f"DP-SGD ({setting}, MLP {'-'.join(map(str, (64, *args.hidden, 10)))} on digits)")
    print(f"  batched engine:    {batched:8.2f} models/s")
    print(f"  opacus per model:  {looped:8.2f} models/s")
    print(f"  ratio batched / opacus: {batched / looped:.2f}x")

    seconds = {}
    for name, mechanism in (("dp-lora", dp_sgd("dp-lora", args.noise, args.clip)),
                            ("prism", PrismMechanism(args.noise, args.clip))):
        shadow = engine.build(base, "lora", models.LoraSpec(args.rank), randomness, torch.device("cpu"))
        start = time.perf_counter()
        engine.train(shadow, mechanism, x, y, membership, randomness, config)
        seconds[name] = (time.perf_counter() - start) / (args.epochs * layout.steps)
    print(f"LoRA r = {args.rank} ({setting})")
    for name, value in seconds.items():
        print(f"  {name:>8}: {1e3 * value:8.1f} ms per step ({1e3 * value / args.models:.2f} ms per model-step)")
    print(f"  ratio PRISM / DP-LoRA step time: {seconds['prism'] / seconds['dp-lora']:.2f}x ([P] Table 5: ≈ 2x)")


if __name__ == "__main__":
    main()

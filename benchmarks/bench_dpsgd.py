"""Batched DP-SGD shadow training vs an opacus per-model loop, and PRISM vs DP-LoRA step time ([P] Table 5).

Part 1: the same K models (same base, same Poisson batches from each model's "data" stream, σ, C, b, SGD with
momentum) trained by the batched engine and by opacus (DPOptimizer, one model at a time, with each of opacus's
per-sample gradient methods: hooks, expanded weights, ghost clipping), at each torch intra-op thread count of
``--threads``; each time is the fastest of ``--repeats`` runs after an untimed warm-up. Prints models/s per
setting and the ratio of the engine's best setting to opacus's default method's best and to opacus's fastest
(method and thread count). Part 2: seconds per step of the batched engine for PRISM and DP-LoRA on the same LoRA
models ([P] Table 5: PRISM ≈ 2×).

    .venv/bin/python benchmarks/bench_dpsgd.py [--models 64] [--epochs 3] [--threads 1 2] [--hidden 128 128]
        [--parts 1 2]

Three epochs by default (a campaign trains ten): with one epoch, per-run setup (opacus wraps each model, the
engine builds its stacks and draws the first noise in place) weighs more on both sides.

opacus's loop costs ~2 ms per model and step, mostly per-call overhead, and gains little from a second thread;
expanded weights and ghost clipping save ~15% of it over hooks on this MLP.
The engine's cost is the arithmetic (forward/backward of the padded Poisson batch, the clipped sum) plus one
normal per weight and model, which it draws on its background thread (:mod:`dpaudit.background`): with one
intra-op thread that thread has the second core to itself; with two, OpenMP's spinning workers compete with it.
"""

from __future__ import annotations

import argparse
import functools
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from dpaudit import data, models, seeding
from dpaudit.mechanisms.base import Mechanism
from dpaudit.mechanisms.dpsgd import dp_sgd
from dpaudit.mechanisms.prism import PrismMechanism
from dpaudit.training import engine, sampling

OPACUS_MODES = ("hooks", "ew", "ghost")


def opacus_loop(
    shadow: engine.ShadowModels,
    x: np.ndarray,
    y: np.ndarray,
    membership: np.ndarray,
    randomness: list,
    layout: sampling.PoissonLayout,
    config: sampling.TrainingConfig,
    noise: float,
    clip: float,
    mode: str,
) -> None:
    """DP-SGD of each of ``shadow``'s models in turn with opacus, on the engine's Poisson batches.

    Model k is ``shadow.module`` with its tensors ``frozen[k]`` and ``trainable[k]``, the latter trained (an MLP's
    adapted weights, a transformer's LoRA factors), on the task's mean loss. ``mode`` is opacus's per-sample gradient
    method: ``hooks`` (GradSampleModule, opacus's default), ``ew`` (torch's expanded weights) or ``ghost`` (ghost
    clipping: per-sample norms without per-sample gradients, and a second backward pass, as the engine's factored
    clipping; classifiers only, through its cross-entropy criterion). All three give the same update (checked: 3e-8).
    """
    from opacus import GradSampleModule
    from opacus.grad_sample import GradSampleModuleExpandedWeights, GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    inputs, labels = torch.from_numpy(x), torch.from_numpy(y)
    task = models.task_of(shadow.module)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="opacus")  # secure-RNG advice, irrelevant to timing
        warnings.filterwarnings("ignore", message="Full backward hook")  # opacus's hooks on a model without input grads
        for k in range(len(randomness)):
            module = shadow.model(k).train()  # opacus records activations in training mode only
            if mode == "ghost":
                sampled = GradSampleModuleFastGradientClipping(module, max_grad_norm=clip, use_ghost_clipping=True)
            else:
                sampled = GradSampleModule(module) if mode == "hooks" else GradSampleModuleExpandedWeights(module)
            sgd = torch.optim.SGD(
                [p for p in sampled.parameters() if p.requires_grad], lr=config.lr, momentum=config.momentum
            )
            optimiser = (DPOptimizerFastGradientClipping if mode == "ghost" else DPOptimizer)(
                sgd, noise_multiplier=noise, max_grad_norm=clip, expected_batch_size=layout.expected_batch_size
            )
            loss = functools.partial(models.mean_loss, task)
            if mode == "ghost":
                loss = DPLossFastGradientClipping(sampled, optimiser, nn.CrossEntropyLoss(), "mean")
            for index, weight in sampling.poisson_batches(
                membership[k : k + 1], randomness[k : k + 1], layout, config.epochs
            ):
                batch = torch.from_numpy(index[0][weight[0] > 0])
                optimiser.zero_grad()
                loss(models.forward(sampled, inputs[batch]), labels[batch]).backward()
                optimiser.step()


@dataclass(frozen=True)
class Trainer:
    """One way to train a setting's first ``models`` models, as :func:`best_seconds` calls it.

    ``train``: :func:`engine.train` or :func:`engine.train_sequentially`; ``build``: the models of given
    randomness; the trained models of the last call go to ``results[name]``.
    """

    name: str
    train: Callable
    build: Callable
    mechanism: Mechanism
    x: np.ndarray
    y: np.ndarray
    randomness: list
    config: sampling.TrainingConfig
    results: dict

    def __call__(self, models: int) -> None:
        membership = np.ones((models, len(self.y)), dtype=bool)
        randomness = self.randomness[:models]
        shadow = self.build(randomness, torch.device("cpu"))
        self.results[self.name] = self.train(
            shadow, self.mechanism, self.x, self.y, membership, randomness, self.config
        )

    def flops(self) -> float:
        """The floating-point operations of training all the models (an untimed run)."""
        with FlopCounterMode(display=False) as counter:
            self(len(self.randomness))
        return counter.get_total_flops()


def best_seconds(trainers: dict, count: int, repeats: int) -> dict[str, float]:
    """Per trainer, the fastest of ``repeats`` timed calls ``train(count)``.

    The timed calls come after one untimed call on two models
    (first-call costs: vmap tracing, opacus's hooks, allocator warm-up). Trainers take turns, so that a slow
    spell of the (shared, virtual) machine slows all of them rather than one.
    """
    for train in trainers.values():
        train(2)
    times = {name: [] for name in trainers}
    for _ in range(repeats):
        for name, train in trainers.items():
            start = time.perf_counter()
            train(count)
            times[name].append(time.perf_counter() - start)
    return {name: min(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--noise", type=float, default=1.0)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch intra-op thread counts")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per side; the fastest counts")
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 128], help="MLP hidden widths")
    parser.add_argument("--parts", type=int, nargs="+", choices=(1, 2), default=[1, 2], help="which parts to run")
    args = parser.parse_args()

    dataset = data.digits()
    base = models.pretrain(models.mlp(64, 10, tuple(args.hidden)), dataset.public.x, dataset.public.y)
    x, y = dataset.private.x, dataset.private.y
    membership = np.ones((args.models, len(y)), dtype=bool)
    randomness = seeding.shadow_randomness(0, range(args.models))
    config = sampling.TrainingConfig(epochs=args.epochs, schedule="constant")
    layout = sampling.PoissonLayout.for_members(len(y), config.batch_size)
    setting = (
        f"{args.models} models, {args.epochs} epoch(s) of {layout.steps} Poisson steps, b = "
        f"{layout.expected_batch_size}, σ = {args.noise}, C = {args.clip}"
    )

    def batched_engine(count: int) -> None:
        shadow = engine.build(base, "full", None, randomness[:count], torch.device("cpu"))
        engine.train(
            shadow, dp_sgd("dp-sgd", args.noise, args.clip), x, y, membership[:count], randomness[:count], config
        )

    def per_model(mode: str):
        def train(count: int) -> None:
            shadow = engine.build(base, "full", None, randomness[:count], torch.device("cpu"))
            rows = membership[:count], randomness[:count]
            opacus_loop(shadow, x, y, *rows, layout, config, args.noise, args.clip, mode)

        return train

    if 1 in args.parts:
        opacus_comparison(args, setting, batched_engine, per_model)
    if 2 in args.parts:
        prism_comparison(args, setting, base, x, y, membership, randomness, config, layout)


def opacus_comparison(args, setting: str, batched_engine, per_model) -> None:
    """Part 1: models/s of the batched engine and of opacus's methods at each thread count, and the ratios."""
    print(f"DP-SGD ({setting}, MLP {'-'.join(map(str, (64, *args.hidden, 10)))} on digits), models/s")
    print(f"  {'threads':>7}  {'batched engine':>14}" + "".join(f"  {'opacus ' + mode:>13}" for mode in OPACUS_MODES))
    rates = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        trainers = {"engine": batched_engine, **{mode: per_model(mode) for mode in OPACUS_MODES}}
        seconds = best_seconds(trainers, args.models, args.repeats)
        rates.update({(name, threads): args.models / value for name, value in seconds.items()})
        print(
            f"  {threads:>7}  {rates['engine', threads]:14.2f}"
            + "".join(f"  {rates[mode, threads]:13.2f}" for mode in OPACUS_MODES)
        )
    engine_best = max((rate, threads) for (name, threads), rate in rates.items() if name == "engine")
    for label, modes in (("opacus's default (hooks)", ("hooks",)), ("opacus's fastest method", OPACUS_MODES)):
        rate, (mode, threads) = max((rate, key) for key, rate in rates.items() if key[0] in modes)
        print(
            f"  ratio batched / {label}, each at its best setting (engine {engine_best[1]} thread(s), opacus "
            f"{mode} {threads} thread(s)): {engine_best[0] / rate:.2f}x"
        )


def prism_comparison(args, setting: str, base, x, y, membership, randomness, config, layout) -> None:
    """Part 2: seconds per step of PRISM and DP-LoRA on the same LoRA models, taking turns, and their ratio."""
    torch.set_num_threads(min(args.threads))

    def lora_engine(mechanism):
        def train(count: int) -> None:
            shadow = engine.build(base, "lora", models.LoraSpec(args.rank), randomness[:count], torch.device("cpu"))
            engine.train(shadow, mechanism, x, y, membership[:count], randomness[:count], config)

        return train

    trainers = {
        "dp-lora": lora_engine(dp_sgd("dp-lora", args.noise, args.clip)),
        "prism": lora_engine(PrismMechanism(args.noise, args.clip)),
    }
    seconds = {
        name: value / (args.epochs * layout.steps)
        for name, value in best_seconds(trainers, args.models, args.repeats).items()
    }
    print(f"LoRA r = {args.rank} ({setting}, {min(args.threads)} thread(s))")
    for name, value in seconds.items():
        print(f"  {name:>8}: {1e3 * value:8.1f} ms per step ({1e3 * value / args.models:.2f} ms per model-step)")
    print(f"  ratio PRISM / DP-LoRA step time: {seconds['prism'] / seconds['dp-lora']:.2f}x ([P] Table 5: ≈ 2x)")


if __name__ == "__main__":
    main()

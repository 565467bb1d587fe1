"""[S] Table 1 analogue (MIA on full fine-tuning vs LoRA vs LoRA-FA) and [S] Lemma 7.2 with measured λ̄, C, β.

Lemma 7.2's ε with the run's measured λ̄, C and β is set beside the audited ε of the same setting.

Part 1 (``s_table1_lora_variants.csv``): every private example a target, IN for half of ``--models`` models
(the all-examples design; [S] attacks training examples), attacked with [S] Eq. 16's reference-calibrated loss
(θ_ref = the pretrained base) and LiRA online. Non-private fine-tuning, all on the same footing: the DP-SGD
family with σ = 0 and C = ∞ (Poisson batches, plain gradients) on the full weights (``dp-sgd``), on both LoRA
factors (``dp-lora``) and on B only (``dp-lora-fa``), at several ranks and batch sizes. [S] Table 1's claim:
LoRA lowers the MIA AUC vs full fine-tuning, LoRA-FA lowers it further, smaller r and larger b lower it.

Part 2 (``s_table1_lemma72.csv``): [S] Lemma 7.2 says noise-free LoRA-FA with frozen Gaussian A is
(α, ε(α))-RDP when ``Γ = (ηβ/4) b(λ̄ + rσ_g²) / (C² T((1+ηβ)^T − 1)) > 1``. One LoRA-FA model is trained by
plain SGD (the lemma's update; the campaign's lr, b, epochs and rank) while recording, per adapted layer W_ℓ
(n × m): the largest per-example gradient norm ‖∇_W l(x_i)‖_F (C), the cumulative batch gradient
G_ℓ = Σ_t ∇_W L^t and λ_min(G_ℓ G_ℓᵀ) (λ̄), and the smoothness estimate β̂ = max_t ‖∇L_D(W_{t+1}) − ∇L_D(W_t)‖ /
‖W_{t+1} − W_t‖ (full-data gradients, all layers jointly; a lower estimate of the true β). Γ and ε come from
``accountants.sketch.lemma72`` (σ_g = 0, τ = n), once with λ̄ over all layers and once over the layers with
m ≥ n only (the lemma's shape assumption). Beside it: the canary audit of noise-free LoRA-FA at the same rank
(Clopper-Pearson ε lower bound, [W] App. F.1).

    python experiments/s_table1_lora_variants.py
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

import _common
import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from accountants import sketch
from dpaudit import data, models
from dpaudit.campaign import resolve as resolver
from dpaudit.config import CampaignConfig
from dpaudit.training import sampling

NAME = "s_table1_lora_variants"
ATTACKS = ("reference", "lira-online")
DELTA = 1e-5


def variants(ranks: Sequence[int], batch_size: int = 32, large_batch_size: int = 128) -> list[tuple[str, int, int]]:
    """(mechanism, rank, batch size) of Part 1.

    Full fine-tuning and LoRA at r = 16, LoRA-FA at every rank of ``ranks``, all at ``batch_size``; LoRA-FA at
    r = 16 again at ``large_batch_size``.
    """
    return [
        ("dp-sgd", 16, batch_size),
        ("dp-lora", 16, batch_size),
        *[("dp-lora-fa", r, batch_size) for r in ranks],
        ("dp-lora-fa", 16, large_batch_size),
    ]


def add_optimizer_argument(parsed: argparse.ArgumentParser) -> None:
    """``--optimizer`` and ``--lr`` of Part 1's campaigns: SGD with momentum (the default), or AdamW.

    Under AdamW LoRA's A moves; under SGD from B = 0 it barely does, and LoRA and LoRA-FA train almost alike.
    """
    parsed.add_argument("--optimizer", choices=sampling.OPTIMIZERS, default="sgd", help="Part 1's optimiser (sgd)")
    parsed.add_argument(
        "--lr", type=float, default=CampaignConfig.lr, help=f"Part 1's learning rate ({CampaignConfig.lr:g})"
    )


def part1(
    args: argparse.Namespace,
    name: str,
    ranks: Sequence[int],
    models_count: int,
    epochs: int,
    title: str,
    columns: dict | None = None,
    batch_sizes: tuple[int, int] = (32, 128),
) -> pd.DataFrame:
    """Part 1 on ``args.dataset``: one all-examples campaign per :func:`variants` point, attacked by :data:`ATTACKS`.

    Non-private (σ = 0, C = ∞) DP-SGD-family training of the full weights, LoRA and LoRA-FA; ``ranks`` are clipped
    to what the dataset's default model admits (:func:`_common.allowed_ranks`); ``batch_sizes``: that of every
    row and that of the larger-batch row (:func:`variants`). Run directories go under
    ``args.out/name``; the rows (each with ``columns`` appended: settings that describe the whole table) are
    written to ``args.out/name.csv`` and plotted into ``args.out/name.png``.
    """
    out = args.out / name
    rows = []
    for mechanism, rank, batch_size in variants(_common.allowed_ranks(args.dataset, ranks), *batch_sizes):
        config = CampaignConfig(
            mechanism=mechanism,
            dataset=args.dataset,
            rank=None if mechanism == "dp-sgd" else rank,  # full fine-tuning has no rank
            models=models_count,
            epochs=epochs,
            batch_size=batch_size,
            noise=0.0,
            clip=math.inf,
            design="all-examples",
            seed=args.seed,
            optimizer=args.optimizer,
            lr=args.lr,
        )
        numbers = _common.audit(config, out, f"{mechanism}_r{rank}_b{batch_size}", args.workers, ATTACKS)
        rows.append(
            {
                "mechanism": mechanism,
                "rank": rank if mechanism != "dp-sgd" else None,
                "batch_size": batch_size,
                "optimizer": args.optimizer,
                **numbers,
                **(columns or {}),
            }
        )
    table = _common.write_table(rows, args.out, name)
    with _common.figure(args.out, name) as (ax,):
        labels = [
            m if m == "dp-sgd" else f"{m}\nr={r:g} b={b}"
            for m, r, b in zip(table["mechanism"], table["rank"], table["batch_size"])
        ]
        for shift, attack in zip((-0.2, 0.2), ATTACKS):
            ax.bar(np.arange(len(table)) + shift, table[f"{attack}_auc"], width=0.4, label=attack)
        ax.set_xticks(np.arange(len(table)), labels, fontsize=6)
        ax.set(ylabel="MIA AUC (all examples)", ylim=(0.45, None), title=f"non-private fine-tuning, {title}")
        ax.legend()
    return table


def measure_lemma72_inputs(
    base: nn.Module, dataset: data.Dataset, rank: int, lr: float, batch_size: int, epochs: int, seed: int
) -> dict:
    """Train one LoRA-FA model by plain SGD on the private split and measure C, λ_min(G_ℓ G_ℓᵀ) and β̂."""
    names = [f"{name}.weight" for name in models.adapted_layers(base)]
    initial = {name: p.detach() for name, p in base.named_parameters() if name in names}
    generator = torch.Generator().manual_seed(seed)
    factors_a = {name: models.draw_lora_a((rank, w.shape[1]), rank, generator) for name, w in initial.items()}
    factors_b = {name: torch.zeros(w.shape[0], rank) for name, w in initial.items()}
    x, y = torch.from_numpy(dataset.private.x), torch.from_numpy(dataset.private.y)

    def loss(weights, inputs, labels):
        return nn.functional.cross_entropy(functional_call(base, weights, (inputs,)), labels)

    per_example = vmap(grad(lambda w, xi, yi: loss(w, xi[None], yi[None])), in_dims=(None, 0, 0))
    full_gradient = grad(loss)
    steps_per_epoch = math.ceil(len(y) / batch_size)
    cumulative = {name: torch.zeros_like(w) for name, w in initial.items()}
    grad_bound, smoothness, previous = 0.0, 0.0, None
    order_rng = np.random.default_rng(seed)
    for _ in range(epochs):
        for batch in np.array_split(order_rng.permutation(len(y)), steps_per_epoch):
            weights = {name: initial[name] + factors_b[name] @ factors_a[name] for name in names}
            examples = per_example(weights, x[batch], y[batch])
            grad_bound = max(grad_bound, max(float(g.flatten(1).norm(dim=1).max()) for g in examples.values()))
            whole = full_gradient(weights, x, y)
            if previous is not None:
                moved = math.sqrt(sum(float((weights[n] - previous[0][n]).square().sum()) for n in names))
                changed = math.sqrt(sum(float((whole[n] - previous[1][n]).square().sum()) for n in names))
                smoothness = max(smoothness, changed / moved)
            previous = (weights, whole)
            for name in names:
                batch_gradient = examples[name].mean(0)
                cumulative[name] += batch_gradient
                factors_b[name] -= lr * batch_gradient @ factors_a[name].T  # ∂L/∂B = (∂L/∂W) Aᵀ (scale 1)
    gram_minimum = {name: float(torch.linalg.eigvalsh(g @ g.T)[0].clamp(min=0)) for name, g in cumulative.items()}
    return dict(
        grad_bound=grad_bound,
        smoothness=smoothness,
        steps=epochs * steps_per_epoch,
        gram_minimum=gram_minimum,
        shapes={name: tuple(w.shape) for name, w in initial.items()},
    )


def lemma72_rows(measured: dict, rank: int, lr: float, batch_size: int) -> list[dict]:
    """Lemma 7.2 over all layers, over the layers with m ≥ n only (n × m weights), and for the best single layer.

    The best single layer is the one with the largest λ_min (the most favourable reading);
    ``lambda_bar_for_gamma_1``: the λ̄ that would make Γ = 1.
    """
    shapes, gram = measured["shapes"], measured["gram_minimum"]
    rows = []
    for scope, layers in (
        ("all layers", list(shapes)),
        ("layers with m >= n", [n for n, (out, inp) in shapes.items() if inp >= out]),
        ("layer with the largest lambda_min", [max(gram, key=gram.get)]),
    ):
        lambda_bar = min(gram[n] for n in layers)
        tau = max(shapes[n][0] for n in layers)
        bound = sketch.lemma72(
            DELTA,
            lr,
            measured["smoothness"],
            batch_size,
            lambda_bar,
            0.0,
            measured["grad_bound"],
            measured["steps"],
            rank,
            len(layers),
            tau,
        )
        lr_smooth = lr * measured["smoothness"]
        steps = measured["steps"]
        needed = (
            4
            * measured["grad_bound"] ** 2
            * steps
            * math.expm1(steps * math.log1p(lr_smooth))
            / (lr_smooth * batch_size)
        )
        rows.append(
            dict(
                scope=scope,
                layers=len(layers),
                rank=rank,
                lr=lr,
                batch_size=batch_size,
                steps=measured["steps"],
                grad_bound_C=measured["grad_bound"],
                smoothness_beta=measured["smoothness"],
                lambda_bar=lambda_bar,
                lambda_bar_for_gamma_1=needed,
                tau=tau,
                gamma=sketch.gamma_lora(
                    lr,
                    measured["smoothness"],
                    batch_size,
                    lambda_bar,
                    0.0,
                    measured["grad_bound"],
                    measured["steps"],
                    rank,
                ),
                delta=DELTA,
                lemma72_epsilon=bound.epsilon,
                lemma72_reason=bound.reason,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parsed = _common.parser(__doc__)
    parsed.add_argument("--lemma-rank", type=int, default=16, help="rank of the Lemma 7.2 setting")
    add_optimizer_argument(parsed)
    args = parsed.parse_args(argv)
    models_count, epochs = _common.scale(args, cpu=(64, 3), paper=(256, 30))
    ranks = (8, 64, 256) if args.paper_scale else (4, 16, 64)
    part1(args, NAME, ranks, models_count, epochs, args.dataset)
    out = args.out / NAME

    config = CampaignConfig(
        mechanism="lora-fa",
        dataset=args.dataset,
        rank=args.lemma_rank,
        models=2 * models_count,
        epochs=epochs,
        seed=args.seed,
    )
    audited = _common.audit(config, out, f"lemma_audit_r{args.lemma_rank}", args.workers)
    dataset = resolver.load_dataset(args.dataset)
    base = models.pretrain(
        models.for_input(dataset.input_shape, dataset.num_classes), dataset.public.x, dataset.public.y, seed=args.seed
    )
    measured = measure_lemma72_inputs(base, dataset, args.lemma_rank, config.lr, config.batch_size, epochs, args.seed)
    print("λ_min(G Gᵀ) per layer:", measured["gram_minimum"])
    rows = [
        dict(
            row,
            audit_auc=audited["auc"],
            audit_epsilon_lower_bound=audited["epsilon_lower_bound"],
            audit_models=config.models,
        )
        for row in lemma72_rows(measured, args.lemma_rank, config.lr, config.batch_size)
    ]
    _common.write_table(rows, args.out, "s_table1_lemma72")


if __name__ == "__main__":
    main()

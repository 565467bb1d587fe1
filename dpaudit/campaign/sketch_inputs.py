"""[S] Lemma 7.2's inputs measured on a LoRA-FA campaign: λ̄, C and β̂ (docs/theory.md §2.8).

The lemma's ε needs the smallest eigenvalue λ̄ of the cumulative gradient's Gram matrix, a per-example gradient
bound C and the loss's smoothness β; :func:`measure_sketch_inputs` measures them on two of the campaign's models,
retrained on the CPU as the full-weight realisation of LoRA-FA, and :func:`dpaudit.mechanisms.bounds.sketch_claim`
turns them into the claimed ε.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from dpaudit.campaign.shadow import Setup, one_thread_precision
from dpaudit.mechanisms.base import Mechanism, Step
from dpaudit.mechanisms.wishart import WishartProjection, project
from dpaudit.seeding import shadow_randomness
from dpaudit.training import engine
from dpaudit.training.gradients import gradient_function

_SKETCH_MODELS = 2  # models [S] Lemma 7.2's inputs are measured on: one with the (first) target, one without
_SMOOTHNESS_PAIRS = 32  # consecutive step pairs the smoothness β̂ is estimated at


@dataclass
class _SketchInputsRecorder(Mechanism):
    """LoRA-FA as full-weight training (docs/theory.md §1.2 (b)) that records [S] Lemma 7.2's inputs at every step.

    :class:`WishartProjection` draws the campaign's own A. Recorded: the largest per-example gradient norm of one
    layer (C), the cumulative batch gradient G = Σ_t ∇_W L^t per layer, and the weights before the steps in
    ``snapshot_steps`` (for β̂).
    """

    projection: WishartProjection
    snapshot_steps: frozenset[int]
    grad_bound: float = 0.0
    cumulative: dict[str, torch.Tensor] = field(default_factory=dict)
    snapshots: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    name: str = field(default="lora-fa", init=False)
    parameterization: str = field(default="full", init=False)
    per_example: bool = field(default=True, init=False)

    def setup(self, shapes, randomness) -> dict[str, torch.Tensor]:
        return self.projection.setup(shapes, randomness)

    def transform(self, step: Step, factors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        examples, present = step.example_gradients(), step.weights > 0
        parameters = step.trained_tensors()
        for name in parameters:
            norms = examples.transformed_squared_norms(name, None, None)[present]
            self.grad_bound = max(self.grad_bound, float(norms.max().sqrt()) if norms.numel() else 0.0)
        # The batch mean, as the engine's batch loss weighs examples (padding has weight 0).
        mean = examples.weighted_sum(step.weights / step.weights.sum(dim=1, keepdim=True).clamp(min=1.0))
        for name, gradient in mean.items():
            self.cumulative[name] = self.cumulative.get(name, 0) + gradient.double()
        if step.index in self.snapshot_steps:
            self.snapshots[step.index] = {name: t.detach().clone() for name, t in parameters.items()}
        return project(mean, factors, self.projection.scale)


def retrain_recording(
    setup: Setup, indices: np.ndarray, snapshot_steps: frozenset[int]
) -> tuple[_SketchInputsRecorder, engine.ShadowModels]:
    """Models ``indices`` of the campaign trained again on the CPU as full-weight LoRA-FA, recording as they train."""
    lora = setup.settings.lora
    assert lora is not None, "LoRA-FA has a rank"
    recorder = _SketchInputsRecorder(WishartProjection(lora.rank, lora.scale), snapshot_steps)
    randomness = shadow_randomness(setup.settings.seed, indices)
    device = torch.device("cpu")
    shadow = engine.build(setup.base, "full", None, randomness, device)
    membership = setup.pool_membership[indices]
    with one_thread_precision(setup.settings.precision, device):
        engine.train(
            shadow, recorder, setup.pool_x, setup.pool_y, membership, randomness, setup.settings.training, setup.layout
        )
    return recorder, shadow


def measure_sketch_inputs(setup: Setup) -> dict:
    """[S] Lemma 7.2's λ̄, C and β̂ (:class:`dpaudit.bounds.SketchClaim`), measured on two of the campaign's models.

    The models (one with the first target IN, one without) are trained again on the CPU with their own
    randomness, as the full-weight realisation of LoRA-FA that equals the campaign's (docs/theory.md §1.2 (b)),
    so every gradient is ∇_W. β̂ = max ‖∇L_D(W_{t+1}) - ∇L_D(W_t)‖ / ‖W_{t+1} - W_t‖ over up to 32 evenly spaced
    step pairs, L_D the model's loss on all its members and the norms over all adapted layers jointly.
    """
    target_in = setup.pool_membership[:, setup.target_index[0]] if len(setup.target_index) else None
    if target_in is None and setup.canary_membership is not None:
        target_in = setup.canary_membership[:, 0]
    indices = (
        np.array([np.argmax(target_in), np.argmin(target_in)])
        if target_in is not None and target_in.any() and not target_in.all()
        else np.arange(min(_SKETCH_MODELS, setup.models))
    )
    training, members = setup.settings.training, setup.layout.members
    assert members is not None, "a campaign's batch layout is built for its member count (BatchLayout.for_members)"
    steps = training.epochs * setup.layout.steps
    starts = np.unique(np.linspace(0, max(steps - 2, 0), min(_SMOOTHNESS_PAIRS, max(steps - 1, 1))).astype(int))
    pairs = [(int(t), int(t) + 1) for t in starts if t + 1 < steps]
    recorder, shadow = retrain_recording(setup, indices, frozenset(t for pair in pairs for t in pair))
    membership = setup.pool_membership[indices]
    with one_thread_precision(setup.settings.precision, torch.device("cpu")):
        full_gradient = gradient_function(shadow.module, per_example=False)
        x = torch.from_numpy(setup.pool_x).expand(len(indices), *setup.pool_x.shape)
        y = torch.from_numpy(setup.pool_y).expand(len(indices), *setup.pool_y.shape)
        weights = torch.from_numpy(membership.astype(np.float32))
        smoothness = 0.0
        for before, after in pairs:
            start, end = recorder.snapshots[before], recorder.snapshots[after]
            gradients = [full_gradient(weights_at, shadow.frozen, x, y, weights) for weights_at in (start, end)]
            moved = torch.stack([(end[n] - start[n]).double().flatten(1).square().sum(1) for n in start]).sum(0)
            changed = torch.stack(
                [(gradients[1][n] - gradients[0][n]).double().flatten(1).square().sum(1) for n in start]
            ).sum(0)
            ratio = (changed.sqrt() / moved.sqrt()).nan_to_num(nan=0.0)
            smoothness = max(smoothness, float(ratio.max()))
    gram_minimum = min(
        float(torch.linalg.eigvalsh(g.flatten(2) @ g.flatten(2).mT)[:, 0].clamp(min=0).min())
        for g in recorder.cumulative.values()
    )
    inserted = " (gradient canaries not inserted)" if setup.canaries is not None else ""
    return {
        "grad_bound": recorder.grad_bound,
        "smoothness": smoothness,
        "gram_minimum": gram_minimum,
        "lr": training.lr,
        "momentum": training.momentum,
        "schedule": training.schedule,
        "steps": steps,
        "batch_size": min(training.batch_size, members),  # a shuffled batch holds at most every member
        "models": [int(i) for i in indices],
        "method": (
            f"measured after training on models {', '.join(map(str, indices))}{inserted}, retrained on the CPU as"
            " full-weight LoRA-FA with their own A: λ̄ = min over layers and models of λ_min(G Gᵀ), G = Σ_t ∇_W L^t;"
            " C = the largest per-example ‖∇_W l‖ of one layer over every step; β̂ = the largest"
            f" ‖ΔL_D gradient‖ / ‖ΔW‖ over {len(pairs)} consecutive step pairs"
        ),
    }

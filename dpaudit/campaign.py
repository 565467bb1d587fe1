"""A membership-inference campaign: plan, shadow training in chunks on workers, outputs streamed to the store.

Data flow (docs/architecture.md §1): config → :class:`Setup` (pretrained base, targets, membership plan; saved to the
run directory before any shadow model trains) → chunks of shadow models trained by the engine in worker
processes (joblib: loky locally, dask across machines) → per-chunk outputs written atomically by the driver →
:mod:`dpaudit.analysis` turns them into scores and statistics.

Designs: ``canary`` ([W] App. F.1: a static-poison canary, IN for half of the models), ``all-examples``
(every private example a target, IN for exactly half of the models; Carlini et al. 2022) and ``one-run`` (M
canaries, each IN with probability ½ independently in every model; Steinke et al. 2023). The canary is an input
(``--canary input``) or a crafted gradient the engine inserts (``--canary gradient``, :mod:`dpaudit.canaries`).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import io
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import astuple, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from attacks import canary as input_canary
from attacks import designs
from dpaudit import bounds, engine, models, text
from dpaudit import canaries as canary_lib
from dpaudit import data as data_lib
from dpaudit.config import PYTHON_OBJECT, CampaignConfig, Execution
from dpaudit.errors import UsageError
from dpaudit.mechanisms import privacy, registry
from dpaudit.mechanisms.base import Mechanism, Step
from dpaudit.mechanisms.wishart import WishartProjection, project
from dpaudit.seeding import ModelRandomness, campaign_rng, shadow_randomness
from dpaudit.store import ChunkOutputs, Plan, RunStore, checksum

_CPU_CHUNK_RANGE = (16, 128)  # models per chunk: small enough to balance workers, large enough to batch well
_EXPOSURE_CANDIDATES = 1000  # candidates of the secrets' format each model scores: exposure up to log2(1001) ≈ 10
_LOGIT_ELEMENTS = 2**24  # next-token logits materialised at once while a chunk's outputs are summarised (64 MiB)


@dataclass
class Inputs:
    """What a campaign audits: its dataset, its base model (untrained when it is to be pretrained), its mechanism."""

    dataset: data_lib.Dataset
    architecture: nn.Module
    mechanism: Mechanism


@dataclass
class Setup:
    """Everything a chunk needs to train its models; picklable, sent to each worker."""

    config: CampaignConfig
    dataset: data_lib.Dataset
    base: nn.Module
    mechanism: Mechanism
    pool_x: np.ndarray  # the fine-tuning pool (private split, plus the canary in the canary design)
    pool_y: np.ndarray
    pool_membership: np.ndarray  # (models, pool) bool: what each model trains on
    target_index: np.ndarray  # (targets,) pool rows the attack targets (none for gradient canaries)
    layout: engine.BatchLayout
    canaries: canary_lib.GradientCanaries | None = None  # gradient canaries, inserted by the engine
    canary_membership: np.ndarray | None = None  # (models, canaries) bool: which gradient canaries each model gets
    # Next-token campaigns with secret canaries: the windows of the candidates the secrets' exposure is ranked in.
    exposure_candidates: np.ndarray | None = None

    @property
    def lora(self) -> models.LoraSpec | None:
        """The LoRA adapter of the campaign's mechanism; None for full fine-tuning (no rank)."""
        return _lora(self.config)

    @property
    def targets_x(self) -> np.ndarray:
        return self.pool_x[self.target_index]

    @property
    def targets_y(self) -> np.ndarray:
        return self.pool_y[self.target_index]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda asked for, but torch sees no CUDA device; use --device cpu")
    return torch.device(name)


def _lora(config: CampaignConfig) -> models.LoraSpec | None:
    if config.rank is None:
        return None
    return models.LoraSpec(config.rank, config.alpha, config.target_modules)


def _training(config: CampaignConfig) -> engine.TrainingConfig:
    return engine.TrainingConfig(
        epochs=config.epochs,
        batch_size=config.batch_size,
        lr=config.lr,
        momentum=config.momentum,
        schedule=config.schedule,
    )


@contextmanager
def _one_thread_precision(config: CampaignConfig, device: torch.device) -> Iterator[None]:
    """One torch thread and the campaign's precision.

    The thread count changes float results: bit-identity across worker counts needs a fixed one.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.precision == "bf16"):
            yield
    finally:
        torch.set_num_threads(threads)


def _train(
    setup: Setup,
    randomness: list[ModelRandomness],
    membership: np.ndarray,
    device: torch.device,
    on_step: Callable[[int], None] | None = None,
    canaries: canary_lib.CanaryRun | None = None,
) -> engine.ShadowModels:
    shadow = engine.build(setup.base, setup.mechanism.parameterization, setup.lora, randomness, device)
    with _one_thread_precision(setup.config, device):
        engine.train(
            shadow,
            setup.mechanism,
            setup.pool_x,
            setup.pool_y,
            membership,
            randomness,
            _training(setup.config),
            setup.layout,
            on_step,
            canaries,
        )
    return shadow


def _canary_labels(
    config: CampaignConfig,
    dataset: data_lib.Dataset,
    base: nn.Module,
    mechanism: Mechanism,
    x_q: np.ndarray,
    device: torch.device,
) -> np.ndarray:
    """y_q = argmin of a reference model's logits on each canary x_q, that model trained on D by the same procedure."""
    reference = Setup(
        config,
        dataset,
        base,
        mechanism,
        dataset.private.x,
        dataset.private.y,
        np.ones((1, len(dataset.private)), dtype=bool),
        np.zeros(0, dtype=np.int64),
        engine.BatchLayout.for_members(len(dataset.private), config.batch_size),
    )
    randomness = [ModelRandomness(config.seed, 0, role="reference")]
    shadow = _train(reference, randomness, reference.pool_membership, device)
    logits = engine.logits(shadow, x_q)[0].cpu().numpy()
    return np.array([input_canary.least_likely_label(row) for row in logits], dtype=np.int64)


def _reference_start(config: CampaignConfig, base: nn.Module, mechanism: Mechanism) -> engine.ShadowModels:
    """The attacker's reference model at its starting point (the canaries' directions are chosen there)."""
    randomness = [ModelRandomness(config.seed, 0, role="reference")]
    return engine.build(base, mechanism.parameterization, _lora(config), randomness, torch.device("cpu"))


def _gradient_canaries(
    config: CampaignConfig, dataset: data_lib.Dataset, base: nn.Module, mechanism: Mechanism
) -> canary_lib.GradientCanaries:
    """The campaign's gradient canaries: Dirac coordinates or a random direction (:mod:`dpaudit.canaries`)."""
    reference = _reference_start(config, base, mechanism)
    norm, direction = config.canary_norm, config.canary_direction
    assert norm is not None and direction is not None, "CampaignConfig fills a gradient canary's norm and direction"
    adapter = getattr(mechanism, "adapter", None)  # PRISM: canaries in the adapted weights (docs/theory.md §3.9)
    with _one_thread_precision(config, torch.device("cpu")):  # one thread: the same ranking on every machine
        return canary_lib.choose(
            reference,
            dataset.public.x,
            dataset.public.y,
            direction,
            config.canaries or 1,
            norm,
            campaign_rng(config.seed, "canary"),
            None if adapter is None else adapter.scale,
        )


def _one_run_membership(config: CampaignConfig) -> np.ndarray:
    """(models, M) bool: each canary IN with probability ½, independently in every model (Steinke et al. 2023)."""
    assert config.canaries is not None, "CampaignConfig requires --canaries with --design one-run"
    return campaign_rng(config.seed, "membership").random((config.models, config.canaries)) < 0.5


def _base_checksum(base: nn.Module) -> str:
    return checksum({name: tensor.cpu().numpy() for name, tensor in base.state_dict().items()})


def _stored_base(store: RunStore, architecture: nn.Module, plan: Plan | None) -> nn.Module | None:
    """base.pt loaded into ``architecture``, or None if it must be pretrained again (deterministic given the seed).

    None: absent, unreadable (a crash or a full disk while it was written) or not the base the plan was made with.
    """
    data = store.read_base()
    if data is None:
        return None
    try:
        architecture.load_state_dict(torch.load(io.BytesIO(data), weights_only=True))
    except Exception:  # noqa: BLE001 - truncated, garbage or foreign: torch raises many types; all mean "remake"
        return None
    base = architecture.eval().requires_grad_(False)
    if plan is not None and _base_checksum(base) != str(plan.base_checksum):
        return None
    return base


def resolve(config: CampaignConfig) -> Inputs:
    """The dataset, base model and mechanism that the config's names (--dataset, --model, --mechanism) stand for."""
    for option, spec in (("--model", config.model), ("--dataset", config.dataset), ("--mechanism", config.mechanism)):
        if spec is not None and spec.startswith(PYTHON_OBJECT):
            raise UsageError(
                f"{option} {spec} is a Python object given to dpaudit.audit, which no name can rebuild: continue"
                " this run from Python, with dpaudit.audit(..., out=RUN_DIR) and the same objects"
            )
    dataset = data_lib.load(config.dataset)
    if config.model is None:
        architecture: nn.Module = models.for_input(dataset.input_shape, dataset.num_classes, dataset.task)
        models.initialise(architecture, config.seed)  # the built-in model's weights: from the seed, never global
    else:
        architecture = models.from_factory(config.model, dataset.input_shape, dataset.num_classes)
    return Inputs(dataset, architecture, registry.build(config))


def check_inputs(config: CampaignConfig, inputs: Inputs) -> Inputs:
    """``inputs`` checked against the config before anything is written.

    The checks that need them: the model learns the data's task, it has layers to adapt, the rank fits every
    adapted layer, ``target_modules`` name layers of a LoRA adapter, the gradient canaries fit the trained tensors.
    """
    dataset, architecture, mechanism = inputs.dataset, inputs.architecture, inputs.mechanism
    if models.task_of(architecture) != dataset.task:
        raise UsageError(
            f"--dataset {config.dataset} is {dataset.task} data, but the model ({type(architecture).__name__}) learns"
            f" {models.task_of(architecture)} (its `task` attribute): give a model of the data's task, e.g."
            " dpaudit.transformer.CausalTransformer for text"
        )
    if not models.adapted_layers(architecture):
        raise UsageError(
            f"the model ({type(architecture).__name__}) has no nn.Linear or nn.Conv2d layer for the mechanism to"
            " train: build it from such layers"
        )
    if config.target_modules is not None and (
        mechanism.parameterization == "full" or config.mechanism in bounds.SKETCH_CLAIM_MECHANISMS
    ):
        raise UsageError(
            f"--target-modules chooses the layers of a LoRA adapter, and mechanism {config.mechanism!r} trains or"
            " measures every layer: leave --target-modules out, or use dp-lora, dp-lora-fa or prism"
        )
    if config.rank is not None:  # LoRA or m1/m2's projection: r <= d_in
        models.check_rank(architecture, config.rank, config.target_modules)
    if config.canary == "gradient" and config.canaries is not None:
        trained = _reference_start(config, architecture, mechanism).trainable
        coordinates = sum(t[0].numel() for t in trained.values())
        if config.canaries > coordinates:
            raise UsageError(
                f"--canaries {config.canaries} exceeds the {coordinates} coordinates of the trained tensors: orthogonal"
                f" Dirac canaries need one coordinate each; use --canaries <= {coordinates}"
            )
    return inputs


def fingerprints(config: CampaignConfig, inputs: Inputs) -> dict[str, str]:
    """The model's and the mechanism's fingerprints, recorded in campaign.json so that resume refuses a change.

    The model: its architecture and the weights it starts from (pretraining first re-draws them from the seed);
    the mechanism: its class and every parameter, as its ``repr`` shows them (a dataclass's fields).
    """
    start = inputs.architecture
    if config.pretrain:
        start = copy.deepcopy(start)
        models.initialise(start, config.seed)
    mechanism = type(inputs.mechanism)
    described = f"{mechanism.__module__}.{mechanism.__qualname__}:{inputs.mechanism!r}"
    return {
        "model_fingerprint": models.fingerprint(start),
        "mechanism_fingerprint": hashlib.sha256(described.encode()).hexdigest(),
    }


def prepare(config: CampaignConfig, store: RunStore, device: torch.device, inputs: Inputs | None = None) -> Setup:
    """The campaign's setup: created (and saved to ``store``) on first use, loaded from it on resume.

    Pretraining and the canary's label are computed once and stored, so a resumed campaign continues with
    exactly the base and canary its finished chunks were trained with. base.pt is written before plan.npz, whose
    presence marks a complete setup; either, missing or damaged, is made again (both are deterministic), and a
    re-pretrained base must match the checksum the plan recorded. ``inputs``: checked ones (:func:`check_inputs`);
    None: :func:`resolve` the config's names.
    """
    inputs = check_inputs(config, resolve(config)) if inputs is None else inputs
    dataset, architecture, mechanism = inputs.dataset, inputs.architecture, inputs.mechanism
    resumed = store.create_or_check(config, dataset.fingerprint(), fingerprints(config, inputs))
    plan = store.saved_plan() if resumed else None
    base = _stored_base(store, architecture, plan) if resumed else None
    if base is None:
        # pretrain() re-initialises every parameter from the seed, so a half-loaded architecture changes nothing.
        base = (
            models.pretrain(architecture, dataset.public.x, dataset.public.y, seed=config.seed)
            if config.pretrain
            else architecture.eval().requires_grad_(False)
        )
        if plan is not None and _base_checksum(base) != str(plan.base_checksum):
            raise UsageError(
                f"{store.root / 'base.pt'} was damaged, and pretraining again gives another base than the one its"
                " models were trained with (another machine or torch version?): re-run the campaign into a new"
                " directory"
            )
        buffer = io.BytesIO()
        torch.save(base.state_dict(), buffer)
        store.write_base(buffer.getvalue())
    gradient_canaries = canary_membership = candidates = None
    next_token = dataset.task == "next-token"
    if config.design != "all-examples":
        design_membership = (
            designs.single_canary_design(config.models, config.seed)[:, None]
            if config.design == "canary"
            else _one_run_membership(config)
        )
        # A null campaign keeps the design's groups but trains no model on any canary.
        inserted = design_membership & (not config.null)
        count = design_membership.shape[1]
        if config.canary == "input":
            if next_token:
                # Secrets (Carlini et al. 2019), and the candidates of their format their exposure is ranked in.
                length = dataset.input_shape[0]
                windows = text.secret_windows(count, campaign_rng(config.seed, "canary"), length)
                x_q, labels = windows[:, :-1], windows[:, 1:]
                candidates = text.secret_windows(_EXPOSURE_CANDIDATES, campaign_rng(config.seed, "exposure"), length)
            else:
                shape = (count, *dataset.input_shape)
                x_q = input_canary.draw_canary_input(shape, campaign_rng(config.seed, "canary")).astype(np.float32)
                labels = (
                    _canary_labels(config, dataset, base, mechanism, x_q, device)
                    if plan is None
                    else plan.target_labels
                )
            pool_x = np.concatenate([dataset.private.x, x_q])
            pool_y = np.concatenate([dataset.private.y, labels])
            pool_membership = np.ones((config.models, len(pool_y)), dtype=bool)
            pool_membership[:, -count:] = inserted
            target_index = np.arange(len(dataset.private), len(pool_y))
        else:
            pool_x, pool_y = dataset.private.x, dataset.private.y
            pool_membership = np.ones((config.models, len(pool_y)), dtype=bool)
            target_index = np.zeros(0, dtype=np.int64)
            gradient_canaries = _gradient_canaries(config, dataset, base, mechanism)
            canary_membership = inserted
    else:
        pool_x, pool_y = dataset.private.x, dataset.private.y
        pool_membership = designs.all_examples_design(config.models, len(pool_y), config.seed)
        target_index = np.arange(len(pool_y))
        design_membership = pool_membership
    members = int(pool_membership.sum(axis=1).max())  # N: with the batch size it fixes the bound's q and T
    layout = engine.BatchLayout.for_members(members, config.batch_size)
    setup = Setup(
        config,
        dataset,
        base,
        mechanism,
        pool_x,
        pool_y,
        pool_membership,
        target_index,
        layout,
        gradient_canaries,
        canary_membership,
        candidates,
    )
    adapted = models.lora_layers(base, config.target_modules) if config.target_modules else None
    layers = [
        shape
        for name, shape in zip(models.adapted_layers(base), bounds.layer_shapes(base))
        if adapted is None or name in adapted
    ]
    if config.user_mechanism and store.privacy_event() is None:
        # No name rebuilds a user's mechanism, so the analysis bounds the event it describes itself by, saved now.
        training = bounds.campaign_training(config, members, layers)
        store.write_privacy_event(privacy.to_record(mechanism.privacy(training)))
    if plan is None:
        with torch.no_grad():
            reference_outputs = _outputs(setup, lambda x: base(torch.from_numpy(x)), setup.targets_x, setup.targets_y)
        shapes = np.array([astuple(shape) for shape in layers], dtype=np.int64)
        store.save_plan(
            Plan(
                np.array(dataset.task),
                pool_y[target_index],
                design_membership,
                reference_outputs,
                dataset.test.y,
                np.array(layout.members),
                shapes,
                np.array(_base_checksum(base)),
            )
        )
    return setup


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
    config = setup.config
    assert config.rank is not None, "LoRA-FA has a rank"
    scale = models.LoraSpec(config.rank, config.alpha).scale
    recorder = _SketchInputsRecorder(WishartProjection(config.rank, scale), snapshot_steps)
    randomness = shadow_randomness(config.seed, indices)
    device = torch.device("cpu")
    shadow = engine.build(setup.base, "full", None, randomness, device)
    membership, training = setup.pool_membership[indices], _training(config)
    with _one_thread_precision(config, device):
        engine.train(shadow, recorder, setup.pool_x, setup.pool_y, membership, randomness, training, setup.layout)
    return recorder, shadow


def measure_sketch_inputs(setup: Setup) -> dict:
    """[S] Lemma 7.2's λ̄, C and β̂ (:class:`dpaudit.bounds.SketchClaim`), measured on two of the campaign's models.

    The models (one with the first target IN, one without) are trained again on the CPU with their own
    randomness, as the full-weight realisation of LoRA-FA that equals the campaign's (docs/theory.md §1.2 (b)),
    so every gradient is ∇_W. β̂ = max ‖∇L_D(W_{t+1}) - ∇L_D(W_t)‖ / ‖W_{t+1} - W_t‖ over up to 32 evenly spaced
    step pairs, L_D the model's loss on all its members and the norms over all adapted layers jointly.
    """
    config = setup.config
    target_in = setup.pool_membership[:, setup.target_index[0]] if len(setup.target_index) else None
    if target_in is None and setup.canary_membership is not None:
        target_in = setup.canary_membership[:, 0]
    indices = (
        np.array([np.argmax(target_in), np.argmin(target_in)])
        if target_in is not None and target_in.any() and not target_in.all()
        else np.arange(min(_SKETCH_MODELS, config.models))
    )
    steps = config.epochs * setup.layout.steps
    starts = np.unique(np.linspace(0, max(steps - 2, 0), min(_SMOOTHNESS_PAIRS, max(steps - 1, 1))).astype(int))
    pairs = [(int(t), int(t) + 1) for t in starts if t + 1 < steps]
    recorder, shadow = retrain_recording(setup, indices, frozenset(t for pair in pairs for t in pair))
    membership = setup.pool_membership[indices]
    training = _training(config)
    with _one_thread_precision(config, torch.device("cpu")):
        full_gradient = engine.gradient_function(shadow.module, per_example=False)
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
    inserted = " (gradient canaries not inserted)" if config.canary == "gradient" else ""
    return {
        "grad_bound": recorder.grad_bound,
        "smoothness": smoothness,
        "gram_minimum": gram_minimum,
        "lr": training.lr,
        "momentum": training.momentum,
        "schedule": training.schedule,
        "steps": steps,
        "batch_size": config.batch_size,
        "models": [int(i) for i in indices],
        "method": (
            f"measured after training on models {', '.join(map(str, indices))}{inserted}, retrained on the CPU as"
            " full-weight LoRA-FA with their own A: λ̄ = min over layers and models of λ_min(G Gᵀ), G = Σ_t ∇_W L^t;"
            " C = the largest per-example ‖∇_W l‖ of one layer over every step; β̂ = the largest"
            f" ‖ΔL_D gradient‖ / ‖ΔW‖ over {len(pairs)} consecutive step pairs"
        ),
    }


class Diverged(Exception):
    """Shadow models whose outputs are not finite (their training diverged); ``args[0]``: their indices."""


def train_chunk(
    setup: Setup, indices: np.ndarray, device: torch.device, on_step: Callable[[int], None] | None = None
) -> ChunkOutputs:
    """Train shadow models ``indices`` and return their outputs on the targets and the population (test split).

    Raises :class:`Diverged` rather than return non-finite outputs (which would be stored as finished).
    """
    randomness = shadow_randomness(setup.config.seed, indices)
    canaries = None
    if setup.canaries is not None and setup.canary_membership is not None:
        canaries = canary_lib.CanaryRun(setup.canaries, setup.canary_membership[indices], str(setup.config.observe))
    shadow = _train(setup, randomness, setup.pool_membership[indices], device, on_step, canaries)
    observations = shadow.canary_observations
    forward, k, test = functools.partial(engine.logits, shadow), len(indices), setup.dataset.test
    candidates = None
    if setup.exposure_candidates is not None:
        windows = setup.exposure_candidates
        candidates = _outputs(setup, forward, windows[:, :-1], windows[:, 1:], k)[..., 0]
    outputs = ChunkOutputs(
        indices=np.asarray(indices, dtype=np.int64),
        target_outputs=_outputs(setup, forward, setup.targets_x, setup.targets_y, k).astype(np.float32),
        population_outputs=_outputs(setup, forward, test.x, test.y, k).astype(np.float32),
        canary_observations=None if observations is None else observations.cpu().numpy(),
        candidate_log_likelihoods=candidates,
    )
    produced = (outputs.target_outputs, outputs.population_outputs, outputs.canary_observations, candidates)
    finite = np.logical_and.reduce([np.isfinite(a.reshape(len(a), -1)).all(axis=1) for a in produced if a is not None])
    if not finite.all():
        raise Diverged(tuple(int(i) for i in outputs.indices[~finite]))
    return outputs


def _outputs(
    setup: Setup, forward: Callable[[np.ndarray], torch.Tensor], x: np.ndarray, y: np.ndarray, models: int = 1
) -> np.ndarray:
    """The outputs of ``models`` models on examples (x, y), as :class:`dpaudit.store.Plan` defines them.

    ``forward``: logits of the base model, or of K shadow models (:func:`dpaudit.engine.logits`). Classification:
    the logits. Next-token: :func:`dpaudit.text.sequence_summaries`, from the logits of a few sequences at a time.
    """
    if setup.dataset.task != "next-token":
        return forward(x).cpu().numpy()
    rows = max(1, _LOGIT_ELEMENTS // (models * x.shape[1] * setup.dataset.num_classes))
    parts = []
    for first in range(0, max(len(x), 1), rows):  # no sequences still run one empty batch: a (…, 0, 2) result
        logits = forward(x[first : first + rows])
        parts.append(text.sequence_summaries(logits, torch.from_numpy(y[first : first + rows]).to(logits.device)))
    return torch.cat(parts, dim=-2).cpu().numpy()


def _auto_chunk_size(setup: Setup, device: torch.device, workers: int) -> int:
    """CPU: enough chunks to keep every worker busy. CUDA: as many models as half the free memory holds."""
    n = setup.config.models
    if device.type != "cuda":
        return int(np.clip(math.ceil(n / (4 * workers)), *_CPU_CHUNK_RANGE))
    free, _ = torch.cuda.mem_get_info(device)
    per_model_params = sum(p.numel() for p in setup.base.parameters()) * 4 * 4  # weights, grads, momentum, copy
    activations = setup.layout.width * sum(m.weight.shape[0] for m in models.adapted_layers(setup.base).values())
    per_model = per_model_params + activations * 4 * 8 * int(np.prod(setup.dataset.input_shape[1:]) or 1)
    return int(max(1, min(n, free // 2 // per_model)))


@functools.cache
def _exit_with_parent() -> None:
    """Make this worker process exit when its parent dies (kill -9 of the driver), instead of training on."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="dpaudit-parent-watch", daemon=True).start()


def _chunk_task(setup: Setup, indices: np.ndarray, device_name: str) -> ChunkOutputs:
    """A worker's job: train one chunk on its device; only the outputs travel back."""
    _exit_with_parent()
    return train_chunk(setup, indices, torch.device(device_name))


@contextmanager
def _dask_backend(execution: Execution, workers: int) -> Iterator[None]:
    """Joblib's dask backend on the given scheduler, or on a local cluster of ``workers`` one-thread processes."""
    import joblib
    from dask.distributed import Client, LocalCluster

    if execution.scheduler:
        client = Client(execution.scheduler)
        cluster = None
    else:
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
    try:
        with joblib.parallel_config(backend="dask"):
            yield
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def run(config: CampaignConfig, execution: Execution, out: Path, inputs: Inputs | None = None) -> RunStore:
    """Train every shadow model not yet in the run directory ``out``; return the store holding all outputs.

    Finished chunks are never retrained; a chunk killed half-way is retrained from its start. Per-model
    randomness depends on (seed, model index) only, so chunk size, worker count and order change nothing (bit for bit
    at LoRA ranks that are multiples of 4; at other ranks, MKL's GEMMs can round in the last bits with a model's
    memory offset in its chunk).
    One process trains a run directory at a time (:meth:`RunStore.lock`). ``inputs`` None: :func:`resolve` the
    config's names; given (:func:`dpaudit.audit`), the objects the config describes.
    """
    store = RunStore(out)
    # A refused campaign leaves no directory: the lock below creates it.
    inputs = check_inputs(config, resolve(config) if inputs is None else inputs)
    with store.lock():
        try:
            _run_locked(config, execution, store, inputs)
        except Diverged as diverged:
            raise _divergence_error(config, store, diverged.args[0]) from None
    return store


def _divergence_error(config: CampaignConfig, store: RunStore, models: tuple[int, ...]) -> UsageError:
    shown = ", ".join(map(str, models[:10])) + (", …" if len(models) > 10 else "")
    finished = int(store.finished().sum())
    again = (
        f"run `dpaudit audit` with the new values and --out {store.root} (no model has finished, so the directory"
        " starts over)"
        if finished == 0
        else f"run the campaign with the new values into a new --out ({finished} finished models in {store.root}"
        " belong to this configuration)"
    )
    return UsageError(
        f"shadow model(s) {shown} diverged (non-finite outputs) with --lr {config.lr:g} and --batch-size"
        f" {config.batch_size}; nothing of theirs was stored: lower --lr or raise --batch-size, then {again}"
    )


def _run_locked(config: CampaignConfig, execution: Execution, store: RunStore, inputs: Inputs) -> None:
    import joblib
    from tqdm.auto import tqdm

    start = time.perf_counter()
    device = resolve_device(execution.device)
    setup = prepare(config, store, device, inputs)
    store.make_chunks_directory()
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    workers = execution.workers or gpus or os.cpu_count() or 1
    todo = np.flatnonzero(~store.finished())
    chunk_size = execution.chunk_size or _auto_chunk_size(setup, device, workers)
    chunks = [todo[i : i + chunk_size] for i in range(0, len(todo), chunk_size)]
    devices = [f"cuda:{i % gpus}" if gpus else str(device) for i in range(len(chunks))]
    bar = tqdm(
        total=config.models,
        initial=config.models - len(todo),
        unit="model",
        disable=not execution.progress,
        desc=config.mechanism if config.rank is None else f"{config.mechanism} r={config.rank}",
        bar_format="{l_bar}{bar}| {n:.0f}/{total} [{elapsed}<{remaining}, {rate_fmt}]",
    )
    with bar:
        if workers == 1 or len(chunks) <= 1:
            for chunk, device_name in zip(chunks, devices):
                per_step = len(chunk) / (config.epochs * setup.layout.steps)
                store.write_chunk(
                    train_chunk(setup, chunk, torch.device(device_name), functools.partial(_advance, bar, per_step))
                )
        else:
            backend = (
                _dask_backend(execution, workers)
                if execution.backend == "dask"
                else joblib.parallel_config(backend="loky")
            )
            with backend:
                jobs = (joblib.delayed(_chunk_task)(setup, chunk, d) for chunk, d in zip(chunks, devices))
                for outputs in joblib.Parallel(n_jobs=workers, return_as="generator_unordered")(jobs):
                    store.write_chunk(outputs)
                    bar.update(len(outputs.indices))
    # [S] Lemma 7.2's inputs are measured on LoRA-FA retrained as full-weight training of every layer: where LoRA
    # leaves layers out (the transformer's head), that is another training, so nothing is measured.
    every_layer = set(models.lora_layers(setup.base)) == set(models.adapted_layers(setup.base))
    if config.mechanism in bounds.SKETCH_CLAIM_MECHANISMS and every_layer and store.measurements() is None:
        store.write_measurements(measure_sketch_inputs(setup))
    store.record_seconds(time.perf_counter() - start)


def _advance(bar, amount: float, _step: int) -> None:
    """A chunk's ``on_step``: one step of ``amount`` models' training on the progress bar."""
    bar.update(amount)

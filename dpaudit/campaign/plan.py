"""A campaign's plan, made once and saved before any shadow model trains.

:func:`prepare` turns a checked config and its resolved inputs (:mod:`dpaudit.campaign.resolve`) into the
:class:`dpaudit.campaign.shadow.Setup` every worker trains from: the pretrained base, the targets (input canaries,
secrets, gradient canaries or every private example), the membership of every model, the batch layout, and the
privacy event the mechanism claims at this run's facts (privacy.json), all written to the run directory so that a
resumed campaign continues with exactly what its finished chunks were trained with.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import io
import sys
from collections.abc import Sequence
from dataclasses import astuple

import numpy as np
import torch
from torch import nn

from attacks import canary as input_canary
from attacks import designs
from dpaudit import data as data_lib
from dpaudit import models
from dpaudit.campaign import resolve
from dpaudit.campaign.shadow import (
    Setup,
    blamed_on_model,
    lora_spec,
    one_thread_precision,
    outputs_of,
    settings_of,
    train_models,
)
from dpaudit.campaign.store import Plan, RunStore, checksum
from dpaudit.config import PYTHON_OBJECT, CampaignConfig
from dpaudit.data import text
from dpaudit.errors import UsageError
from dpaudit.formatting import json_text
from dpaudit.mechanisms import bounds, privacy
from dpaudit.mechanisms.base import Mechanism
from dpaudit.mechanisms.privacy import LayerShape, Training
from dpaudit.models import hugging_face
from dpaudit.seeding import ModelRandomness, campaign_rng
from dpaudit.training import canaries as canary_lib
from dpaudit.training import engine, sampling
from dpaudit.user_code import blamed_on_user, source_files

_EXPOSURE_CANDIDATES = 1000  # candidates of the secrets' format each model scores: exposure up to log2(1001) ≈ 10


def campaign_training(
    config: CampaignConfig, members: int, layers: Sequence[LayerShape], sampling_scheme: str
) -> Training:
    """The run facts of ``config``'s campaign: rate q and steps T for N = ``members``, and ``layers``.

    ``members`` is N, the campaign's largest member count; ``layers`` the adapted layers; ``sampling_scheme`` the
    mechanism's (:attr:`Mechanism.sampling`). Poisson: the engine's :class:`PoissonLayout` (q = b/N <= 1, else a
    UsageError). Shuffled batches hold at most every member: a batch size above N trains one full batch per epoch
    (:class:`BatchLayout`), q = 1.
    """
    if sampling_scheme == "poisson":
        poisson = sampling.PoissonLayout.for_members(members, config.batch_size)
        return Training(poisson.sample_rate, config.epochs * poisson.steps, tuple(layers))
    layout = sampling.BatchLayout.for_members(members, config.batch_size)
    return Training(min(config.batch_size, members) / members, config.epochs * layout.steps, tuple(layers))


def layer_shapes(module: nn.Module) -> list[LayerShape]:
    """:class:`LayerShape` of every adapted Linear/Conv2d layer of ``module`` (:mod:`dpaudit.models`)."""
    shapes = []
    for layer in models.adapted_layers(module).values():
        d_out, d_in = models.output_dim(layer), models.projection_dim(layer)
        shapes.append(LayerShape(d_out, d_in, min(d_out, d_in) if isinstance(layer, nn.Conv2d) else 1))
    return shapes


def claimed_privacy(
    mechanism: Mechanism, config: CampaignConfig, members: int, layers: Sequence[LayerShape]
) -> privacy.PrivacyEvent:
    """The privacy event ``mechanism`` claims in ``config``'s campaign (:meth:`Mechanism.privacy` at its facts).

    ``members`` and ``layers`` as :func:`campaign_training`. Neighbouring: add/remove one example, as DP-SGD's
    accountants, or ``config.insertions`` copies of one (:class:`privacy.Group`). The analysis bounds this event
    (:func:`dpaudit.mechanisms.bounds.event_bound`).
    """
    event = mechanism.privacy(campaign_training(config, members, layers, mechanism.sampling))
    return event if config.insertions == 1 else privacy.Group(config.insertions, event)


def planned_claim(config: CampaignConfig, inputs: resolve.Inputs) -> privacy.PrivacyEvent:
    """The privacy event ``config``'s campaign will claim (:func:`claimed_privacy`), from its inputs, untrained."""
    _, pool_membership = _membership(config, len(inputs.dataset.private))
    shapes = _adapted_layer_shapes(config, inputs.architecture, inputs.mechanism)
    return claimed_privacy(inputs.mechanism, config, _members(pool_membership), shapes)


def _trained_layers(config: CampaignConfig, module: nn.Module, mechanism: Mechanism) -> dict[str, nn.Module]:
    """Name → layer of the layers the mechanism trains, in the model's order.

    A LoRA adapter's (:func:`models.lora_layers`: those ``--target-modules`` names, else its default, which leaves a
    transformer's output head out); every layer for a mechanism that trains the full weights.
    """
    if mechanism.parameterization == "full" or config.rank is None:
        return models.adapted_layers(module)
    return models.lora_layers(module, config.target_modules)


def _adapted_layer_shapes(config: CampaignConfig, module: nn.Module, mechanism: Mechanism) -> list[LayerShape]:
    """:class:`LayerShape` of the layers the mechanism trains (:func:`_trained_layers`), in the model's order."""
    trained = _trained_layers(config, module, mechanism)
    return [shape for name, shape in zip(models.adapted_layers(module), layer_shapes(module)) if name in trained]


def _membership(config: CampaignConfig, private: int) -> tuple[np.ndarray, np.ndarray]:
    """(design, pool) membership of the campaign with ``private`` private examples.

    design (models, targets): each target's IN/OUT; pool (models, pool size): each model's training set over the
    private examples followed by the input canaries, ``config.insertions`` copies of them one after the other (a
    gradient canary is no pool example). A null campaign keeps the design's groups but trains no model on any canary.
    """
    if config.design == "all-examples":
        design = designs.all_examples_design(config.models, private, config.seed)
        return design, design
    design = (
        designs.single_canary_design(config.models, config.seed)[:, None]
        if config.design == "canary"
        else _one_run_membership(config)
    )
    if config.canary != "input":
        return design, np.ones((config.models, private), dtype=bool)
    copies = np.tile(design & (not config.null), (1, config.insertions))
    return design, np.concatenate([np.ones((config.models, private), dtype=bool), copies], 1)


def _canary_labels(
    config: CampaignConfig,
    dataset: data_lib.Dataset,
    base: nn.Module,
    mechanism: Mechanism,
    x_q: np.ndarray,
    layout: sampling.BatchLayout,
    device: torch.device,
) -> np.ndarray:
    """y_q = argmin of a reference model's logits on each canary x_q, that model trained on D by the same procedure.

    The same procedure: the campaign's batch ``layout`` (its steps, and its member count N, which fixes a Poisson
    rate q), as an OUT shadow model trains.
    """
    reference = Setup(
        settings_of(config),
        dataset,
        base,
        mechanism,
        dataset.private.x,
        dataset.private.y,
        np.ones((1, len(dataset.private)), dtype=bool),
        np.zeros(0, dtype=np.int64),
        layout,
    )
    randomness = [ModelRandomness(config.seed, 0, role="reference")]
    shadow = train_models(reference, randomness, reference.pool_membership, device)
    logits = engine.logits(shadow, x_q)[0].cpu().numpy()
    if not np.isfinite(logits).all():
        raise UsageError(
            "the reference model that labels the canary (trained on the private data as the shadow models are)"
            f" diverged (non-finite outputs) with --lr {config.lr:g} and --batch-size {config.batch_size}:"
            f" {divergence_fix(base)}; the shadow models would diverge too"
        )
    return np.array([input_canary.least_likely_label(row) for row in logits], dtype=np.int64)


def divergence_fix(model: nn.Module) -> str:
    """What to change when training ``model`` diverged: the learning rate and batch size, and its BatchNorm layers."""
    fix = "lower --lr or raise --batch-size"
    if any(isinstance(module, nn.modules.batchnorm._BatchNorm) for module in model.modules()):
        fix += " (or drop the model's BatchNorm layers: a small batch's statistics can blow its activations up)"
    return fix


def _reference_start(config: CampaignConfig, base: nn.Module, mechanism: Mechanism) -> engine.ShadowModels:
    """The attacker's reference model at its starting point (the canaries' directions are chosen there)."""
    randomness = [ModelRandomness(config.seed, 0, role="reference")]
    return engine.build(base, mechanism.parameterization, lora_spec(config), randomness, torch.device("cpu"))


def _gradient_canaries(
    config: CampaignConfig, dataset: data_lib.Dataset, base: nn.Module, mechanism: Mechanism
) -> canary_lib.GradientCanaries:
    """The campaign's gradient canaries: Dirac coordinates or a random direction (:mod:`dpaudit.canaries`)."""
    reference = _reference_start(config, base, mechanism)
    norm, direction = config.canary_norm, config.canary_direction
    assert norm is not None and direction is not None, "CampaignConfig fills a gradient canary's norm and direction"
    adapter = getattr(mechanism, "adapter", None)  # PRISM: canaries in the adapted weights (docs/theory.md §3.9)
    with one_thread_precision(config.precision, torch.device("cpu")):  # one thread: the same ranking on every machine
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
    """base.pt loaded into a copy of ``architecture``, or None if it must be made again (deterministic given the seed).

    None: absent, unreadable (a crash or a full disk while it was written) or not the base the plan was made with.
    A copy, because a file that loads and then fails the checksum must leave ``architecture`` as it was given
    (trainable, and its own weights where it is not pretrained) to make the base from.
    """
    data = store.read_base()
    if data is None:
        return None
    base = copy.deepcopy(architecture)
    try:
        base.load_state_dict(torch.load(io.BytesIO(data), weights_only=True))
    except Exception:  # noqa: BLE001 - truncated, garbage or foreign: torch raises many types; all mean "remake"
        return None
    if plan is not None and _base_checksum(base) != str(plan.base_checksum):
        return None
    return base.eval().requires_grad_(False)


def check_inputs(
    config: CampaignConfig, inputs: resolve.Inputs, rank_given: bool = True
) -> tuple[CampaignConfig, resolve.Inputs]:
    """``inputs`` checked against the config before anything is written; the config and inputs to run.

    The checks that need them: the model learns the data's task, its parameters are float32 (and not all frozen
    where it is pretrained), it has layers to adapt, the rank fits every adapted layer, ``target_modules`` name
    layers of a LoRA adapter, the model's forward pass and the training step's gradients work on a couple of public
    examples (:func:`_probe_model`), the gradient canaries fit the trained tensors, the claim can be bounded.

    ``rank_given``: False where ``config.rank`` is the default rank, not the user's: a default larger than the
    model's layers take is lowered to the largest they take (:func:`_fitted_default_rank`, said on stderr), so that
    any data runs at the defaults; the returned config and mechanism then have that rank. A rank the user gave is
    refused where it does not fit.
    """
    architecture = inputs.architecture
    _check_parameters(config, architecture)
    dataset, mechanism = inputs.dataset, inputs.mechanism
    try:
        task = models.task_of(architecture)
    except UsageError as error:
        raise UsageError(f"{_model_named(config)}: {error}") from None
    if task != dataset.task:
        raise UsageError(
            f"--dataset {config.dataset} is {dataset.task} data, but the model ({type(architecture).__name__}) learns"
            f" {task} (its `task` attribute): give a model of the data's task, e.g."
            " dpaudit.transformer.CausalTransformer for text"
        )
    _check_token_ids(config, dataset, architecture)
    if dataset.task == "next-token" and config.canary == "input" and config.design != "all-examples":
        _secret_format(dataset)  # the secret canaries can be drawn from the data's tokens and fit its windows
    if not models.adapted_layers(architecture):
        raise UsageError(
            f"the model ({type(architecture).__name__}) has no nn.Linear or nn.Conv2d layer (nor a transformers Conv1D)"
            " for the mechanism to train: build it from such layers"
        )
    if config.target_modules is not None and mechanism.parameterization == "full":
        raise UsageError(
            f"--target-modules chooses the layers of a LoRA adapter, and mechanism {config.mechanism!r} trains every"
            " layer: leave --target-modules out, or use lora-fa, sketch, dp-lora, dp-lora-fa or prism"
        )
    transposed = [name for name, layer in models.adapted_layers(architecture).items() if models.transposed(layer)]
    if transposed and mechanism.parameterization == "full" and config.rank is not None:
        raise UsageError(
            f"{config.mechanism} projects each layer's weight gradient on its input dimension, and {transposed[0]} is a"
            " transformers Conv1D, whose weight is stored transposed: use a LoRA mechanism (lora-fa, dp-lora,"
            " dp-lora-fa, prism), or dp-sgd"
        )
    batch_norms = [name for name, m in architecture.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if batch_norms and mechanism.parameterization == "full":
        raise UsageError(
            f"layer {batch_norms[0]!r} is a BatchNorm layer, and {config.mechanism} fine-tunes the whole model: dpaudit"
            " fine-tunes in eval mode (a per-example gradient must not depend on the other examples of its batch), so"
            " its statistics and affine would stay as they start; replace BatchNorm with GroupNorm"
            " (torch.nn.GroupNorm, as opacus requires), or use a LoRA mechanism (lora-fa, dp-lora, dp-lora-fa, prism)"
        )
    rank_note = None
    if config.rank is not None and not rank_given:
        config, inputs, rank_note = _fitted_default_rank(config, inputs)
        mechanism = inputs.mechanism
    if config.rank is not None:  # LoRA or m1/m2's projection: r <= d_in
        models.check_rank(architecture, config.rank, config.target_modules)
    _probe_model(config, inputs)
    if config.canary == "gradient" and config.canaries is not None:
        trained = _reference_start(config, architecture, mechanism).trainable
        coordinates = sum(t[0].numel() for t in trained.values())
        if config.canaries > coordinates:
            raise UsageError(
                f"--canaries {config.canaries} exceeds the {coordinates} coordinates of the trained tensors: orthogonal"
                f" Dirac canaries need one coordinate each; use --canaries <= {coordinates}"
            )
    # The claim as prepare() records it, bounded now as the analysis will bound it: a batch size no sampling
    # scheme can draw, or a claim no accountant can bound, is refused before any model trains.
    claimed = planned_claim(config, inputs)
    try:
        bounds.event_bound(claimed, config.delta)
    except ValueError as error:
        raise UsageError(
            f"no accountant can bound the privacy {config.mechanism} claims in this campaign ({error}): change the"
            " setting it comes from (--noise, --batch-size, --epochs)"
        ) from None
    if rank_note is not None:  # said once every check has passed, so that a refusal stays one line
        print(f"dpaudit: {rank_note}", file=sys.stderr)
    if config.model is not None or config.target_modules is not None:
        print(f"dpaudit: {adapted_layers_note(config, architecture, mechanism)}", file=sys.stderr)
    if batch_norms:
        print(
            f"dpaudit: BatchNorm layer(s) {', '.join(batch_norms)} keep the base's statistics and affine: fine-tuning"
            " runs in eval mode (docs/models.md)",
            file=sys.stderr,
        )
    return config, inputs


def adapted_layers_note(config: CampaignConfig, architecture: nn.Module, mechanism: Mechanism) -> str:
    """Which layers the mechanism trains, in a line: the LoRA adapter's (and the head it leaves out), or every one."""
    trained = _trained_layers(config, architecture, mechanism)
    if mechanism.parameterization == "full" or config.rank is None:
        return f"{config.mechanism} trains every layer: {', '.join(trained)}"
    head = models.output_head(architecture)
    left_out = (
        f"; the output head {head} is left out (--target-modules adds it)"
        if head is not None and head not in trained
        else ""
    )
    return f"LoRA adapts {len(trained)} layer(s): {', '.join(trained)}{left_out}"


def _check_token_ids(config: CampaignConfig, dataset: data_lib.Dataset, architecture: nn.Module) -> None:
    """Integer inputs are token ids the model's input embedding has rows for (docs/models.md §6)."""
    vocabulary = models.input_vocabulary(architecture)
    if vocabulary is None or not np.issubdtype(dataset.private.x.dtype, np.integer):
        return
    largest = max(int(part.x.max()) for part in (dataset.public, dataset.private, dataset.test))
    if largest >= vocabulary:
        raise UsageError(
            f"--dataset {config.dataset.removeprefix(PYTHON_OBJECT)} holds token id {largest}, but the input embedding"
            f" of {_model_named(config)} has {vocabulary} rows: give ids from 0 to {vocabulary - 1}, or a model whose"
            f" vocabulary is at least {largest + 1}"
        )


def _secret_format(dataset: data_lib.Dataset) -> text.SecretFormat:
    """The format of a next-token dataset's secret canaries, checked to fit its windows.

    The bytes' sentence, or ids of a tokenized vocabulary (:attr:`dpaudit.data.text.TextDataset.secret_format`).
    """
    secrets = dataset.secret_format if isinstance(dataset, text.TextDataset) else text.BYTE_SECRETS
    secrets.check_fits(dataset.input_shape[0])
    return secrets


def _model_named(config: CampaignConfig) -> str:
    """The model as the user named it, for a message: ``--model MODULE:FACTORY``, or the object's class."""
    if config.model is None or config.model.startswith(PYTHON_OBJECT):
        return "the model" if config.model is None else f"the model {config.model.removeprefix(PYTHON_OBJECT)}"
    return f"--model {config.model}"


def _check_parameters(config: CampaignConfig, architecture: nn.Module) -> None:
    """Parameters dpaudit can train: of known shape, float32, and some trainable where the model is pretrained."""
    what = _model_named(config)
    for name, parameter in architecture.named_parameters():
        if isinstance(parameter, nn.parameter.UninitializedParameter):
            raise UsageError(
                f"{what}: parameter {name!r} has no shape yet (a lazy module, e.g. nn.LazyLinear, takes it from"
                " its first forward pass): give the layer its input size, e.g. nn.Linear(d_in, d_out)"
            )
        if parameter.dtype != torch.float32:
            raise UsageError(
                f"{what}: parameter {name!r} is {parameter.dtype}: dpaudit trains float32 models (--precision"
                " bf16 runs them under bf16 autocast); return model.float() from the factory"
            )
    trainable = [parameter.requires_grad for parameter in architecture.parameters()]
    if config.pretrain and trainable and not any(trainable):  # no parameters at all: no layers, refused after
        raise UsageError(
            f"{what}: every parameter of the model is frozen (requires_grad False), so pretraining it on the public"
            " split trains nothing: leave its parameters trainable, or fine-tune its own weights with --no-pretrain"
        )


def _fitted_default_rank(
    config: CampaignConfig, inputs: resolve.Inputs
) -> tuple[CampaignConfig, resolve.Inputs, str | None]:
    """``config`` and ``inputs`` at the largest rank the adapted layers take where the default rank is larger.

    As PRISM caps its rank at each layer's size, a default rank (16) larger than a layer's input dimension (a
    dataset of 8 features) is lowered, for the whole adapter, to the smallest adapted layer's. The mechanism is
    rebuilt at that rank (a default rank comes with a catalogue mechanism, never an object of the user's), and the
    campaign records it: its hash, claim and layer shapes are those of that rank. The third value says so in a
    line for stderr (None where the default fits).
    """
    assert config.rank is not None, "only a ranked mechanism has a default rank"
    layer, limit = models.rank_limit(inputs.architecture, config.target_modules)
    if config.rank <= limit:
        return config, inputs, None
    fitted = dataclasses.replace(config, rank=limit)
    said = (
        f"rank {limit}, not the default {config.rank}: the input dimension of layer {layer!r} is {limit}, and a"
        " LoRA rank is at most every adapted layer's (give --rank to choose it)"
    )
    return fitted, dataclasses.replace(inputs, mechanism=resolve.mechanism(fitted)), said


_PROBE_EXAMPLES = 2  # public examples the model is tried on before anything is written


def _probe_model(config: CampaignConfig, inputs: resolve.Inputs) -> None:
    """The model's forward pass and the training step's gradients, tried on a couple of public examples.

    The forward pass must give float32 logits of shape (n, classes), or (n, T, vocabulary) for next-token data.
    A model to be pretrained takes a pretraining step (training mode, plain autograd) on a copy. The gradients
    are the mechanism's (per example or per batch), through the engine's vectorised forward pass,
    which refuses what a plain one allows (``.item()``, numpy or data-dependent branches inside ``forward``). A
    failure of the user's model (``--model`` or an object given to dpaudit.audit) is named as theirs.
    """
    dataset, architecture = inputs.dataset, inputs.architecture
    x, y = dataset.public.x[:_PROBE_EXAMPLES], dataset.public.y[:_PROBE_EXAMPLES]
    batch = f"a batch of shape {tuple(x.shape)}"
    model = copy.deepcopy(architecture).eval()  # in training mode, a forward pass would move BatchNorm's statistics
    what = _model_named(config)
    with _users_code(config, f"its forward pass on {batch}"), torch.no_grad():
        logits = models.forward(model, torch.from_numpy(x))
    expected, axes = (
        ((len(x), x.shape[1], dataset.num_classes), "(batch, positions, vocabulary)")
        if dataset.task == "next-token"
        else ((len(x), dataset.num_classes), "(batch, classes)")
    )
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != expected:
        got = f"shape {tuple(logits.shape)}" if isinstance(logits, torch.Tensor) else f"a {type(logits).__name__}"
        raise UsageError(
            f"{what} returned {got} on {batch}; it must return logits {axes}, here {expected}: one output per class"
            f" of the data ({dataset.num_classes}), no extra dimension; a tensor, or a ModelOutput or dict with"
            " `logits`, or a tuple whose first item is them"
        )
    if logits.dtype != torch.float32:
        raise UsageError(
            f"{what} returned {logits.dtype} logits on {batch}: dpaudit trains float32 models; return float32"
            " logits (e.g. .float())"
        )
    if config.pretrain:  # pretraining runs the model in training mode, through plain autograd (models.pretrain)
        model.train()
        with _users_code(config, f"a pretraining step (training mode) on {batch}", architecture):
            models.mean_loss(dataset.task, models.forward(model, torch.from_numpy(x)), torch.from_numpy(y)).backward()
        model.eval()
    shadow = _reference_start(config, model, inputs.mechanism)
    gradients = engine.step_gradient_function(shadow, inputs.mechanism)
    with _users_code(config, f"the training step's gradients on {batch}", architecture):
        gradients(
            shadow.trainable,
            shadow.frozen,
            torch.from_numpy(x)[None],
            torch.from_numpy(y)[None],
            torch.ones(1, len(x)),
        )


def _users_code(
    config: CampaignConfig, stage: str, architecture: nn.Module | None = None
) -> contextlib.AbstractContextManager:
    """A failure of the user's model during ``stage`` named as theirs (:func:`dpaudit.user_code.blamed_on_user`).

    ``architecture``: the block also runs dpaudit's code around the model (training), and the model's source
    files tell whose a failure is; None: the block runs the model alone. Nothing for dpaudit's built-in model.
    """
    if config.model is None:
        return contextlib.nullcontext()
    user_files = None if architecture is None else source_files(list(architecture.modules()))
    return blamed_on_user(_model_named(config), stage, user_files)


def _members(pool_membership: np.ndarray) -> int:
    """N, the campaign's largest member count: with the batch size it fixes the bound's q and T."""
    return int(pool_membership.sum(axis=1).max())


def _starting_weights(config: CampaignConfig, architecture: nn.Module) -> nn.Module:
    """The model a campaign starts from: ``architecture``, re-drawn from the seed first where it is pretrained."""
    if not config.pretrain:
        return architecture
    start = copy.deepcopy(architecture)
    models.initialise(start, config.seed)
    return start


def fingerprints(config: CampaignConfig, inputs: resolve.Inputs) -> dict[str, str]:
    """The model's and the mechanism's fingerprints, recorded in campaign.json so that resume refuses a change.

    The model: its architecture and the weights it starts from (pretraining first re-draws them from the seed),
    or its architecture alone where ``--model``'s factory builds other weights at each call (no seed of its own,
    e.g. a transformers model built from a config): the run's starting weights are then base.pt's, which a
    resume reuses (docs/models.md). The mechanism: its class and every parameter, as its ``repr`` shows them (a
    dataclass's fields).
    """
    start = _starting_weights(config, inputs.architecture)
    # The built-in model and a transformers class are built from the seed; a model object given to dpaudit.audit is
    # as it is.
    weights = True
    if (
        config.model is not None
        and not config.model.startswith(PYTHON_OBJECT)
        and not hugging_face.names_class(config.model)
    ):
        again = models.from_factory(
            config.model, inputs.dataset.input_shape, inputs.dataset.num_classes, seed=config.seed
        )
        weights = models.fingerprint(_starting_weights(config, again)) == models.fingerprint(start)
    mechanism = type(inputs.mechanism)
    described = f"{mechanism.__module__}.{mechanism.__qualname__}:{inputs.mechanism!r}"
    return {
        "model_fingerprint": models.fingerprint(start, weights),
        "mechanism_fingerprint": hashlib.sha256(described.encode()).hexdigest(),
    }


def prepare(
    config: CampaignConfig, store: RunStore, device: torch.device, inputs: resolve.Inputs | None = None
) -> Setup:
    """The campaign's setup: created (and saved to ``store``) on first use, loaded from it on resume.

    Pretraining and the canary's label are computed once and stored, so a resumed campaign continues with
    exactly the base and canary its finished chunks were trained with. base.pt is written before plan.npz, whose
    presence marks a complete setup; either, missing or damaged, is made again (both are deterministic), and a
    re-pretrained base must match the checksum the plan recorded. ``inputs``: checked ones (:func:`check_inputs`);
    None: :func:`dpaudit.campaign.resolve.resolve` the config's names.
    """
    if inputs is None:
        config, inputs = check_inputs(config, resolve.resolve(config))
    dataset, architecture, mechanism = inputs.dataset, inputs.architecture, inputs.mechanism
    resumed = store.create_or_check(config, dataset.fingerprint(), fingerprints(config, inputs))
    plan = store.saved_plan() if resumed else None
    base = _stored_base(store, architecture, plan) if resumed else None
    if base is None:
        with _users_code(config, "pretraining on the public split", architecture), engine.retained_heap():
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
    design_membership, pool_membership = _membership(config, len(dataset.private))
    members = _members(pool_membership)
    layout = sampling.BatchLayout.for_members(members, config.batch_size)
    pool_x, pool_y = dataset.private.x, dataset.private.y
    target_index = np.zeros(0, dtype=np.int64)
    if config.design == "all-examples":
        target_index = np.arange(len(pool_y))
    elif config.canary == "input":
        count = design_membership.shape[1]
        if dataset.task == "next-token":
            # Secrets (Carlini et al. 2019), and the candidates of their format their exposure is ranked in.
            length = dataset.input_shape[0]
            secrets = _secret_format(dataset)
            windows = text.secret_windows(count, campaign_rng(config.seed, "canary"), length, secrets)
            x_q, labels = windows[:, :-1], windows[:, 1:]
            candidates = text.secret_windows(
                _EXPOSURE_CANDIDATES, campaign_rng(config.seed, "exposure"), length, secrets
            )
        else:
            shape = (count, *dataset.input_shape)
            vocabulary = models.input_vocabulary(architecture)
            x_q = (
                # A token model's canary is a sequence of uniformly random token ids (docs/models.md §6).
                campaign_rng(config.seed, "canary").integers(vocabulary, size=shape)
                if vocabulary is not None and np.issubdtype(dataset.private.x.dtype, np.integer)
                else input_canary.draw_canary_input(shape, campaign_rng(config.seed, "canary")).astype(np.float32)
            )
            if plan is None:
                with _users_code(config, "training the reference model that labels the canary", architecture):
                    labels = _canary_labels(config, dataset, base, mechanism, x_q, layout, device)
            else:
                labels = plan.target_labels
        copies = config.insertions
        pool_x, pool_y = np.concatenate([pool_x, *[x_q] * copies]), np.concatenate([pool_y, *[labels] * copies])
        target_index = np.arange(len(dataset.private), len(dataset.private) + len(x_q))  # the first copies
    else:
        gradient_canaries = _gradient_canaries(config, dataset, base, mechanism)
        canary_membership = design_membership & (not config.null)
    setup = Setup(
        settings_of(config),
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
        None if config.model is None else _model_named(config),
    )
    layers = _adapted_layer_shapes(config, base, mechanism)
    # The claim the analysis judges the audit against, recorded in the plan before any model trains (privacy.json is
    # its readable copy). The analysis never rebuilds the mechanism (a user's object has no name that would rebuild
    # it): a continued campaign's mechanism is checked here to make the recorded claim still.
    claimed = privacy.to_record(claimed_privacy(mechanism, config, members, layers))
    if plan is not None:
        store.check_claimed_privacy(claimed)
    else:
        with blamed_on_model(setup, "the base model's outputs on the targets"), torch.no_grad():
            reference_outputs = outputs_of(
                setup, lambda x: models.forward(base, torch.from_numpy(x)), setup.targets_x, setup.targets_y
            )
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
                np.array(json_text(claimed)),
                np.array(""),  # measured after training (dpaudit.campaign.sketch_inputs)
            )
        )
    if store.privacy_event() is None:
        store.write_privacy_event()
    return setup

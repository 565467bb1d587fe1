"""Models: a small MLP and the seed CNN of [W] App. F.1, public pretraining, and LoRA adapters via peft.

peft imports transformers (seconds), so it is imported inside :func:`attach_lora` and :func:`lora_layers` only, and
transformers only for a model that is its own (:func:`task_of`).

Parameterizations (what a mechanism trains, docs/theory.md §1):

* ``full``: the weight matrices of every Linear/Conv2d (and transformers Conv1D) layer, a tied one once (biases
  stay at their pretrained values, as in LoRA fine-tuning, so that full fine-tuning and LoRA variants train the
  same layers);
* ``lora``: both LoRA factors ``lora_A`` and ``lora_B`` (DP-LoRA);
* ``lora-fa``: ``lora_B`` only, ``lora_A`` a frozen Gaussian drawn per model ([W] Sec. 2, App. E).

Tasks (the loss a model trains with; a module's ``task`` attribute, :func:`task_of`): ``classification`` (logits
(n, C), labels (n,), the default) or ``next-token`` (logits (n, T, V), targets (n, T); an example's loss is the mean
cross-entropy over its T positions), e.g. :class:`dpaudit.models.transformer.CausalTransformer`. A Hugging Face
model runs as it comes: its output is read by :func:`output_logits`, its task from its class (docs/models.md).
"""

from __future__ import annotations

import contextvars
import copy
import hashlib
import math
import re
import types
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from dpaudit.errors import UsageError
from dpaudit.models import hugging_face
from dpaudit.models.transformer import CausalTransformer
from dpaudit.user_code import blamed_on_user, load_callable

PARAMETERIZATIONS = ("full", "lora", "lora-fa")
TASKS = ("classification", "next-token")
_ADAPTED_TYPES = (nn.Linear, nn.Conv2d)


def transposed(layer: nn.Module) -> bool:
    """Whether ``layer`` is a transformers ``Conv1D`` (GPT-2's attention and MLP), a Linear stored transposed.

    Its weight is (d_in, d_out); peft adapts it with ``fan_in_fan_out`` (docs/models.md §7).
    """
    return any(cls.__name__ == "Conv1D" for cls in _transformers_classes(layer))


def _transformers_classes(thing: object) -> list[type]:
    """The classes of ``thing``'s type and its bases that are transformers' own (a user's subclass has them too)."""
    return [cls for cls in type(thing).__mro__ if cls.__module__.startswith("transformers.")]


def _adaptable(module: nn.Module) -> bool:
    return isinstance(module, _ADAPTED_TYPES) or transposed(module)


def task_of(model: nn.Module) -> str:
    """The model's task (module docstring): its ``task`` attribute, ``classification`` where it has none.

    A peft-wrapped model answers for the model it wraps (peft forwards unknown attributes). A Hugging Face model
    without the attribute has its class's task: a causal LM (``GPT2LMHeadModel``, ``*ForCausalLM``) is
    ``next-token``, any other (``*ForSequenceClassification``) ``classification`` (docs/models.md).
    """
    task = getattr(model, "task", None)
    if task is None:
        task = "next-token" if _is_causal_lm(model) else "classification"
    if not isinstance(task, str) or task not in TASKS:
        raise UsageError(
            f"the model's `task` attribute is {task!r}: set it to one of {', '.join(TASKS)}, or leave it out for"
            " classification"
        )
    return task


def _is_causal_lm(model: nn.Module) -> bool:
    """Whether ``model`` (or the model a peft wrapper holds) is one of transformers' causal language models."""
    unwrap = getattr(model, "get_base_model", None)
    inner = unwrap() if callable(unwrap) else model
    classes = _transformers_classes(inner)
    if not classes:
        return False  # transformers is not imported for models that are not its own (seconds to import)
    tasks = hugging_face.task_names()
    return any(tasks.get(cls.__name__) == "next-token" for cls in classes)


def output_logits(output: object) -> torch.Tensor:
    """The logits of a model's output: the output itself, or those a Hugging Face model returns with it.

    The one adapter between models and dpaudit (docs/models.md): a ``ModelOutput`` or a dict is read through its
    ``logits``, a tuple through its first item (transformers' ``return_dict=False``); anything else is returned as
    it is, for the caller's check of its type and shape.
    """
    if isinstance(output, dict):  # transformers' ModelOutput is an OrderedDict
        return output["logits"] if "logits" in output else output  # type: ignore[return-value]
    if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return output  # type: ignore[return-value]


def forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module``'s logits on ``x`` (:func:`output_logits` of its output)."""
    return output_logits(module(x))


def functional_forward(module: nn.Module, tensors: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``module``'s logits on ``x`` with its parameters and buffers ``tensors`` (``torch.func.functional_call``)."""
    return output_logits(functional_call(module, tensors, (x,)))


def example_losses(task: str, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(n,) per-example losses of ``task``: cross-entropy, for next-token the mean over the T positions."""
    if task == "classification":
        return nn.functional.cross_entropy(logits, labels, reduction="none")
    tokens = nn.functional.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="none")
    return tokens.view(labels.shape).mean(-1)


def mean_loss(task: str, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The batch-mean loss of ``task`` (every sequence has the same T, so the mean over all tokens for next-token)."""
    if task == "classification":
        return nn.functional.cross_entropy(logits, labels)
    return nn.functional.cross_entropy(logits.flatten(0, -2), labels.flatten())


def mlp(input_dim: int, num_classes: int, hidden: tuple[int, ...] = (128, 128)) -> nn.Sequential:
    """ReLU MLP ``input_dim → hidden… → num_classes`` of standard torch modules."""
    widths = (input_dim, *hidden)
    layers: list[nn.Module] = []
    for d_in, d_out in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(d_in, d_out), nn.ReLU()]
    layers.append(nn.Linear(widths[-1], num_classes))
    return nn.Sequential(*layers)


def seed_cnn(in_channels: int, num_classes: int, image_size: int = 32, hidden: int = 256) -> nn.Sequential:
    """[W] App. F.1's CNN: three 3×3 convolutions (32/64/128), each with ReLU and 2×2 max-pooling, two FC layers."""
    if image_size % 8:
        raise UsageError(f"the seed CNN pools three times by 2: image size {image_size} must be a multiple of 8")
    layers: list[nn.Module] = []
    for c_in, c_out in ((in_channels, 32), (32, 64), (64, 128)):
        layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
    side = image_size // 8
    layers += [nn.Flatten(), nn.Linear(128 * side * side, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)]
    return nn.Sequential(*layers)


def for_input(input_shape: tuple[int, ...], num_classes: int, task: str = "classification") -> nn.Module:
    """The default architecture for a dataset: MLP for vectors, the seed CNN for (C, H, W) images.

    Next-token sequences (T,): the byte-level transformer (:class:`dpaudit.models.transformer.CausalTransformer`).
    """
    if task == "next-token":
        return CausalTransformer(input_shape[0], vocabulary=num_classes)
    if len(input_shape) == 1:
        return mlp(input_shape[0], num_classes)
    if len(input_shape) == 3 and input_shape[1] == input_shape[2]:
        return seed_cnn(input_shape[0], num_classes, input_shape[1])
    raise UsageError(f"no default model for inputs of shape {input_shape}: expected (features,) or (C, H, H)")


def pretrain(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int = 30,
    batch_size: int = 64,
    lr: float = 0.05,
    momentum: float = 0.9,
    seed: int = 0,
) -> nn.Module:
    """Train ``model`` on public data in place (plain SGD with momentum) and return it, frozen and in eval mode.

    Deterministic given ``seed`` (initialisation, :func:`initialise`, and data order both come from it), and the
    same bits on every machine of a kind: it runs on one torch thread (:func:`one_thread`), as shadow models train.
    """
    with one_thread():
        initialise(model, seed)
        order_rng = np.random.default_rng(seed)
        task = task_of(model)
        inputs, labels = torch.from_numpy(x), torch.from_numpy(y)
        optimiser = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
        model.train()
        for _ in range(epochs):
            for batch in np.array_split(order_rng.permutation(len(y)), max(1, len(y) // batch_size)):
                optimiser.zero_grad()
                mean_loss(task, forward(model, inputs[batch]), labels[batch]).backward()
                optimiser.step()
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        return model


@contextmanager
def one_thread() -> Iterator[None]:
    """One torch thread (this process's count restored on exit).

    The thread count changes float results (a GEMM split over threads sums in another order): a model computed on
    one thread is the same bits whatever the machine's cores, in a worker or in the driver. One thread is also what
    a process beside busy workers should use: a 2-thread pretraining of the default MLP took 0.6-1.2 s beside one
    busy core, against 0.2 s on one thread (docs/performance.md §11).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# pretrain()'s settings where its caller gives none: a campaign's base, a training audit's starting model (whose
# audit.json records them, so that a resume under other ones is refused).
PRETRAINING = {name: value for name, value in (pretrain.__kwdefaults__ or {}).items() if name != "seed"}


def initialise(model: nn.Module, seed: int) -> None:
    """Re-draw the parameters of every submodule from ``seed`` (in place).

    A module's own ``reset_parameters``, or for a module of a transformers model that has none (GPT-2's Conv1D) that
    model's own initialiser (``_init_weights``), so no weight keeps the draw of the factory that built it.
    """
    hugging_face_init: dict[int, Callable] = {}
    for module in model.modules():  # outermost first: a transformers model's initialiser covers what it holds
        init = getattr(module, "_init_weights", None)
        if callable(init) and hasattr(module, "config"):
            for part in module.modules():
                hugging_face_init.setdefault(id(part), init)
    with torch.random.fork_rng(devices=[]):  # module initialisers use the global generator: seed a private fork
        torch.manual_seed(seed)
        for module in model.modules():
            reset = getattr(module, "reset_parameters", None)
            if callable(reset):
                reset()
            elif id(module) in hugging_face_init and next(module.parameters(recurse=False), None) is not None:
                hugging_face_init[id(module)](module)


def from_factory(
    spec: str, input_shape: tuple[int, ...], num_classes: int, *, seed: int, vocabulary: int | None = None
) -> nn.Module:
    """The base model of ``--model MODULE:FACTORY``: ``FACTORY(input_shape, num_classes)`` from an importable module.

    ``--model transformers:CLASS[:CONFIG.json]``: that transformers class built from its config, with the data's
    sizes (``vocabulary``: a classifier's token vocabulary) and its weights drawn from ``seed``
    (:func:`dpaudit.models.hugging_face.build`). A factory's own randomness is its own (docs/models.md §1).
    """
    if hugging_face.names_class(spec):
        return hugging_face.build(spec, tuple(input_shape), num_classes, seed=seed, vocabulary=vocabulary)
    factory = load_callable("--model", spec, ("input_shape", "num_classes"), "a torch.nn.Module")
    factory_name = spec.partition(":")[2]
    arguments = (tuple(input_shape), num_classes)
    with blamed_on_user(f"--model {spec}", f"building the model, {factory_name}{arguments},"):
        model = factory(*arguments)
    if not isinstance(model, nn.Module):
        raise UsageError(
            f"--model {spec}: {factory_name}{arguments} returned a {type(model).__name__},"
            " not a torch.nn.Module; return the base model"
        )
    return model


def input_vocabulary(model: nn.Module) -> int | None:
    """The rows of the model's input embedding where its input is token ids (docs/models.md §6), else None.

    A transformers model's ``get_input_embeddings()``; another model's first module with parameters of its own.
    """
    embedding: object = None
    if _transformers_classes(model):
        embedding = model.get_input_embeddings()  # type: ignore[operator]
    else:
        embedding = next((m for m in model.modules() if next(m.parameters(recurse=False), None) is not None), None)
    return embedding.num_embeddings if isinstance(embedding, nn.Embedding) else None


def fingerprint(model: nn.Module, weights: bool = True) -> str:
    """SHA-256 of the architecture (its module tree as torch prints it) and of every tensor of its state.

    ``weights=False``: the tensors' names, dtypes and shapes only (the architecture without its values).
    """
    digest = hashlib.sha256(repr(model).encode())
    for name, tensor in sorted(model.state_dict().items()):
        array = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{array.dtype}:{tuple(array.shape)}".encode())
        if weights:
            digest.update(array.numpy().tobytes() if array.dtype != torch.bfloat16 else array.float().numpy().tobytes())
    return digest.hexdigest()


def adapted_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Name → layer for every Linear, Conv2d and transformers Conv1D layer: the layers full fine-tuning trains.

    A layer whose weight is an earlier layer's (tied) is left out: it is that layer.

    A model with an ``nn.MultiheadAttention`` is refused: its fused ``in_proj_weight`` is no layer an adapter or
    a per-example gradient can target, and it reads ``out_proj``'s weight without calling the layer, so a LoRA
    adapter that peft puts there never trains.
    """
    for name, module in model.named_modules():
        if isinstance(module, nn.MultiheadAttention):
            raise UsageError(
                f"layer {name!r} is an nn.MultiheadAttention, which LoRA adapters cannot train (fused in_proj, "
                "out_proj read without being called): build attention from nn.Linear q/k/v/out projections, as "
                "dpaudit.models.transformer.CausalSelfAttention does"
            )
    layers: dict[str, nn.Module] = {}
    weights: set[int] = set()
    for name, module in model.named_modules():
        # A weight tied to an earlier layer's is that layer's parameter: trained (and counted) once.
        if _adaptable(module) and id(module.weight) not in weights:
            weights.add(id(module.weight))
            layers[name] = module
    return layers


def tied_parameters(model: nn.Module) -> set[int]:
    """``id`` of every parameter the model holds under more than one name (a tied weight: GPT-2's ``lm_head``).

    Such a parameter is one parameter: ``named_parameters`` names it once (its first name), ``functional_call``
    ties the names again, and its gradient sums every use (docs/models.md).
    """
    names: dict[int, int] = {}
    for _, parameter in model.named_parameters(remove_duplicate=False):
        names[id(parameter)] = names.get(id(parameter), 0) + 1
    return {key for key, count in names.items() if count > 1}


ALL_LINEAR = "all-linear"  # peft's shorthand: every linear layer but the output head
_LAYER_NAME = re.compile(r"[\w.-]+")  # a target of other characters is a regular expression, as peft reads a string


def lora_layers(model: nn.Module, targets: tuple[str, ...] | None = None) -> dict[str, nn.Module]:
    """The layers a LoRA adapter wraps: those of :func:`adapted_layers` that ``targets`` names (docs/models.md §5).

    peft's ``target_modules`` semantics, matched by peft itself: a layer is targeted when its name is a target or
    ends with ``"." +`` a target (``("q", "v")`` targets every ``*.q`` and ``*.v``); one target that is no plain
    name is a regular expression the whole name must match (``.*(q|v)_proj``); ``all-linear`` is every
    ``nn.Linear`` but the output head (:func:`output_head`). ``None``: the model's ``lora_targets`` attribute where
    it has one (the transformer's leave its output head out), else every Linear/Conv2d layer but a transformers
    model's output head.
    """
    layers = adapted_layers(model)
    targets = targets if targets is not None else getattr(model, "lora_targets", None)
    head = output_head(model)
    if targets is None:
        default = {name: layer for name, layer in layers.items() if name != head}
        if not default:
            raise UsageError(
                f"LoRA adapts no layer of the model by default: its only Linear/Conv2d layer is its output head {head};"
                f" adapt the head with --target-modules {head}"
            )
        return default
    if len(targets) == 1 and targets[0].lower() == ALL_LINEAR:
        chosen = dict.fromkeys(
            name for name, layer in layers.items() if not isinstance(layer, nn.Conv2d) and name != head
        )
        unmatched = [] if chosen else list(targets)
    else:
        import peft  # lazy: pulls in transformers
        from peft.tuners.tuners_utils import check_target_module_exists

        def matching(target_modules: str | list[str]) -> list[str]:
            config = peft.LoraConfig(target_modules=target_modules)
            return [name for name in layers if check_target_module_exists(config, name)]

        if len(targets) == 1 and not _LAYER_NAME.fullmatch(targets[0]):
            try:
                chosen = dict.fromkeys(matching(targets[0]))
            except re.error as error:
                raise UsageError(
                    f"LoRA target {targets[0]!r} is no regular expression ({error}): fix the pattern, or name layers"
                ) from None
            unmatched = [] if chosen else list(targets)
        else:
            named = {target: matching([target]) for target in targets}
            chosen = dict.fromkeys(name for names in named.values() for name in names)
            unmatched = [target for target, names in named.items() if not names]
    if unmatched or not targets:
        raise UsageError(
            f"LoRA target(s) {', '.join(unmatched) or '(none given)'} name no Linear/Conv2d layer of the model;"
            f" name layers or their last name parts, e.g. {', '.join(list(layers)[:4])}, a regular expression or"
            f" {ALL_LINEAR}"
        )
    return {name: layer for name, layer in layers.items() if name in chosen}


def output_head(model: nn.Module) -> str | None:
    """The name of a transformers model's output head (``lm_head``, a classifier's ``score``/``classifier``), else None.

    peft's ``all-linear`` leaves it out (its output embeddings, or for sequence classification the head named
    ``score`` or ``classifier``); dpaudit's default adapter does too (docs/models.md §5).
    """
    if not _transformers_classes(model):
        return None
    get_output = getattr(model, "get_output_embeddings", None)
    head = get_output() if callable(get_output) else None
    if head is None:
        head = next((getattr(model, name) for name in ("score", "classifier") if hasattr(model, name)), None)
    return next((name for name, module in model.named_modules() if module is head), None)


def projection_dim(layer: nn.Module) -> int:
    """d_i of [W] Eq. 36: the weight flattened to d_out × (all other dims); a Conv1D's d_in is its first dim."""
    weight = layer.weight
    assert isinstance(weight, torch.Tensor), "an adapted layer has a weight"
    return int(weight.shape[0]) if transposed(layer) else int(np.prod(weight.shape[1:]))


def output_dim(layer: nn.Module) -> int:
    """d_out of the layer's weight (a Conv1D's is its second dim)."""
    weight = layer.weight
    assert isinstance(weight, torch.Tensor), "an adapted layer has a weight"
    return int(weight.shape[1] if transposed(layer) else weight.shape[0])


def rank_limit(model: nn.Module, targets: tuple[str, ...] | None = None) -> tuple[str, int]:
    """The largest rank an adapter of the layers ``targets`` names takes, and the layer that limits it.

    A rank-r adapter needs r ≤ d_i for every adapted layer (otherwise A has more rows than its input).
    """
    dims = {name: projection_dim(layer) for name, layer in lora_layers(model, targets).items()}
    name = min(dims, key=dims.__getitem__)
    return name, dims[name]


def check_rank(model: nn.Module, rank: int, targets: tuple[str, ...] | None = None) -> None:
    """Refuse a rank larger than :func:`rank_limit`."""
    if rank < 1:
        raise UsageError(f"--rank must be a positive integer, got {rank}")
    name, limit = rank_limit(model, targets)
    if rank > limit:
        raise UsageError(
            f"--rank {rank} is larger than layer {name!r}'s input dimension {limit}; use --rank <= {limit}"
        )


@dataclass(frozen=True)
class LoraSpec:
    """Options of a LoRA adapter: ``scale = alpha / rank`` multiplies ``B A`` (peft's ``lora_alpha / r``).

    ``targets``: the layers adapted, as peft's ``target_modules`` (:func:`lora_layers`; None: the model's default).
    """

    rank: int
    alpha: float | None = None  # None: alpha = rank, so scale 1 and W's update is -η G AᵀA (docs/theory.md §1.2)
    targets: tuple[str, ...] | None = None

    @property
    def scale(self) -> float:
        return 1.0 if self.alpha is None else self.alpha / self.rank


def attach_lora(model: nn.Module, spec: LoraSpec) -> nn.Module:
    """Wrap the layers ``spec.targets`` names (:func:`lora_layers`) with peft LoRA adapters of rank ``spec.rank``.

    The adapter's own initial factors are placeholders: the engine draws ``lora_A`` per shadow model
    (:func:`draw_lora_a`) and starts ``lora_B`` at zero. Dropout is 0 (it would be extra, unaudited randomness).
    """
    import peft  # lazy: pulls in transformers

    check_rank(model, spec.rank, spec.targets)
    model = copy.deepcopy(model)  # peft wraps in place; the caller's base model stays a plain module
    config = peft.LoraConfig(
        r=spec.rank,
        # peft annotates lora_alpha as int but only divides it by r: a fractional alpha (--alpha 8.5) is valid.
        lora_alpha=spec.rank * spec.scale,  # type: ignore[arg-type]
        lora_dropout=0.0,
        # The chosen layers' full names as one pattern: as a list, peft would also adapt layers they are suffixes of.
        target_modules="|".join(re.escape(name) for name in lora_layers(model, spec.targets)),
        init_lora_weights=False,
        fan_in_fan_out=any(transposed(layer) for layer in lora_layers(model, spec.targets).values()),
    )
    with warnings.catch_warnings():  # peft sets fan_in_fan_out back to False for each nn.Linear, and says so
        warnings.filterwarnings("ignore", message="fan_in_fan_out is set to")
        # peft 0.21 asks a transformers model a deprecated question (no gradient checkpointing here either way)
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        wrapped = peft.get_peft_model(model, config)
    wrapped.eval()
    for layer in wrapped.modules():
        if isinstance(layer, peft.tuners.lora.LoraLayer) and not layer.lora_variant:
            layer.forward = types.MethodType(_lora_forward, layer)  # a deep copy binds it to the copy
    return wrapped


# How a merged adapter's layer is computed in this context (merged_adapters), or None: peft's unmerged layer.
_MERGED_ADAPTERS: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("merged_adapters", default=None)


@contextmanager
def merged_adapters(merged: bool = True, *, factor_gradients: bool = True) -> Iterator[None]:
    """Within it (``merged``), an adapted ``nn.Linear`` at scaling 1 computes ``x (W + B A)ᵀ + b``: one GEMM.

    peft's ``W x + b + B (A x)`` is three, two of them with the rank as a dimension, which MKL runs at a fraction of
    its speed: where a layer sees thousands of rows per model (a batch of sequences) the merged layer trains 1.2-2.4x
    faster, its backward included, although where A trains it forms the (d_out, d_in) gradient of ``W + B A``
    (:class:`_MergedLinear`); at tens of rows (an MLP's batch) it is 2x slower (docs/performance.md §8). The same
    function, rounded otherwise (about 1e-7 relative). Per model: no tensor of one model enters another's product, so
    a model's numbers do not depend on its companions. The context is the calling thread's: the engine's forward
    passes only, never the per-model loop's.

    ``factor_gradients``: whether the backward pass forms the factors' gradients (:class:`_MergedLinear`). False
    where it asks for the layers' output gradients only (DP-SGD's per-example pass, which derives the factors'
    from them): there the layer is autograd's own, whose backward forms no gradient that is not asked for, where a
    custom function's forms one for every input that requires grad (20% of a dp-lora step, measured).
    """
    token = _MERGED_ADAPTERS.set((_MergedLinear.apply if factor_gradients else _merged_linear) if merged else None)
    try:
        yield
    finally:
        _MERGED_ADAPTERS.reset(token)


def merges(layer: nn.Module) -> bool:
    """Whether ``layer`` (an adapted layer of :func:`attach_lora`) is merged inside :func:`merged_adapters`.

    An ``nn.Linear`` base at scaling 1 whose forward is :func:`_lora_forward`, which also leaves a call with more
    than the input unmerged.
    """
    forward = vars(layer).get("forward")
    return getattr(forward, "__func__", None) is _lora_forward and _mergeable(layer)


def _mergeable(layer: Any) -> bool:
    """An adapted layer whose adapter :func:`_lora_forward` merges into its weight: a Linear base at scaling 1."""
    return type(layer.base_layer) is nn.Linear and layer.scaling == {"default": 1.0}


def _lora_forward(layer: Any, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """The LoRA forward of peft, ``base(x) + B(A(x)) · scaling``, with peft's numbers for Linear layers.

    peft multiplies by the scaling even when it is 1: an elementwise pass over every adapted layer's output, and its
    backward, per step (docs/performance.md); here only a scaling other than 1 is multiplied. Dropout is 0
    (:func:`attach_lora`), so peft's is the identity. Inside :func:`merged_adapters`, a Linear layer's adapter is
    merged into its weight. A Conv2d layer's factors run with padded channels (:func:`_channel_padded_update`).
    """
    lora_a, lora_b = layer.lora_A["default"], layer.lora_B["default"]
    base = layer.base_layer
    merged_layer = _MERGED_ADAPTERS.get()
    if merged_layer is not None and _mergeable(layer) and not args and not kwargs:
        return merged_layer(x, base.weight, base.bias, lora_b.weight, lora_a.weight)
    result = base(x, *args, **kwargs)
    x = layer._cast_input_dtype(x, lora_a.weight.dtype)
    update = _channel_padded_update(lora_a, lora_b, x) if type(lora_a) is nn.Conv2d else lora_b(lora_a(x))
    scaling = layer.scaling["default"]
    return (result + (update if scaling == 1 else update * scaling)).to(result.dtype)


def _merged_linear(x, weight, bias, lora_b, lora_a):
    """``x (W + B A)ᵀ + b``: an adapted Linear layer at scaling 1 as one GEMM (:func:`merged_adapters`)."""
    return nn.functional.linear(x, weight + lora_b @ lora_a, bias)


def _merged_products(x, weight, bias, lora_b, lora_a):
    """K models' ``x (W + B A)ᵀ + b``, each tensor with the models first: one batched GEMM, the bias inside it.

    vmap's rule for ``linear`` adds the bias in a pass of its own over the (K, rows, d_out) outputs; ``baddbmm`` starts
    each model's product from it (as ``addmm`` does for one model's rows in the per-model loop).
    """
    rows = x.reshape(x.shape[0], -1, x.shape[-1])
    merged = (weight + lora_b @ lora_a).mT
    products = torch.bmm(rows, merged) if bias is None else torch.baddbmm(bias.unsqueeze(-2), rows, merged)
    return products.view(*x.shape[:-1], weight.shape[-2])


def _merged_gradients(needs: tuple[bool, ...], grad, x, weight, lora_b, lora_a) -> tuple:
    """The gradients of :func:`_merged_products` that ``needs`` (x, W, b, B, A) asks for, the models first.

    Autograd's backward of the merged product forms the (d_out, d_in) gradient of ``W + B A`` and projects it on
    the factors. Where B alone trains (LoRA-FA), B's gradient is ``δᵀ (x Aᵀ)`` instead: r (d_in + d_out) products per
    row instead of d_in d_out, 1.4-1.9x faster at the byte-level transformer's layers (docs/performance.md §10).
    Where A trains too, the gradient of ``W + B A`` is formed once for both factors, as autograd does.
    """
    need_x, need_weight, need_bias, need_b, need_a = needs
    rows_grad = grad.reshape(grad.shape[0], -1, grad.shape[-1])
    rows_x = x.reshape(x.shape[0], -1, x.shape[-1])
    grad_x = (rows_grad @ (weight + lora_b @ lora_a)).view(x.shape) if need_x else None
    grad_bias = rows_grad.sum(1) if need_bias else None
    grad_weight = grad_b = grad_a = None
    if need_weight or need_a:
        merged_grad = rows_grad.mT @ rows_x
        grad_weight = merged_grad if need_weight else None
        grad_b = merged_grad @ lora_a.mT if need_b else None
        grad_a = lora_b.mT @ merged_grad if need_a else None
    elif need_b:
        grad_b = rows_grad.mT @ (rows_x @ lora_a.mT)
    return grad_x, grad_weight, grad_bias, grad_b, grad_a


def _save_merged_inputs(ctx, inputs, output) -> None:
    """What the merged layers' backward reads: x, W, B and A (not the bias)."""
    x, weight, _, lora_b, lora_a = inputs
    ctx.save_for_backward(x, weight, lora_b, lora_a)


class _MergedLinear(torch.autograd.Function):
    """``x (W + B A)ᵀ + b``, a merged adapter's layer (:func:`merged_adapters`), with B's gradient formed at rank r.

    Written for one model; under ``vmap`` (the engine's K models) the models' layers are computed together by
    :class:`_MergedLinears`: 1.03-1.13x faster training steps of the byte-level transformer than vmap's own rules
    for the same function, whose ``linear`` adds the bias in a separate pass (docs/performance.md §15).
    """

    @staticmethod
    def forward(x, weight, bias, lora_b, lora_a):
        return _merged_products(*(None if t is None else t.unsqueeze(0) for t in (x, weight, bias, lora_b, lora_a)))[0]

    setup_context = staticmethod(_save_merged_inputs)

    @staticmethod
    def backward(ctx, grad):
        tensors = (t.unsqueeze(0) for t in (grad, *ctx.saved_tensors))
        return tuple(None if g is None else g[0] for g in _merged_gradients(ctx.needs_input_grad, *tensors))

    @staticmethod
    def vmap(info, in_dims, *inputs):
        models_first = [
            None if t is None else t.expand(info.batch_size, *t.shape) if dim is None else t.movedim(dim, 0)
            for t, dim in zip(inputs, in_dims)
        ]
        return _MergedLinears.apply(*models_first), 0


class _MergedLinears(torch.autograd.Function):
    """K models' :class:`_MergedLinear` layers, every tensor with the models first (:func:`_merged_products`)."""

    @staticmethod
    def forward(x, weight, bias, lora_b, lora_a):
        return _merged_products(x, weight, bias, lora_b, lora_a)

    setup_context = staticmethod(_save_merged_inputs)

    @staticmethod
    def backward(ctx, grad):
        return _merged_gradients(ctx.needs_input_grad, grad, *ctx.saved_tensors)


# Channels per group from which oneDNN's grouped convolutions round as single ones: 8 where it runs AVX2 kernels, 16
# where AVX-512 ones (a seed CNN alone and with 3 others differed at 8 on an AVX-512 machine); 16 serves both.
_CHANNEL_BLOCK = 16


def _channel_padded_update(lora_a: nn.Conv2d, lora_b: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``B(A(x))`` of a Conv2d adapter: A with its input and rank channels zero-padded to multiples of 16, B a GEMM.

    The same numbers with zeros added. Under ``vmap`` each factor is a grouped convolution over the K models, and
    oneDNN rounds a group's output otherwise from 2-3 groups on where a group's input or output channels are not a
    multiple of its kernels' block (an image's 3 channels, a rank of 4; 8 channels with AVX2, 16 with AVX-512), and
    a 1×1 convolution's backward otherwise with one group than with several (at 32 images of 32×32): a model's numbers
    depended on how many models it was trained with (docs/performance.md §8). B, a 1×1 convolution, is one matrix
    product per image over its pixels instead.
    """
    one_by_one = lora_b.kernel_size == (1, 1) and lora_b.stride == (1, 1) and lora_b.padding in ((0, 0), "valid")
    if lora_a.groups != 1 or lora_a.padding_mode != "zeros" or lora_b.groups != 1 or not one_by_one:
        return lora_b(lora_a(x))
    c_in, rank = lora_a.in_channels, lora_a.out_channels
    pad_in, pad_rank = -c_in % _CHANNEL_BLOCK, -rank % _CHANNEL_BLOCK
    a = nn.functional.pad(lora_a.weight, (0, 0, 0, 0, 0, pad_in, 0, pad_rank))
    if pad_in:
        x = nn.functional.pad(x, (0, 0, 0, 0, 0, pad_in))
    hidden = nn.functional.conv2d(x, a, None, lora_a.stride, lora_a.padding, lora_a.dilation).narrow(-3, 0, rank)
    # One (d_out, r) @ (r, pixels) product per image, batched over the images: the per-model loop and the engine
    # (which batches the models' images too) run the same products and sum B's gradient over images alike.
    weight, pixels = lora_b.weight.flatten(1), hidden.flatten(-2)
    return (weight.expand(*pixels.shape[:-2], *weight.shape) @ pixels).unflatten(-1, hidden.shape[-2:])


def draw_lora_a(shape: tuple[int, ...], rank: int, generator: torch.Generator) -> torch.Tensor:
    """LoRA-FA's frozen factor: i.i.d. N(0, 1/r) entries, so that ``AᵀA`` is Wishart W(I/r, r) with E = I.

    peft's ``init_lora_weights="gaussian"`` uses std 1/r, which is a different mechanism (docs/theory.md §1.2).
    ``shape`` is ``lora_A``'s weight shape: (r, d_in) for Linear, (r, c_in, kh, kw) for Conv2d.
    """
    return torch.randn(shape, generator=generator) / math.sqrt(rank)

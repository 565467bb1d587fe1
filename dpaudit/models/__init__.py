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

import copy
import hashlib
import math
import re
import types
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from dpaudit.errors import UsageError
from dpaudit.models import adapters, hugging_face
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
            layer.forward = types.MethodType(adapters.lora_forward, layer)  # a deep copy binds it to the copy
    return wrapped


def draw_lora_a(shape: tuple[int, ...], rank: int, generator: torch.Generator) -> torch.Tensor:
    """LoRA-FA's frozen factor: i.i.d. N(0, 1/r) entries, so that ``AᵀA`` is Wishart W(I/r, r) with E = I.

    peft's ``init_lora_weights="gaussian"`` uses std 1/r, which is a different mechanism (docs/theory.md §1.2).
    ``shape`` is ``lora_A``'s weight shape: (r, d_in) for Linear, (r, c_in, kh, kw) for Conv2d.
    """
    return torch.randn(shape, generator=generator) / math.sqrt(rank)

"""A campaign's configuration: every knob of an audit, validated once, hashed canonically."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import io
import json
import math
from dataclasses import dataclass

from accountants import validation as check
from dpaudit.errors import UsageError
from dpaudit.files import open_regular
from dpaudit.mechanisms import catalogue
from dpaudit.mechanisms.catalogue import FLOAT32_MAX, check_noise_and_clip
from dpaudit.training.sampling import ADAMW_WEIGHT_DECAY, OPTIMIZERS, SCHEDULES

# Mechanism names and which options apply to which (docs/theory.md §1): the one table is
# dpaudit.mechanisms.catalogue.MECHANISMS (torch-free), whose module docstring says what each option means.
TRAINING_MECHANISMS = tuple(catalogue.MECHANISMS)
NOISY_MECHANISMS = catalogue.applying("noise")  # --noise: σ, or σ_g
CLIPPED_MECHANISMS = catalogue.applying("clip")  # --clip C, Poisson sampling
FINITE_CLIP_MECHANISMS = catalogue.applying("finite-clip")  # no --clip inf
DENOISABLE_MECHANISMS = catalogue.applying("denoise")  # --denoise ([D] Alg. 1)
PROJECTION_MECHANISMS = catalogue.applying("resample-projection")  # --resample-projection ([W] App. F.2)
# A mechanism, model or dataset given to dpaudit.audit as a Python object is named "python:<what it is>": no name
# rebuilds it, so only dpaudit.audit can run or continue such a campaign.
PYTHON_OBJECT = "python:"
RANKED_MECHANISMS = catalogue.applying("rank")  # --rank: the LoRA rank r, or the rank of m1/m2's projection
SCALED_MECHANISMS = catalogue.applying("alpha")  # --alpha: the scale alpha/r of the adapter's product B A
DEFAULT_NOISE = 1.0  # σ (σ_g for the sketch) when --noise is not given
DEFAULT_CLIP = 1.0  # C when --clip is not given
DEFAULT_RANK = 16  # r when --rank is not given
# [W] App. F.1 trains 2000 shadow models, LiRA 256. Every model's logits on the population (the test split)
# are kept and analysed at once: 2^16 models of digits' 360 × 10 float32 logits are ~0.9 GB, of CIFAR-10's
# 10^4 × 10 ~26 GB, about what one machine holds.
MAX_MODELS = 2**16
# The papers train for at most 30 epochs. 10^6 keeps the step count T = epochs · ⌈n/b⌉ below 2^53 (exact in
# the accountants' float64) for any training set of fewer than 2^33 examples.
MAX_EPOCHS = 10**6
MAX_INSERTIONS = 10**4  # copies of one canary in a training set (Carlini et al. 2019 insert up to thousands)
# A guard against typos (1e10 for 1e-1), not a promise that smaller rates train: SGD on digits' MLP with
# momentum 0.9 already diverges to NaN at lr = 3. The papers use lr <= 1.
MAX_LR = 10.0
# joblib starts every worker process up front (each holding a few pipes): more than 1024 local processes
# exceed the usual open-file limit (ulimit -n 1024) and the machine's memory long before they help.
MAX_WORKERS = 1024
DESIGNS = ("canary", "all-examples", "one-run")
# White-box audits (docs/theory.md §3.9, training.canaries): what the canary is, and what the auditor sees of a run.
CANARIES = ("input", "gradient")
CANARY_DIRECTIONS = ("dirac", "random", "tangent")
OBSERVATIONS = ("outputs", "weights", "steps")
# Fields added after run format 2, hashed only when they differ from these values (which are what every campaign
# recorded before them used), so those campaigns keep their hash.
_HASHED_WHEN_CHANGED = {
    "canary": "input",
    "canary_direction": None,
    "canary_norm": None,
    "observe": "outputs",
    "canaries": None,
    "mutant": None,
    "model": None,
    "pretrain": True,
    "target_modules": None,
    "schedule": "cosine",
    "optimizer": "sgd",
    "weight_decay": None,
    "window": None,
    "tokenizer": None,
    "insertions": 1,
}
# Dataset kinds whose examples are windows of tokens, cut to --window's length (dpaudit.data.text).
WINDOWED_DATASETS = ("text", "tokens")
PRECISIONS = ("fp32", "bf16")
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("loky", "dask")


@dataclass(frozen=True)
class CampaignConfig:
    """One membership-inference campaign ([W] App. F.1 protocol): what is trained, how often, how it is judged.

    Every field changes the numbers a campaign produces (how it is executed is :class:`Execution`).
    ``design="canary"``: ``models`` shadow models, half IN (trained with the canary), half OUT; ``null=True``
    keeps the canary out of every model (a null campaign: any ε > 0 it reports is a false positive).
    ``design="all-examples"``: every private example is a target, IN for exactly half of the models.
    ``precision="bf16"`` trains under bf16 autocast (faster on GPUs; its effect on scores is measured in
    ``benchmarks/bench_precision.py``), never the default.

    Every field is checked here, so the Python API refuses what the command line refuses, before anything is
    written; values are stored in their canonical types (``models=4.0`` is stored as 4, ``lr=1`` as 1.0).
    ``noise``, ``clip``, ``rank`` and ``alpha`` apply to some mechanisms only (the ``*_MECHANISMS`` tuples):
    given for another one they are refused; left None where they apply, ``noise``, ``clip`` and ``rank`` take
    their documented defaults, so the stored config (and its hash) says which values were used.
    """

    mechanism: str = "lora-fa"
    dataset: str = "digits"
    rank: int | None = None  # LoRA / projection rank r; None: DEFAULT_RANK where it applies
    alpha: float | None = None  # LoRA alpha, scale alpha/r; None: alpha = r
    models: int = 256
    epochs: int = 10
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 0
    delta: float = 1e-5
    null: bool = False
    design: str = "canary"
    precision: str = "fp32"
    noise: float | None = None  # noise multiplier σ (sketch: σ_g); None: DEFAULT_NOISE for noisy mechanisms
    clip: float | None = None  # clip norm C; None: DEFAULT_CLIP for clipping mechanisms
    denoise: bool = False  # spectral denoising of DP-SGD updates ([D] Alg. 1)
    resample_projection: bool = False  # m1/m2: a fresh projection M every step ([W] App. F.2)
    canary: str = "input"  # input: the static-poison example ([W] App. F.1); gradient: a crafted gradient
    canary_direction: str | None = None  # gradient canaries: dirac | random | tangent; None: dirac
    canary_norm: float | None = None  # gradient canaries' norm (no CLI flag); None: C, or 1 without clipping
    observe: str | None = None  # outputs | weights | steps; None: outputs (input canary), steps (gradient)
    canaries: int | None = None  # M, the canaries of the one-run design
    mutant: str | None = (
        None  # a planted bug (dpaudit.mechanisms.catalogue), for tests and benchmarks: no CLI flag or TOML key
    )
    # MODULE:FACTORY, FACTORY(input_shape, num_classes) the base, or transformers:CLASS[:CONFIG.json]; None: built-in
    model: str | None = None
    pretrain: bool = True  # pretrain the base on the public split (False: the base's own weights, --no-pretrain)
    target_modules: tuple[str, ...] | None = None  # layers LoRA adapts (peft's target_modules); None: every layer
    schedule: str = "cosine"  # learning-rate schedule: cosine annealing over all steps ([W] App. F.1) or constant
    optimizer: str = "sgd"  # sgd (with momentum) | adamw (β1 = momentum)
    weight_decay: float | None = None  # AdamW's decoupled weight decay; None: ADAMW_WEIGHT_DECAY with adamw
    window: int | None = None  # tokens per window of text/tokens data; None: 64 (tokens:PATH with y: its own)
    tokenizer: str | None = None  # text data's tokenizer on disk (a tokenizer.json or a directory); None: bytes
    insertions: int = 1  # copies of each input canary in the training set of a model it is IN for

    def __post_init__(self):
        checked = {
            "mechanism": (
                self.mechanism
                if self.user_mechanism
                else check.one_of("--mechanism", self.mechanism, TRAINING_MECHANISMS)
            ),
            "dataset": check.string("--dataset", self.dataset),
            "models": _even_models(self.models),
            "epochs": check.integer("--epochs", self.epochs, 1, MAX_EPOCHS),
            "batch_size": check.count("--batch-size", self.batch_size),
            "lr": check.real_in("--lr", self.lr, 0, MAX_LR, low_open=True),
            "momentum": check.real_in("momentum", self.momentum, 0, 1, high_open=True),
            "seed": check.seed("--seed", self.seed),
            "delta": check.open_unit("--delta", self.delta),
            "null": check.boolean("--null", self.null),
            "design": check.one_of("--design", self.design, DESIGNS),
            "precision": check.one_of("--precision", self.precision, PRECISIONS),
            "denoise": check.boolean("--denoise", self.denoise),
            "resample_projection": check.boolean("--resample-projection", self.resample_projection),
            "model": None if self.model is None else _model_spec(self.model),
            "pretrain": check.boolean("--pretrain", self.pretrain),
            "target_modules": None if self.target_modules is None else _target_modules(self.target_modules),
            "schedule": check.one_of("--schedule", self.schedule, SCHEDULES),
            **self._optimizer_options(),
            **self._mechanism_options(),
            **self._text_options(),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)
        if self.null and self.design == "all-examples":
            raise UsageError("--null applies to the canary and one-run designs only")
        for name, value in self._canary_options().items():
            object.__setattr__(self, name, value)
        if self.mutant is not None:
            self._check_mutant()

    @property
    def user_mechanism(self) -> bool:
        """A mechanism object of the user's (``python:…``), given to dpaudit.audit: its own privacy event bounds it."""
        return isinstance(self.mechanism, str) and self.mechanism.startswith(PYTHON_OBJECT)

    def _check_mutant(self) -> None:
        """A planted bug (:mod:`dpaudit.mechanisms.catalogue`) names a mutant and a mechanism it can be planted in."""
        check.one_of("mutant", self.mutant, tuple(catalogue.MUTANTS))
        if self.mechanism not in catalogue.MUTATED_MECHANISMS or self.denoise:
            raise UsageError(
                f"mutant {self.mutant!r} is planted in {', '.join(catalogue.MUTATED_MECHANISMS)} without --denoise,"
                f" not in {self.mechanism}{' with --denoise' if self.denoise else ''}"
            )

    def _canary_options(self) -> dict:
        """Canary kind, direction, norm, observation and count checked together (docs/theory.md §3.9).

        An input canary is seen through the model's outputs; a gradient canary, which has no input, through the
        weights or every update, never in the all-examples design. One-run designs need ``--canaries M``, at most
        1/(2δ) (the one-run bound's δ term is 2Mδ), with orthogonal (Dirac) gradient canaries. ``--insertions k``
        puts k copies of each input canary into the training set of a model it is IN for (the Secret Sharer's
        insertions, Carlini et al. 2019 Sec. 5): the claim audited is then the group privacy of k examples.
        """
        canary = check.one_of("--canary", self.canary, CANARIES)
        insertions = check.integer("--insertions", self.insertions, 1, MAX_INSERTIONS)
        if insertions != 1 and (canary != "input" or self.design == "all-examples"):
            raise UsageError(
                "--insertions applies to input canaries in the canary and one-run designs (copies of a canary example);"
                " leave it at 1 here"
            )
        if self.design == "one-run":
            if self.canaries is None:
                raise UsageError("--design one-run needs --canaries M, the number of canaries (e.g. --canaries 1000)")
            canaries = check.integer("--canaries", self.canaries, 1, math.floor(1 / (2 * self.delta)))
        elif self.canaries is not None:
            raise UsageError(f"--canaries applies to --design one-run, not --design {self.design}")
        else:
            canaries = None
        observe = self.observe
        if canary == "input":
            for option, value in (("--canary-direction", self.canary_direction), ("canary_norm", self.canary_norm)):
                if value is not None:
                    raise UsageError(f"{option} applies to --canary gradient only")
            observe = check.one_of("--observe", "outputs" if observe is None else observe, OBSERVATIONS)
            if observe != "outputs":
                raise UsageError(
                    f"--observe {observe} needs --canary gradient: an input canary has no known direction in the"
                    " weights; use --observe outputs"
                )
            return {"canary": canary, "observe": observe, "canaries": canaries, "insertions": insertions}
        if self.design == "all-examples":
            raise UsageError("--canary gradient applies to the canary and one-run designs, not all-examples")
        direction = check.one_of(
            "--canary-direction",
            "dirac" if self.canary_direction is None else self.canary_direction,
            CANARY_DIRECTIONS,
        )
        if direction != "dirac" and self.design == "one-run":
            raise UsageError("--design one-run needs orthogonal canaries: use --canary-direction dirac")
        if direction == "tangent" and not self.user_mechanism and self.mechanism != "prism":
            raise UsageError(
                f"--canary-direction tangent lies in the tangent space of LoRA factors updated as Z = B A (--mechanism"
                f" prism); {self.mechanism} has none: use --canary-direction dirac or random"
            )
        observe = check.one_of("--observe", "steps" if observe is None else observe, OBSERVATIONS)
        if observe == "outputs":
            raise UsageError("--canary gradient needs --observe weights or steps: a gradient canary has no input")
        if observe == "steps" and self.mechanism in catalogue.applying("final-release"):
            raise UsageError(
                f"--observe steps does not apply to the {self.mechanism}, which releases only its final weights"
                " ([S] Eq. 14): use --observe weights"
            )
        clip = self.clip if self.clip is not None and math.isfinite(self.clip) else 1.0
        norm = (
            clip
            if self.canary_norm is None
            else check.real_in("canary_norm", self.canary_norm, 0, FLOAT32_MAX, low_open=True)
        )
        return {
            "canary": canary,
            "canary_direction": direction,
            "canary_norm": norm,
            "observe": observe,
            "canaries": canaries,
            "insertions": insertions,
        }

    def _text_options(self) -> dict:
        """``--window`` for text and token data, ``--tokenizer`` for text (docs/models.md §6), nothing else."""
        kind = self.dataset.partition(":")[0]
        if self.window is not None and kind not in WINDOWED_DATASETS:
            raise UsageError(
                f"--window applies to --dataset text, text:PATH and tokens:PATH (windows of tokens), not"
                f" {self.dataset}: leave it out"
            )
        if self.tokenizer is not None and kind != "text":
            raise UsageError(
                f"--tokenizer encodes --dataset text or text:PATH, not {self.dataset}"
                + (" (its ids are tokens already)" if kind == "tokens" else "")
                + ": leave it out"
            )
        return {
            "window": None if self.window is None else check.count("--window", self.window),
            "tokenizer": None if self.tokenizer is None else check.string("--tokenizer", self.tokenizer),
        }

    def _optimizer_options(self) -> dict:
        """The optimiser and its weight decay; AdamW only where the mechanism leaves the update to the optimiser.

        PRISM applies its own update ([P] Alg. 1), and the sketch's claim is about its released weights under SGD
        ([S] Eq. 14): AdamW would be ignored by the one and void the other's claim.
        """
        optimizer = check.one_of("--optimizer", self.optimizer, OPTIMIZERS)
        if optimizer == "sgd":
            if self.weight_decay is not None:
                raise UsageError("--weight-decay applies to --optimizer adamw (SGD here has no weight decay)")
            return {"optimizer": optimizer, "weight_decay": None}
        if self.mechanism in ("prism", "sketch"):
            why = (
                "applies its own update ([P] Alg. 1)"
                if self.mechanism == "prism"
                else "claims SGD's weights ([S] Eq. 14)"
            )
            raise UsageError(f"--optimizer adamw does not apply to {self.mechanism}, which {why}: use --optimizer sgd")
        decay = ADAMW_WEIGHT_DECAY if self.weight_decay is None else self.weight_decay
        return {"optimizer": optimizer, "weight_decay": check.real_in("--weight-decay", decay, 0, 1, high_open=True)}

    def _mechanism_options(self) -> dict:
        """Rank, alpha, σ and C checked, each only where it applies; unset ones take their defaults."""
        name = self.mechanism
        # A user's mechanism keeps its own σ, C and options; the campaign gives it a LoRA adapter if asked.
        adapter = (name,) if self.user_mechanism else ()
        for option, given, applies in (
            ("noise", self.noise is not None, NOISY_MECHANISMS),
            ("clip", self.clip is not None, CLIPPED_MECHANISMS),
            ("rank", self.rank is not None, RANKED_MECHANISMS + adapter),
            ("alpha", self.alpha is not None, SCALED_MECHANISMS + adapter),
            ("denoise", self.denoise is True, DENOISABLE_MECHANISMS),
            ("resample-projection", self.resample_projection is True, PROJECTION_MECHANISMS),
            ("target-modules", self.target_modules is not None, RANKED_MECHANISMS + adapter),
        ):
            if given and name not in applies:
                raise UsageError(f"--{option} does not apply to mechanism {name!r}; it applies to {', '.join(applies)}")
        rank = alpha = None
        if name in RANKED_MECHANISMS:
            rank = check.count("--rank", DEFAULT_RANK if self.rank is None else self.rank)
        elif self.rank is not None:  # a user's mechanism: LoRA of this rank, none without it
            rank = check.count("rank", self.rank)
        elif self.user_mechanism and (self.alpha is not None or self.target_modules is not None):
            raise UsageError("alpha and target_modules set a LoRA adapter: give its rank too")
        if self.alpha is not None:
            alpha = check.positive("--alpha", self.alpha)
            if rank is not None and alpha / rank > FLOAT32_MAX:  # rank applies wherever alpha does
                raise UsageError(f"--alpha {alpha:g}: the scale alpha/r = {alpha / rank:g} exceeds float32's maximum")
        noise = (DEFAULT_NOISE if self.noise is None else self.noise) if name in NOISY_MECHANISMS else None
        clip = (DEFAULT_CLIP if self.clip is None else self.clip) if name in CLIPPED_MECHANISMS else None
        if noise is not None:
            noise, clip = check_noise_and_clip(noise, clip, self.denoise)
        if name in FINITE_CLIP_MECHANISMS and clip == math.inf:
            raise UsageError(
                f"--clip inf does not apply to mechanism {name!r}, which always clips: give a finite --clip"
            )
        return {"rank": rank, "alpha": alpha, "noise": noise, "clip": clip}

    def canonical_hash(self) -> str:
        """SHA-256 of the canonical JSON of every field.

        A field added after run format 2 is left out at its former value, so older campaigns keep their hash.
        """
        fields = {
            name: value
            for name, value in dataclasses.asdict(self).items()
            if name not in _HASHED_WHEN_CHANGED or value != _HASHED_WHEN_CHANGED[name]
        }
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()

    def differences(self, other: CampaignConfig) -> list[str]:
        """``field: mine → other`` for each field that differs."""
        mine, theirs = dataclasses.asdict(self), dataclasses.asdict(other)
        return [f"{k}: {mine[k]!r} → {theirs[k]!r}" for k in mine if mine[k] != theirs[k]]


@dataclass(frozen=True)
class Execution:
    """How a campaign runs; none of it changes a score (one torch thread per worker, whatever the count).

    ``chunk_size=None`` picks it: 128 models on CPU, from free memory on CUDA. ``backend="dask"`` runs chunks on
    a dask cluster through joblib (``scheduler`` = its address; None starts a local cluster); it needs the
    ``cluster`` extra, checked here so that its absence is a usage error before anything is written.
    """

    device: str = "auto"
    chunk_size: int | None = None
    workers: int | None = None  # None: one per CPU core (CPU) or per GPU (CUDA)
    backend: str = "loky"
    scheduler: str | None = None
    progress: bool = True

    def __post_init__(self):
        checked = {
            "device": check.one_of("--device", self.device, DEVICES),
            "backend": check.one_of("--backend", self.backend, BACKENDS),
            "chunk_size": None if self.chunk_size is None else check.count("--chunk-size", self.chunk_size),
            "workers": None if self.workers is None else check.integer("--workers", self.workers, 1, MAX_WORKERS),
            "scheduler": None if self.scheduler is None else check.string("--scheduler", self.scheduler),
            "progress": check.boolean("progress", self.progress),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)
        if self.scheduler is not None and self.backend != "dask":
            raise UsageError("--scheduler needs --backend dask (the loky backend runs on this machine only)")
        if self.backend == "dask" and not all(importlib.util.find_spec(name) for name in ("dask", "distributed")):
            raise UsageError(
                "--backend dask needs the cluster extra: pip install -c constraints.txt 'dpaudit[cluster]'"
            )


def _model_spec(value) -> str:
    """``--model``: ``MODULE:FACTORY``, ``transformers:CLASS[:CONFIG.json]`` or a Python object's description.

    ``MODULE:FACTORY``: a module Python can import, a callable in it; ``transformers:CLASS``: a transformers class
    built from its config (docs/models.md §8).
    """
    spec = check.string("--model", value)
    module, _, factory = spec.partition(":")
    if not (module and factory):
        raise UsageError(
            f"--model must be MODULE:FACTORY (an importable module and a callable in it, e.g. mymodels:make_net) or"
            f" transformers:CLASS[:CONFIG.json] (e.g. transformers:GPT2LMHeadModel), got {spec!r}"
        )
    return spec


_REGEX_CHARACTERS = frozenset("^$*+?()[]{}|\\")  # no layer name holds one: a value with one is a regex


def _target_modules(value) -> tuple[str, ...]:
    r"""``--target-modules NAME[,NAME…]`` (or a list of names) as a tuple of non-empty layer names.

    A string with a regular expression's special character is one regular expression, never split at its commas
    (``h\.[0-1]\.attn\.c_(attn|proj)`` or ``.*\.c_.{2,4}``), as peft reads a string ``target_modules``.
    """
    regex = isinstance(value, str) and not _REGEX_CHARACTERS.isdisjoint(value)
    names = ([value] if regex else value.split(",")) if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise UsageError(
            f"--target-modules must name layers, NAME[,NAME…] (peft's target_modules, e.g. fc1,fc2), got {value!r}"
        )
    return tuple(name.strip() for name in names)


def _even_models(value) -> int:
    """Shadow models: half IN, half OUT, so an even count in [2, MAX_MODELS]."""
    value = check.integer("--models", value)
    if not (2 <= value <= MAX_MODELS and value % 2 == 0):
        raise UsageError(f"--models must be an even number >= 2 and <= {MAX_MODELS} (half IN, half OUT), got {value}")
    return value


def from_mapping(values: dict, source: str = "config") -> tuple[CampaignConfig, Execution]:
    """Campaign and execution settings from flat ``key = value`` pairs (a TOML file, or CLI flags).

    Keys are the field names of :class:`CampaignConfig` and :class:`Execution` (``-`` and ``_`` both work);
    an unknown key is an error naming the key, a bad value one naming its option (the dataclasses check them).
    """
    fields = {f.name: cls for cls in (CampaignConfig, Execution) for f in dataclasses.fields(cls)}
    chosen: dict[type, dict] = {CampaignConfig: {}, Execution: {}}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name not in fields:
            raise UsageError(f"{source}: unknown key {key!r}; known keys: {', '.join(sorted(fields))}")
        chosen[fields[name]][name] = value
    return CampaignConfig(**chosen[CampaignConfig]), Execution(**chosen[Execution])


def load_toml(path) -> dict:
    """The flat table of a campaign TOML file."""
    import tomllib

    try:
        # utf-8-sig: a byte-order mark, which some Windows editors write, is not TOML but not an error either;
        # newline="": the text as written, so that TOML's parser sees (and refuses) a lone carriage return
        with open_regular(path, "give --config the path of a TOML file") as handle:
            table = tomllib.loads(io.TextIOWrapper(handle, encoding="utf-8-sig", newline="").read())
    except OSError as exc:  # missing, unreadable: the user's path, so a usage error
        raise UsageError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"config file {path} is not UTF-8 text: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"config file {path} is not valid TOML: {exc}") from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise UsageError(
            f"config file {path} nests arrays or tables too deeply to parse; a campaign's keys take flat values"
        ) from None
    nested = [key for key, value in table.items() if isinstance(value, dict)]
    if nested:
        raise UsageError(f"config file {path}: tables are not supported ({', '.join(nested)}); use flat keys")
    spelled: dict[str, str] = {}
    for key in table:
        other = spelled.setdefault(key.replace("-", "_"), key)
        if other != key:
            raise UsageError(f"config file {path}: keys {other!r} and {key!r} name one setting; keep one of them")
    if "mutant" in table:
        raise UsageError(
            f"config file {path}: 'mutant' plants a DP bug on purpose (mechanisms.catalogue) and is for tests and"
            " benchmarks only: remove the key"
        )
    return table

"""A campaign's configuration: every knob of an audit, validated once, hashed canonically."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass

from dpaudit.errors import UsageError

TRAINING_MECHANISMS = ("none", "lora-fa", "m1", "m2", "sketch", "dp-sgd", "dp-lora", "dp-lora-fa", "prism")
# Which options apply to which mechanisms (docs/theory.md §1; dpaudit.mechanisms.registry builds them).
NOISY_MECHANISMS = ("m1", "m2", "sketch", "dp-sgd", "dp-lora", "dp-lora-fa", "prism")  # --noise: σ, or σ_g
CLIPPED_MECHANISMS = ("m1", "m2", "dp-sgd", "dp-lora", "dp-lora-fa", "prism")  # --clip C, Poisson sampling
DENOISABLE_MECHANISMS = ("dp-sgd", "dp-lora", "dp-lora-fa")  # --denoise ([D] Alg. 1)
PROJECTION_MECHANISMS = ("m1", "m2")  # --resample-projection ([W] App. F.2)
DEFAULT_NOISE = 1.0  # σ (σ_g for the sketch) when --noise is not given
DEFAULT_CLIP = 1.0  # C when --clip is not given
DESIGNS = ("canary", "all-examples")
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
    """

    mechanism: str = "lora-fa"
    dataset: str = "digits"
    rank: int = 16
    alpha: float | None = None
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

    def __post_init__(self):
        if self.mechanism not in TRAINING_MECHANISMS:
            raise UsageError(f"unknown mechanism {self.mechanism!r}: use one of {', '.join(TRAINING_MECHANISMS)}")
        self._check_mechanism_options()
        _positive_int("rank", self.rank)
        _positive_int("epochs", self.epochs)
        _positive_int("batch-size", self.batch_size)
        if not isinstance(self.models, int) or self.models < 2 or self.models % 2:
            raise UsageError(f"--models must be an even number >= 2 (half IN, half OUT), got {self.models}")
        if not (isinstance(self.delta, float | int) and 0 < self.delta < 1):
            raise UsageError(f"--delta must be in (0, 1), got {self.delta}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise UsageError(f"--lr must be a positive number, got {self.lr}")
        if self.alpha is not None and not self.alpha > 0:
            raise UsageError(f"--alpha must be positive, got {self.alpha}")
        _one_of("design", self.design, DESIGNS)
        _one_of("precision", self.precision, PRECISIONS)
        if self.null and self.design != "canary":
            raise UsageError("--null applies to the canary design only")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise UsageError(f"--seed must be a non-negative integer, got {self.seed}")

    def _check_mechanism_options(self) -> None:
        """Each mechanism option only where it applies; unset σ and C take their documented defaults, so that
        the stored config (and its hash) says which values were used.
        """
        name = self.mechanism
        for option, value, applies in (
            ("noise", self.noise, NOISY_MECHANISMS),
            ("clip", self.clip, CLIPPED_MECHANISMS),
            ("denoise", self.denoise, DENOISABLE_MECHANISMS),
            ("resample-projection", self.resample_projection, PROJECTION_MECHANISMS),
        ):
            if value not in (None, False) and name not in applies:
                raise UsageError(f"--{option} does not apply to mechanism {name!r}; it applies to {', '.join(applies)}")
        if name in NOISY_MECHANISMS and self.noise is None:
            object.__setattr__(self, "noise", DEFAULT_NOISE)
        if name in CLIPPED_MECHANISMS and self.clip is None:
            object.__setattr__(self, "clip", DEFAULT_CLIP)
        if self.noise is not None:
            check_noise_and_clip(self.noise, self.clip, self.denoise)

    def canonical_hash(self) -> str:
        """SHA-256 of the canonical JSON of every field."""
        return hashlib.sha256(json.dumps(dataclasses.asdict(self), sort_keys=True).encode()).hexdigest()

    def differences(self, other: CampaignConfig) -> list[str]:
        """``field: mine → other`` for each field that differs."""
        mine, theirs = dataclasses.asdict(self), dataclasses.asdict(other)
        return [f"{k}: {mine[k]!r} → {theirs[k]!r}" for k in mine if mine[k] != theirs[k]]


@dataclass(frozen=True)
class Execution:
    """How a campaign runs; none of it changes a score (one torch thread per worker, whatever the count).

    ``chunk_size=None`` picks it: 128 models on CPU, from free memory on CUDA. ``backend="dask"`` runs chunks on
    a dask cluster through joblib (``scheduler`` = its address; None starts a local cluster).
    """

    device: str = "auto"
    chunk_size: int | None = None
    workers: int | None = None  # None: one per CPU core (CPU) or per GPU (CUDA)
    backend: str = "loky"
    scheduler: str | None = None
    progress: bool = True

    def __post_init__(self):
        _one_of("device", self.device, DEVICES)
        _one_of("backend", self.backend, BACKENDS)
        if self.chunk_size is not None:
            _positive_int("chunk-size", self.chunk_size)
        if self.workers is not None:
            _positive_int("workers", self.workers)


def check_noise_and_clip(noise: float, clip: float | None, denoise: bool = False) -> None:
    """σ finite and >= 0; C (None: no clipping) > 0, and C = inf only with σ = 0 (σC would be infinite);
    denoising only with noise.
    """
    if denoise and noise == 0:
        raise UsageError("--denoise needs --noise > 0: without noise there is nothing to denoise")
    if isinstance(noise, bool) or not isinstance(noise, float | int) or not (math.isfinite(noise) and noise >= 0):
        raise UsageError(f"--noise must be a finite number >= 0, got {noise}")
    if clip is None:
        return
    if isinstance(clip, bool) or not isinstance(clip, float | int) or not clip > 0 or (math.isinf(clip) and noise > 0):
        raise UsageError(f"--clip must be a number > 0 (inf only with --noise 0), got {clip}")


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"--{name} must be a positive integer, got {value}")


def _one_of(name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UsageError(f"--{name} must be one of {', '.join(choices)}, got {value!r}")


def _accepts(annotation: str, value) -> bool:
    """Does ``value`` (as TOML parses it) fit a field annotated ``annotation`` (e.g. "float | None")?"""
    kinds = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}
    for option in annotation.replace(" ", "").split("|"):
        if option == "None" and value is None:
            return True
        if option in kinds and isinstance(value, kinds[option]) and not (option != "bool" and isinstance(value, bool)):
            return True
    return False


def from_mapping(values: dict, source: str = "config") -> tuple[CampaignConfig, Execution]:
    """Campaign and execution settings from flat ``key = value`` pairs (a TOML file, or CLI flags).

    Keys are the field names of :class:`CampaignConfig` and :class:`Execution` (``-`` and ``_`` both work);
    an unknown key or a value of the wrong type is an error naming the key.
    """
    fields = {f.name: (cls, f.type) for cls in (CampaignConfig, Execution) for f in dataclasses.fields(cls)}
    chosen: dict[type, dict] = {CampaignConfig: {}, Execution: {}}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name not in fields:
            raise UsageError(f"{source}: unknown key {key!r}; known keys: {', '.join(sorted(fields))}")
        cls, annotation = fields[name]
        if not _accepts(annotation, value):
            raise UsageError(f"{source}: key {key!r} must be of type {annotation}, got {value!r}")
        chosen[cls][name] = float(value) if annotation.startswith("float") and value is not None else value
    return CampaignConfig(**chosen[CampaignConfig]), Execution(**chosen[Execution])


def load_toml(path) -> dict:
    """The flat table of a campaign TOML file."""
    import tomllib

    try:
        with open(path, "rb") as handle:
            table = tomllib.load(handle)
    except FileNotFoundError:
        raise UsageError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"config file {path} is not valid TOML: {exc}") from None
    nested = [key for key, value in table.items() if isinstance(value, dict)]
    if nested:
        raise UsageError(f"config file {path}: tables are not supported ({', '.join(nested)}); use flat keys")
    return table

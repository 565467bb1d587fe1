"""A campaign's configuration: every knob of an audit, validated once, hashed canonically."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass

from dpaudit.errors import UsageError

MECHANISMS = ("none", "lora-fa")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class CampaignConfig:
    """One membership-inference campaign ([W] App. F.1 protocol): what is trained, how often, how it is judged.

    ``models`` shadow models: half IN (trained with the canary), half OUT. ``null=True`` keeps
    the canary out of every model (a null campaign: any ε > 0 it reports is a false positive).
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
    device: str = "auto"
    chunk_size: int = 128
    null: bool = False

    def __post_init__(self):
        if self.mechanism not in MECHANISMS:
            raise UsageError(f"unknown mechanism {self.mechanism!r}: use one of {', '.join(MECHANISMS)}")
        _positive_int("rank", self.rank)
        _positive_int("epochs", self.epochs)
        _positive_int("batch-size", self.batch_size)
        _positive_int("chunk-size", self.chunk_size)
        if not isinstance(self.models, int) or self.models < 2 or self.models % 2:
            raise UsageError(f"--models must be an even number >= 2 (half IN, half OUT), got {self.models}")
        if not (isinstance(self.delta, float | int) and 0 < self.delta < 1):
            raise UsageError(f"--delta must be in (0, 1), got {self.delta}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise UsageError(f"--lr must be a positive number, got {self.lr}")
        if self.alpha is not None and not self.alpha > 0:
            raise UsageError(f"--alpha must be positive, got {self.alpha}")
        if self.device not in DEVICES:
            raise UsageError(f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise UsageError(f"--seed must be a non-negative integer, got {self.seed}")

    def canonical_hash(self) -> str:
        """SHA-256 of the fields that change results (device and chunking do not)."""
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("device", "chunk_size")}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _positive_int(name: str, value) -> None:
    if not isinstance(value, int) or value < 1:
        raise UsageError(f"--{name} must be a positive integer, got {value}")

"""Datasets for shadow training: embedded (digits, breast cancer, synthetic) and CIFAR-10 from a local copy.

Every dataset comes as a :class:`Dataset` with three fixed parts:

* ``public``: pretrains the base model (the "public pre-trained model" of [W] Sec. 2);
* ``private``: the fine-tuning pool the audited mechanism trains on;
* ``test``: utility (test accuracy) only.

The split depends on the dataset alone (a fixed seed), never on the campaign seed, so that every campaign on
a dataset audits the same private pool. Features are standardised with the public part's statistics.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpaudit.errors import UsageError

# Fractions (public, private); the rest is test. Fixed: the split is part of the dataset's identity.
_SPLIT = (0.4, 0.4)
_SPLIT_SEED = 20260101

CIFAR10_RECORD_BYTES = 1 + 3 * 32 * 32
_CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
_CIFAR10_TEST_FILE = "test_batch.bin"


@dataclass(frozen=True)
class Split:
    """Features ``x`` (n, *input_shape) float32 and integer labels ``y`` (n,)."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True)
class Dataset:
    name: str
    public: Split
    private: Split
    test: Split
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.private.x.shape[1:])

    def fingerprint(self) -> str:
        """SHA-256 of every array: a campaign stores it and refuses to resume on different data."""
        digest = hashlib.sha256(self.name.encode())
        for part in (self.public, self.private, self.test):
            for array in (part.x, part.y):
                digest.update(np.ascontiguousarray(array).tobytes())
        return digest.hexdigest()


def _standardised_split(name: str, x: np.ndarray, y: np.ndarray, num_classes: int) -> Dataset:
    order = np.random.default_rng(_SPLIT_SEED).permutation(len(y))
    n_public = int(_SPLIT[0] * len(y))
    n_private = int(_SPLIT[1] * len(y))
    public, private, test = np.split(order, [n_public, n_public + n_private])
    # Per-feature statistics of the public part only: the private pool must not shape preprocessing.
    axes = (0,) if x.ndim == 2 else (0, 2, 3)
    mean = x[public].mean(axis=axes, keepdims=True)
    std = x[public].std(axis=axes, keepdims=True)
    std[std == 0] = 1.0
    z = ((x - mean) / std).astype(np.float32)
    y = y.astype(np.int64)
    return Dataset(
        name, Split(z[public], y[public]), Split(z[private], y[private]), Split(z[test], y[test]), num_classes
    )


def digits() -> Dataset:
    """scikit-learn's 8×8 digits (1797 images, 64 features, 10 classes), embedded in the package."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return _standardised_split("digits", bunch.data, bunch.target, 10)


def breast_cancer() -> Dataset:
    """scikit-learn's Wisconsin breast cancer (569 examples, 30 features, 2 classes)."""
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    return _standardised_split("breast-cancer", bunch.data, bunch.target, 2)


def synthetic(n: int = 2000, dim: int = 32, num_classes: int = 4, separation: float = 3.0, seed: int = 0) -> Dataset:
    """Gaussian mixture: class c has mean ``separation · e_c``-like random centre, identity covariance."""
    if n < 10 or dim < 1 or num_classes < 2 or separation < 0:
        raise UsageError("synthetic data needs n >= 10, dim >= 1, num_classes >= 2 and separation >= 0")
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(num_classes, dim))
    centres *= separation / np.linalg.norm(centres, axis=1, keepdims=True)
    y = rng.integers(num_classes, size=n)
    x = centres[y] + rng.normal(size=(n, dim))
    return _standardised_split(f"synthetic-n{n}-d{dim}-c{num_classes}-s{separation:g}-seed{seed}", x, y, num_classes)


def _read_cifar10_file(path: Path) -> tuple[np.ndarray, np.ndarray]:
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % CIFAR10_RECORD_BYTES:
        raise UsageError(
            f"{path} is not a CIFAR-10 binary batch: {raw.size} bytes is not a multiple of "
            f"{CIFAR10_RECORD_BYTES} (1 label byte + 3072 pixel bytes); re-download the binary version"
        )
    records = raw.reshape(-1, CIFAR10_RECORD_BYTES)
    if records[:, 0].max() > 9:
        raise UsageError(f"{path} has labels above 9: not CIFAR-10's binary format")
    return records[:, 1:].reshape(-1, 3, 32, 32).astype(np.float32) / 255.0, records[:, 0].astype(np.int64)


def cifar10(folder: str | Path, limit: int | None = None) -> Dataset:
    """CIFAR-10 from the *binary* version in ``folder`` (``data_batch_1.bin`` … ``test_batch.bin``).

    Read with numpy only (no torchvision). ``limit`` keeps the first ``limit`` training images (CPU-scale runs).
    The fixed public/private/test split of every dataset applies to the training images plus the test batch.
    """
    folder = Path(folder)
    files = [folder / name for name in (*_CIFAR10_TRAIN_FILES, _CIFAR10_TEST_FILE)]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise UsageError(
            f"CIFAR-10 binary files missing in {folder}: {', '.join(missing)}; point "
            "--dataset cifar10:PATH at the extracted 'cifar-10-batches-bin' folder"
        )
    parts = [_read_cifar10_file(f) for f in files]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    if limit is not None:
        x, y = x[:limit], y[:limit]
    return _standardised_split("cifar10", x, y, 10)


def load(spec: str) -> Dataset:
    """Dataset from its CLI name: ``digits``, ``breast-cancer``, ``synthetic`` or ``cifar10:PATH``."""
    if spec == "digits":
        return digits()
    if spec == "breast-cancer":
        return breast_cancer()
    if spec == "synthetic":
        return synthetic()
    if spec.startswith("cifar10:"):
        return cifar10(spec.split(":", 1)[1])
    raise UsageError(f"unknown dataset {spec!r}: use digits, breast-cancer, synthetic or cifar10:PATH")

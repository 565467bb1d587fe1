"""Datasets for shadow training: embedded (digits, breast cancer, synthetic) and CIFAR-10 from a local copy.

Every dataset comes as a :class:`Dataset` with three fixed parts:

* ``public``: pretrains the base model (the "public pre-trained model" of [W] Sec. 2);
* ``private``: the fine-tuning pool the audited mechanism trains on;
* ``test``: utility (test accuracy) only.

The split depends on the dataset alone (a fixed seed), never on the campaign seed, so that every campaign on
a dataset audits the same private pool. Features are standardised with the public part's statistics.

A user's own data (:func:`from_npz`, :func:`from_csv`) is checked as it is read: every defect (a missing array, a
shape mismatch, a NaN feature, one that standardises beyond float32's range, a label that is not a whole number or
beyond 2^53, too small a split) is a one-line :class:`UsageError` naming the file and the fix. Byte-level text
(``text``, ``text:PATH``) is in :mod:`.text`; the unsplit training sets of ``dpaudit audit-training`` in
:mod:`.training_sets`.
"""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, ClassVar

import numpy as np

from accountants import validation as check
from dpaudit.errors import UsageError
from dpaudit.files import open_regular

# Fractions (public, private); the rest is test. Fixed: the split is part of the dataset's identity.
_SPLIT = (0.4, 0.4)
_SPLIT_SEED = 20260101
# Examples every part needs: the public part's standard deviation standardises the features, each shadow model
# trains on some private examples and leaves others out, and test accuracy needs more than one example.
MIN_SPLIT_EXAMPLES = 2
# The arrays of an .npz holding its own public/private/test split.
SPLIT_KEYS = ("x_public", "y_public", "x_private", "y_private", "x_test", "y_test")

CIFAR10_RECORD_BYTES = 1 + 3 * 32 * 32
_CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
_CIFAR10_TEST_FILE = "test_batch.bin"


@dataclass(frozen=True)
class Split:
    """Features ``x`` (n, *input_shape), float32 or int64 token ids (:func:`from_npz`); integer labels ``y`` (n,)."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True)
class Dataset:
    """A dataset's three parts (module docstring); ``task`` says what a model learns from it.

    ``classification``: y holds class labels in 0..num_classes-1; ``next-token``: y holds the next-token targets
    of each sequence in x (:class:`dpaudit.data.text.TextDataset`), ``num_classes`` the vocabulary size.
    """

    task: ClassVar[str] = "classification"

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


def split_indices(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of the public, private and test parts of n examples: dpaudit's fixed 40/40/20 split (a fixed seed)."""
    order = np.random.default_rng(_SPLIT_SEED).permutation(n)
    n_public = int(_SPLIT[0] * n)
    n_private = int(_SPLIT[1] * n)
    public, private, test = np.split(order, [n_public, n_public + n_private])
    return public, private, test


def _standardised_split(name: str, x: np.ndarray, y: np.ndarray, num_classes: int) -> Dataset:
    public, private, test = split_indices(len(y))
    return _standardised(name, ((x[public], y[public]), (x[private], y[private]), (x[test], y[test])), num_classes)


def _standardised(name: str, parts, num_classes: int) -> Dataset:
    """The Dataset of the (x, y) parts (public, private, test), features standardised by the public part.

    Raises:
        UsageError: a standardised feature beyond float32's range (the models' precision), naming it.
    """
    (x_public, _), *_ = parts
    # Per-feature statistics of the public part only: the private pool must not shape preprocessing. Images
    # (N, C, H, W) per channel.
    axes = (0, 2, 3) if x_public.ndim == 4 else (0,)
    # Each feature is first divided by the power of two that puts the public part's largest |value| in [½, 1):
    # beyond ~1e154 the squares in the standard deviation overflow float64 (and every standardised value became
    # 0). Dividing by a power of two is exact, so any other data standardises to the same values bit for bit.
    _, exponent = np.frexp(np.abs(x_public).max(axis=axes, keepdims=True))
    scale = np.ldexp(np.ones((), x_public.dtype), exponent)
    scaled = x_public / scale
    mean = scaled.mean(axis=axes, keepdims=True)
    std = scaled.std(axis=axes, keepdims=True)
    std = np.where(std == 0, 1 / scale, std)  # a constant feature is only centred, in its own units
    splits: list[Split] = []
    for part, (x, y) in zip(("public", "private", "test"), parts):
        with np.errstate(over="ignore"):  # found below, naming the feature
            standardised = (x / scale - mean) / std
        beyond = ~(np.abs(standardised) <= np.finfo(np.float32).max)
        if beyond.any():
            at = tuple(int(i) for i in np.unravel_index(np.argmax(beyond), beyond.shape))
            feature = at[1] if len(at) == 2 else at[1:]
            raise UsageError(
                f"{name}: feature {feature} of the {part} part is {float(x[at]):.3g}, {float(standardised[at]):.3g}"
                " standard deviations from the public part's mean, beyond float32's range: rescale or clip that"
                " feature"
            )
        splits.append(Split(standardised.astype(np.float32), y.astype(np.int64)))
    public, private, test = splits
    return Dataset(name, public, private, test, num_classes)


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
    with _opened(path, f"cifar10:{path.parent}") as handle:
        raw = np.fromfile(handle, dtype=np.uint8)
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
    missing = [f.name for f in files if not f.exists()]  # what stands there instead is named as it is read
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


def _opened(path: Path, spec: str, option: str = "--dataset") -> BinaryIO:
    """The data file ``path`` (of ``option spec``) opened for reading; a usage error if it is missing or no file."""
    try:
        return open_regular(path, f"{option} {spec} reads a regular file there; copy the data into one")
    except FileNotFoundError:
        raise UsageError(f"{option} {spec}: no file {path}; give the path of an existing file") from None
    except OSError as exc:
        raise UsageError(f"{option} {spec}: cannot read {path} ({exc.strerror or exc}); make it readable") from None


def _npz_arrays(path: Path, spec: str, option: str = "--dataset") -> dict[str, np.ndarray]:
    """Every array of the .npz archive ``path`` (of ``option spec``); a usage error if it is not one."""
    with _opened(path, spec, option) as handle:
        try:
            archive = np.load(handle, allow_pickle=False)
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise ValueError("it holds a single array")
            with archive:
                return {key: archive[key] for key in archive.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise UsageError(
                f"{path} is not an .npz archive of numeric arrays ({reason}); write it with numpy.savez(path, x=...,"
                " y=...)"
            ) from None


def from_npz(path: str | Path, tokens: bool = False) -> Dataset:
    """A user's arrays from an .npz archive: ``x`` and ``y`` (split by :func:`split_indices`) or :data:`SPLIT_KEYS`.

    ``x``: (n, *input_shape) numeric features (e.g. (n, d) vectors, (n, C, H, W) images); ``y``: (n,) whole-number
    class labels, renumbered as in :func:`_classes`. Written e.g. by ``numpy.savez(path, x=x, y=y)``. ``tokens``:
    ``x`` holds token ids for a model whose input is an embedding, kept as int64, never standardised
    (:func:`_token_ids`).
    """
    path = Path(path)
    arrays = _npz_arrays(path, f"npz:{path}")
    keys = set(arrays)
    split_keys = keys & set(SPLIT_KEYS)
    if {"x", "y"} <= keys and not split_keys:
        if np.ndim(arrays["y"]) == 2:  # what a causal language model learns from: the next token of every position
            raise UsageError(
                f"{path}: y has shape {arrays['y'].shape}, next-token targets rather than (n,) class labels: give it"
                f" as --dataset tokens:{path} (docs/models.md §6)"
            )
        return _split_user_arrays(f"npz:{path}", path, arrays, tokens)
    if split_keys == set(SPLIT_KEYS) and not keys & {"x", "y"}:
        parts = [_checked_part(path, arrays, f"x_{part}", f"y_{part}") for part in ("public", "private", "test")]
        if tokens:
            parts = [
                (_token_ids(path, f"x_{part}", x), y) for part, (x, y) in zip(("public", "private", "test"), parts)
            ]
        _check_split_sizes(path, [len(y) for _, y in parts], None)
    else:
        missing = sorted(({"x", "y"} if not split_keys else set(SPLIT_KEYS)) - keys)
        lacking = f" (missing {', '.join(missing)})" if missing else ""
        raise UsageError(
            f"{path} holds arrays {', '.join(sorted(keys)) or 'none'}{lacking}: it must hold either x and y (split"
            f" 40/40/20 by dpaudit) or all of {', '.join(SPLIT_KEYS)}, not both"
        )
    return _user_dataset(f"npz:{path}", path, parts, tokens)


def from_arrays(x: np.ndarray, y: np.ndarray, name: str = "arrays", tokens: bool = False) -> Dataset:
    """A user's arrays ``x`` (n, *input_shape) and ``y`` (n,), split and checked as the x and y of :func:`from_npz`."""
    return _split_user_arrays(name, Path(name), {"x": x, "y": y}, tokens)


def _split_user_arrays(name: str, path: Path, arrays: dict[str, np.ndarray], tokens: bool = False) -> Dataset:
    """``arrays["x"]`` and ``arrays["y"]`` checked, split by :func:`split_indices`, standardised unless ``tokens``."""
    x, y = _checked_part(path, arrays, "x", "y")
    if tokens:
        x = _token_ids(path, "x", x)
    public, private, test = split_indices(len(y))
    _check_split_sizes(path, [len(rows) for rows in (public, private, test)], len(y))
    return _user_dataset(name, path, [(x[rows], y[rows]) for rows in (public, private, test)], tokens)


def from_csv(path: str | Path) -> Dataset:
    """A user's table: a ``label`` column of whole-number classes, every other column a numeric feature (pandas).

    Split by :func:`split_indices` like an .npz's ``x`` and ``y``.
    """
    path = Path(path)
    x, y = _checked_part(path, _csv_arrays(path, f"csv:{path}"), "features", "label")
    rows = split_indices(len(y))
    _check_split_sizes(path, [len(part) for part in rows], len(y))
    return _user_dataset(f"csv:{path}", path, [(x[part], y[part]) for part in rows])


def _csv_arrays(path: Path, spec: str, option: str = "--dataset") -> dict[str, np.ndarray]:
    """A CSV table's ``features`` (every column but ``label``, numeric) and ``label``; a usage error otherwise."""
    import pandas as pd

    try:
        with _opened(path, spec, option) as handle:
            # the header as written: pandas renames a repeated column (label, label → label, label.1), which would
            # make a second label column a feature
            header = pd.read_csv(handle, header=None, nrows=1, dtype=str).iloc[0].tolist()
            handle.seek(0)
            frame = pd.read_csv(handle)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UsageError(
            f"{path} is not a readable CSV table ({reason}); write it as comma-separated UTF-8 text"
        ) from None
    repeated = sorted({str(name) for name in header if header.count(name) > 1})
    if repeated:
        raise UsageError(
            f"{path}: column(s) {', '.join(map(repr, repeated[:5]))} appear more than once in the header; give every"
            " column its own name (one 'label' column)"
        )
    if "label" not in frame.columns:
        raise UsageError(
            f"{path} has no 'label' column (columns: {', '.join(map(str, frame.columns[:10]))}); name the class column"
            " 'label'"
        )
    features = [column for column in frame.columns if column != "label"]
    text = [str(column) for column in features if not pd.api.types.is_numeric_dtype(frame[column])]
    if not features or text:
        raise UsageError(
            f"{path}: every column but 'label' must be a numeric feature; "
            + (f"non-numeric column(s): {', '.join(text[:5])}; encode or drop them" if text else "there is none")
        )
    return {"features": frame[features].to_numpy(), "label": frame["label"].to_numpy()}


def _checked_part(path: Path, arrays: dict[str, np.ndarray], x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
    """Features (n, ...) float64, all finite, and labels (n,) int64 whole numbers, one per example."""
    x = np.asarray(arrays[x_key])
    if x.ndim < 2:
        raise UsageError(
            f"{path}: {x_key} has shape {x.shape}; it must be (examples, features...): reshape a single feature"
            " column to (n, 1)"
        )
    x = check.finite_array(f"{path}: {x_key}", x, ndim=x.ndim)
    y = check.class_labels(f"{path}: {y_key}", arrays[y_key])
    if len(x) != len(y):
        raise UsageError(f"{path}: {x_key} has {len(x)} examples but {y_key} has {len(y)} labels; give one per example")
    return x, y


def _check_split_sizes(path: Path, sizes: list[int], total: int | None) -> None:
    small = [(part, size) for part, size in zip(("public", "private", "test"), sizes) if size < MIN_SPLIT_EXAMPLES]
    if small:
        part, size = small[0]
        how = (
            f"provide at least {smallest_splittable()} examples (the fixed 40/40/20 split)"
            if total is not None
            else f"put at least {MIN_SPLIT_EXAMPLES} examples in x_{part}"
        )
        raise UsageError(
            f"{path}: the {part} part has {size} example(s); every part needs at least {MIN_SPLIT_EXAMPLES} (the public"
            f" part's standard deviation standardises features, shadow models leave private examples out, test"
            f" accuracy): {how}"
        )


def smallest_splittable() -> int:
    """The fewest examples whose fixed split (:func:`split_indices`) gives every part MIN_SPLIT_EXAMPLES."""
    n = MIN_SPLIT_EXAMPLES
    while min(len(part) for part in split_indices(n)) < MIN_SPLIT_EXAMPLES:
        n += 1
    return n


def _user_dataset(name: str, path: Path, parts: list[tuple[np.ndarray, np.ndarray]], tokens: bool = False) -> Dataset:
    shapes = {x.shape[1:] for x, _ in parts}
    if len(shapes) > 1:
        described = ", ".join(f"{part} {x.shape[1:]}" for part, (x, _) in zip(("public", "private", "test"), parts))
        raise UsageError(f"{path}: the parts' feature shapes differ ({described}); give every part the same features")
    classes = _classes(path, [y for _, y in parts])
    if tokens:
        public, private, test = (Split(x, np.searchsorted(classes, y).astype(np.int64)) for x, y in parts)
        return Dataset(name, public, private, test, len(classes))
    return _standardised(name, [(x, np.searchsorted(classes, y)) for x, y in parts], len(classes))


def _token_ids(path: Path, key: str, x: np.ndarray) -> np.ndarray:
    """``x`` (the array ``key``) as int64 token ids, never standardised; a usage error unless whole numbers >= 0."""
    bad = ~((x >= 0) & (x == np.floor(x)) & (x < 2**63))
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise UsageError(
            f"{path}: {key}{list(at)} is {float(x[at]):g}, but the model's input is an embedding of token ids: give"
            " whole numbers from 0 to its vocabulary size - 1"
        )
    return x.astype(np.int64)


def _classes(path: Path, labels: list[np.ndarray]) -> np.ndarray:
    """The sorted distinct labels of all parts: class c is the c-th of them.

    Labels 0..C-1 (each present somewhere) stay as they are; others are renumbered in order, e.g. {-1, 1} → {0, 1}.
    """
    classes = np.unique(np.concatenate(labels))
    if len(classes) < 2:
        raise UsageError(
            f"{path}: every label is {classes[0] if len(classes) else 'absent'}; a classifier needs 2+ classes"
        )
    return classes

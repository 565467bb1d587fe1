"""The training set of ``dpaudit audit-training``: the arrays the user's own training code gets, unsplit.

Unlike a campaign's dataset (:mod:`dpaudit.data`: a fixed public/private/test split, standardised features) it is
used as it is: classification data (``npz:PATH``, ``csv:PATH``) or next-token data, token windows in the layout of
:class:`dpaudit.data.text.TextDataset` (``text``, ``text:PATH``, or an .npz whose ``y`` is (n, L) like its ``x``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpaudit import data
from dpaudit.data import text
from dpaudit.errors import UsageError


def training_set(spec: str, option: str = "--dataset") -> tuple[np.ndarray, np.ndarray]:
    """A training set as the user's own training code takes it: ``npz:PATH``, ``csv:PATH``, ``text`` or ``text:PATH``.

    Unlike a campaign's dataset it is neither split nor standardised: the training code gets exactly these arrays.
    Classification (an .npz's ``x`` and (n,) ``y``, or a CSV): features as float32, labels as int64 whole numbers.
    Next-token data (:func:`token_windows`): an .npz whose ``y`` is (n, L) like its ``x``, or byte-level text, every
    window of it (:func:`dpaudit.data.text.training_windows`; the embedded corpus for ``text``).

    Args:
        spec: ``npz:PATH``, ``csv:PATH``, ``text`` or ``text:PATH``.
        option: the option that named it, for error messages.

    Returns:
        ``(x, y)``: (n, ...) float32 features and (n,) int64 labels, or (n, L) int64 token ids and (n, L) int64
        next-token targets; any count n ≥ 1.
    """
    kind, _, name = spec.partition(":")
    if kind == "text":
        return text.training_windows(name or None)
    if kind not in ("npz", "csv") or not name:
        raise UsageError(
            f"{option} must be npz:PATH (arrays x and y), csv:PATH (a label column), text or text:PATH (byte windows),"
            f" got {spec!r}"
        )
    path = Path(name)
    arrays = data._npz_arrays(path, spec, option) if kind == "npz" else data._csv_arrays(path, spec, option)
    keys = ("x", "y") if kind == "npz" else ("features", "label")
    missing = [key for key in keys if key not in arrays]
    if missing:
        raise UsageError(f"{path} lacks array(s) {', '.join(missing)}: write it with numpy.savez(path, x=..., y=...)")
    if kind == "npz" and np.ndim(arrays["y"]) > 1:
        return token_windows(str(path), arrays["x"], arrays["y"])
    x, y = data._checked_part(path, arrays, *keys)
    return x.astype(np.float32), y


def token_windows(name: str, x, y) -> tuple[np.ndarray, np.ndarray]:
    """Next-token training data, checked: ``x`` (n, L) token ids and ``y`` (n, L) their next tokens, int64 ≥ 0.

    The layout of :class:`dpaudit.data.text.TextDataset`: ``y[i, t]`` is the token that follows ``x[i, t]``. A ``y``
    of another shape is neither this nor (n,) class labels: a one-line usage error naming ``name``.
    """
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim != 2 or y.shape != x.shape or not x.shape[1]:
        raise UsageError(
            f"{name}: y must be (n,) class labels (classification) or (n, L) next-token targets shaped like x's"
            f" (n, L) token ids; got x {x.shape} and y {y.shape}"
        )
    for key, array in (("x", x), ("y", y)):
        if not np.issubdtype(array.dtype, np.integer) or (array.size and array.min() < 0):
            raise UsageError(
                f"{name}: next-token {key} must hold token ids (whole numbers >= 0, an integer dtype); got dtype"
                f" {array.dtype}{f' with {array.min()}' if np.issubdtype(array.dtype, np.integer) else ''}"
            )
    return x.astype(np.int64), y.astype(np.int64)


def training_classes(spec: str, x: np.ndarray, y: np.ndarray) -> int:
    """The ``num_classes`` a model factory gets for :func:`training_set` ``(x, y)`` of ``spec``.

    Classification: the largest label + 1. Next-token data: the vocabulary, 256 (bytes) for text, else the largest
    token id + 1.
    """
    if y.ndim == 1:
        return int(y.max()) + 1
    if spec.partition(":")[0] == "text":
        return text.VOCABULARY
    return int(max(x.max(), y.max())) + 1

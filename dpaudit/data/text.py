"""Byte-level text for next-token audits: an embedded corpus, fixed-length sequences, secret canaries.

A :class:`TextDataset` is a :class:`dpaudit.data.Dataset` whose examples are windows of ``L + 1`` consecutive
bytes, disjoint, cut from the corpus in order: ``x`` (n, L) int64 holds bytes 0..L-1 of each window and ``y``
(n, L) int64 bytes 1..L, the same window shifted by one, so ``y[i, t]`` is the next-token target of position t
(``num_classes`` = 256, the vocabulary). Windows are split into public/private/test by dpaudit's fixed rule
(:func:`dpaudit.data.split_indices`), as every dataset is.

``--dataset text`` is the first 64 KiB of the reference documentation of Python's ``pydoc_data.topics`` (about
466 kB in all, shipped with Python, no download; its text, and so the fingerprint, can change with the Python
version): 1008 sequences of 65 bytes, 403 private ones, so that a 64-model campaign of 10 epochs runs in minutes on
two cores. ``text:PATH`` is a UTF-8 file, all of it. ``dpaudit audit-training --dataset text`` trains on every window,
unsplit (:func:`training_windows`).

Canaries (Carlini et al. 2019, "The Secret Sharer", arXiv 1802.08232): :func:`secret_sequences` draws random
secrets in a format such as ``"my secret number is "`` + 9 digits; the exposure of a secret (its rank among all
candidates of the format by log-likelihood, :mod:`attacks.exposure`) needs :func:`log_likelihoods` of the
candidates (:func:`candidates` enumerates a small space). A campaign inserts secrets as :func:`secret_windows`
and scores every sequence, a secret's window or any other, by :func:`sequence_summaries` of all its bytes.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from accountants import validation as check
from dpaudit import data, models
from dpaudit.errors import UsageError

SEQUENCE_LENGTH = 64
VOCABULARY = 256  # bytes
EMBEDDED_BYTES = 2**16  # of the corpus in --dataset text (module docstring)
SECRET_PREFIX = b"my secret number is "
SECRET_ALPHABET = b"0123456789"
SECRET_DIGITS = 9


@dataclass(frozen=True)
class TextDataset(data.Dataset):
    """A dataset of byte sequences (module docstring): x (n, L) and y (n, L) int64, y the next-token targets."""

    task: ClassVar[str] = "next-token"

    @property
    def sequence_length(self) -> int:
        return int(self.private.x.shape[1])


def corpus() -> bytes:
    """Python's ``pydoc_data.topics`` as UTF-8: every topic's text in sorted topic order, as one byte string."""
    from pydoc_data.topics import topics

    return "".join(topics[name] for name in sorted(topics)).encode()


def sequences(text: bytes, length: int = SEQUENCE_LENGTH) -> tuple[np.ndarray, np.ndarray]:
    """(x, y): the disjoint (length + 1)-byte windows of ``text`` in order, x its first and y its last L bytes."""
    length = check.count("sequence length", length)
    windows = np.frombuffer(text, dtype=np.uint8)[: len(text) // (length + 1) * (length + 1)].reshape(-1, length + 1)
    windows = windows.astype(np.int64)
    return windows[:, :-1].copy(), windows[:, 1:].copy()


def from_bytes(name: str, text: bytes, length: int = SEQUENCE_LENGTH) -> TextDataset:
    """The :class:`TextDataset` of ``text``, split by the fixed rule; ``name`` enters the fingerprint."""
    x, y = sequences(text, length)
    parts = [data.Split(x[rows], y[rows]) for rows in data.split_indices(len(x))]
    if min(map(len, parts)) < data.MIN_SPLIT_EXAMPLES:
        needed = data.smallest_splittable()
        raise UsageError(
            f"{name} has {len(text)} bytes, {len(x)} sequences of {length + 1}: every part of the fixed 40/40/20 "
            f"split needs {data.MIN_SPLIT_EXAMPLES}, so give at least {needed * (length + 1)} bytes of text"
        )
    public, private, test = parts
    return TextDataset(name, public, private, test, num_classes=VOCABULARY)


def load(path: str | None = None, length: int = SEQUENCE_LENGTH) -> TextDataset:
    """``--dataset text`` (path None: the embedded corpus) or ``text:PATH`` (a UTF-8 file)."""
    name, raw = _text(path)
    return from_bytes(name, raw, length)


def training_windows(path: str | None = None, length: int = SEQUENCE_LENGTH) -> tuple[np.ndarray, np.ndarray]:
    """(x, y): every window of ``--dataset text`` (path None) or ``text:PATH``, unsplit, as :func:`sequences` cuts them.

    The training set of ``dpaudit audit-training --dataset text``: your training code gets all of the text's windows
    (1008 of the embedded corpus), not the private part of a campaign's split.
    """
    name, raw = _text(path)
    x, y = sequences(raw, length)
    if not len(x):
        raise UsageError(f"{name} has {len(raw)} bytes: a training window needs {length + 1}; give a longer text")
    return x, y


def _text(path: str | None) -> tuple[str, bytes]:
    """The name and bytes of the embedded corpus (path None) or of the UTF-8 file ``path``."""
    if path is None:
        return "text", corpus()[:EMBEDDED_BYTES]
    file = Path(path)
    with data._opened(file, f"text:{path}") as handle:
        size = os.fstat(handle.fileno()).st_size
        # checked before reading: windows of int64 inputs and targets, and the split's copies of them, take about
        # 40 bytes per byte of text
        check.allocation(f"text:{path} ({size} bytes) cut into int64 windows", 40 * size, "give a shorter text")
        raw = handle.read()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(
            f"{file} is not UTF-8 text (byte {raw[error.start]:#04x} at offset {error.start}); convert it to UTF-8"
        ) from None
    return f"text:{path}", raw


def secret_sequences(
    count: int,
    rng: np.random.Generator,
    prefix: bytes = SECRET_PREFIX,
    alphabet: bytes = SECRET_ALPHABET,
    secret_length: int = SECRET_DIGITS,
) -> np.ndarray:
    """(count, len(prefix) + secret_length) int64 secrets: ``prefix``, then random bytes of ``alphabet``.

    The ``secret_length`` bytes are drawn uniformly (Carlini et al. 2019 Sec. 3: the format and its randomness
    space R, |R| = |alphabet|^secret_length).
    """
    check.count("count", count)
    check.count("secret length", secret_length)
    symbols = np.frombuffer(alphabet, dtype=np.uint8).astype(np.int64)
    secrets = symbols[rng.integers(len(symbols), size=(count, secret_length))]
    return np.concatenate([np.tile(np.frombuffer(prefix, dtype=np.uint8).astype(np.int64), (count, 1)), secrets], 1)


def secret_windows(count: int, rng: np.random.Generator, length: int = SEQUENCE_LENGTH) -> np.ndarray:
    """(count, length + 1) int64 training windows, each a secret of the default format then newlines.

    The secret opens the window, so its likelihood depends on nothing before it; the newlines fill the rest. The
    whole window is the canary (its membership score is the window's log-likelihood) and the format of its
    exposure: candidates differ from it in the 9 random digits only.
    """
    secrets = secret_sequences(count, rng)
    if secrets.shape[1] > length + 1:
        raise UsageError(f"sequences of {length} bytes cannot hold a {secrets.shape[1]}-byte secret: use longer ones")
    return np.concatenate([secrets, np.full((count, length + 1 - secrets.shape[1]), ord("\n"))], 1)


def sequence_summaries(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(..., 2) float64: each sequence's log-likelihood and top-1 accuracy over its T positions.

    ``logits`` (..., T, V) next-token logits, ``targets`` (..., T) the bytes they predict (broadcast: K models'
    logits (K, n, T, V) share the targets (n, T)). The log-likelihood
    ``Σ_t log p(y_t | x_≤t)`` is the membership signal (a sequence's "true-label log-probability") and orders the
    candidates of a secret's exposure (Carlini et al. 2019); the accuracy, the fraction of positions where the most
    likely byte is the target, is the model's utility. A next-token campaign stores these two numbers instead of
    the logits.
    """
    targets = targets.expand(logits.shape[:-1])
    # The softmax in the logits' precision (fp32: 1e-7 relative per byte), the sum over bytes in float64.
    chosen = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1).double()
    correct = (logits.argmax(-1) == targets).double()
    return torch.stack([chosen.sum(-1), correct.mean(-1)], -1)


def candidates(prefix: bytes, alphabet: bytes, secret_length: int) -> np.ndarray:
    """Every sequence of the format: the whole space R, for exact exposure on small spaces.

    (|alphabet|^secret_length, len(prefix) + secret_length) int64, in lexicographic order of the alphabet.
    """
    symbols = np.frombuffer(alphabet, dtype=np.uint8).astype(np.int64)
    secrets = np.array(list(itertools.product(symbols, repeat=secret_length)), dtype=np.int64)
    return np.concatenate(
        [np.tile(np.frombuffer(prefix, dtype=np.uint8).astype(np.int64), (len(secrets), 1)), secrets], 1
    )


@torch.no_grad()
def log_likelihoods(model: nn.Module, tokens: np.ndarray, start: int, batch_size: int = 1024) -> np.ndarray:
    """(n,) float64: each sequence's log-likelihood from position ``start`` on, ``Σ_{t ≥ start} log p(x_t | x_<t)``.

    ``model`` maps (n, T) tokens to (n, T, V) next-token logits (position t predicting t + 1); ``start`` is where
    the secret begins after its prefix (``len(prefix) ≥ 1``).
    """
    start = check.integer("start", start, 1, tokens.shape[1] - 1)
    totals = []
    for first in range(0, len(tokens), batch_size):
        batch = torch.from_numpy(tokens[first : first + batch_size])
        totals.append(sequence_summaries(models.forward(model, batch[:, :-1])[:, start - 1 :], batch[:, start:])[:, 0])
    return torch.cat(totals).numpy()

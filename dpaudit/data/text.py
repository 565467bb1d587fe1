"""Text for next-token audits: an embedded corpus, bytes or token ids cut into windows, secret canaries.

A :class:`TextDataset` is a :class:`dpaudit.data.Dataset` whose examples are windows of ``L + 1`` consecutive
tokens, disjoint, cut from the text in order: ``x`` (n, L) int64 holds tokens 0..L-1 of each window and ``y``
(n, L) int64 tokens 1..L, the same window shifted by one, so ``y[i, t]`` is the next-token target of position t
(``num_classes``: the vocabulary). Windows are split into public/private/test by dpaudit's fixed rule
(:func:`dpaudit.data.split_indices`), as every dataset is. L is ``--window`` (64 by default).

The tokens are bytes (vocabulary 256) unless ``--tokenizer`` names a tokenizer on disk (:func:`tokenizer`): the
text is then encoded by it, the vocabulary its size. ``tokens:PATH.npz`` gives token ids already
(:func:`from_token_npz`; docs/models.md §6).

``--dataset text`` is the first 64 KiB of the reference documentation of Python's ``pydoc_data.topics`` (about
466 kB in all, shipped with Python, no download; its text, and so the fingerprint, can change with the Python
version): 1008 sequences of 65 bytes, 403 private ones, so that a 64-model campaign of 10 epochs runs in minutes on
two cores. ``text:PATH`` is a UTF-8 file, all of it. ``dpaudit audit-training --dataset text`` trains on every window,
unsplit (:func:`training_windows`).

Canaries (Carlini et al. 2019, "The Secret Sharer", arXiv 1802.08232): :func:`secret_sequences` draws random
secrets in a format (:class:`SecretFormat`) such as ``"my secret number is "`` + 9 digits for bytes, or fixed token
ids then 9 of 10 other ids for token data (:func:`token_secrets`); the exposure of a secret (its rank among all
candidates of the format by log-likelihood, :mod:`attacks.exposure`) needs :func:`log_likelihoods` of the
candidates (:func:`candidates` enumerates a small space). A campaign inserts secrets as :func:`secret_windows`
and scores every sequence, a secret's window or any other, by :func:`sequence_summaries` of all its bytes.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
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
# The secret format of token data (token_secrets): prefix ids, then SECRET_DIGITS of as many symbol ids as bytes
# have digits, then one filler id, all distinct, drawn from the vocabulary by this fixed seed (the format is part
# of the data's identity, never of a campaign's seed).
_TOKEN_SECRET_PREFIX = 4
_TOKEN_SECRET_SEED = 20261125


@dataclass(frozen=True)
class SecretFormat:
    """A secret's format in token ids (Carlini et al. 2019 Sec. 3).

    ``prefix``, then ``length`` random symbols of ``alphabet`` (the randomness space R, |R| = |alphabet|^length),
    then ``filler`` to the end of its window.
    """

    prefix: tuple[int, ...]
    alphabet: tuple[int, ...]
    length: int
    filler: int

    def check_fits(self, window: int) -> None:
        """A usage error unless a secret fits in a training window of ``window`` + 1 tokens (it opens the window)."""
        tokens = len(self.prefix) + self.length
        if tokens > window + 1:
            raise UsageError(
                f"windows of {window} tokens cannot hold a {tokens}-token secret: give a --window of at least"
                f" {tokens - 1}"
            )


BYTE_SECRETS = SecretFormat(tuple(SECRET_PREFIX), tuple(SECRET_ALPHABET), SECRET_DIGITS, ord("\n"))


def token_secrets(vocabulary: int) -> SecretFormat:
    """The secret format of token data, which has no text to spell a sentence in.

    Like the bytes' (:data:`BYTE_SECRETS`): 4 prefix ids, then 9 symbols of a 10-id alphabet, then a filler id, all
    distinct ids of the vocabulary drawn by a fixed seed, so that |R| = 10^9 as for bytes.
    """
    needed = _TOKEN_SECRET_PREFIX + len(SECRET_ALPHABET) + 1
    if vocabulary < needed:
        raise UsageError(
            f"a vocabulary of {vocabulary} token ids is too small for the secret canaries' format ({needed} distinct"
            " ids): use --design all-examples, or data with a larger vocabulary"
        )
    ids = np.random.default_rng(_TOKEN_SECRET_SEED).choice(vocabulary, needed, replace=False).tolist()
    prefix, alphabet = ids[:_TOKEN_SECRET_PREFIX], ids[_TOKEN_SECRET_PREFIX:-1]
    return SecretFormat(tuple(prefix), tuple(alphabet), SECRET_DIGITS, ids[-1])


@dataclass(frozen=True)
class TextDataset(data.Dataset):
    """A dataset of token windows (module docstring): x (n, L) and y (n, L) int64, y the next-token targets.

    ``tokenized``: the tokens are a tokenizer's ids or given ids (``tokens:PATH``), not bytes; their secret
    canaries then have the format of :func:`token_secrets`.
    """

    task: ClassVar[str] = "next-token"

    tokenized: bool = False

    @property
    def sequence_length(self) -> int:
        return int(self.private.x.shape[1])

    @property
    def secret_format(self) -> SecretFormat:
        """The format of this data's secret canaries: the bytes' sentence, or ids of the vocabulary."""
        return token_secrets(self.num_classes) if self.tokenized else BYTE_SECRETS


def corpus() -> bytes:
    """Python's ``pydoc_data.topics`` as UTF-8: every topic's text in sorted topic order, as one byte string."""
    from pydoc_data.topics import topics

    return "".join(topics[name] for name in sorted(topics)).encode()


def sequences(text: bytes | np.ndarray, length: int = SEQUENCE_LENGTH) -> tuple[np.ndarray, np.ndarray]:
    """(x, y): the disjoint (length + 1)-token windows of ``text`` in order, x its first and y its last L tokens.

    ``text``: bytes, or a 1-D array of token ids.
    """
    length = check.count("sequence length", length)
    tokens = np.frombuffer(text, dtype=np.uint8) if isinstance(text, bytes) else text
    windows = tokens[: len(tokens) // (length + 1) * (length + 1)].reshape(-1, length + 1)
    windows = windows.astype(np.int64)
    return windows[:, :-1].copy(), windows[:, 1:].copy()


def from_bytes(name: str, text: bytes, length: int = SEQUENCE_LENGTH) -> TextDataset:
    """The :class:`TextDataset` of ``text``, split by the fixed rule; ``name`` enters the fingerprint."""
    x, y = sequences(text, length)
    return from_windows(
        name,
        x,
        y,
        VOCABULARY,
        lambda needed: (
            f"{len(text)} bytes, {len(x)} sequences of {length + 1}: every part of the fixed 40/40/20 "
            f"split needs {data.MIN_SPLIT_EXAMPLES}, so give at least {needed * (length + 1)} bytes of text"
        ),
    )


def from_windows(
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    vocabulary: int,
    too_few: Callable[[int], str],
    tokenized: bool = False,
) -> TextDataset:
    """The :class:`TextDataset` of windows ``x``, ``y`` (n, L) int64, split by the fixed rule.

    ``too_few(needed)``: what the data holds and how to give enough, for the usage error where a part of the split
    would have fewer than :data:`dpaudit.data.MIN_SPLIT_EXAMPLES` windows (``needed`` windows would do).
    """
    parts = [data.Split(x[rows], y[rows]) for rows in data.split_indices(len(x))]
    if min(map(len, parts)) < data.MIN_SPLIT_EXAMPLES:
        raise UsageError(f"{name} has {too_few(data.smallest_splittable())}")
    public, private, test = parts
    return TextDataset(name, public, private, test, num_classes=vocabulary, tokenized=tokenized)


def load(path: str | None = None, length: int | None = None, tokenizer_name: str | None = None) -> TextDataset:
    """``--dataset text`` (path None: the embedded corpus) or ``text:PATH`` (a UTF-8 file), cut into windows.

    Windows of ``length`` tokens (None: :data:`SEQUENCE_LENGTH`): bytes, or the ids of the tokenizer
    ``tokenizer_name`` (:func:`tokenizer`).
    """
    length = SEQUENCE_LENGTH if length is None else length
    name, raw = _text(path)
    if tokenizer_name is None:
        return from_bytes(name, raw, length)
    encode, vocabulary = tokenizer(tokenizer_name)
    ids = np.asarray(encode(raw.decode("utf-8")), dtype=np.int64)
    x, y = sequences(ids, length)
    return from_windows(
        name,
        x,
        y,
        vocabulary,
        lambda needed: (
            f"{len(ids)} tokens of --tokenizer {tokenizer_name}, {len(x)} windows of {length + 1}: every"
            f" part of the fixed 40/40/20 split needs {data.MIN_SPLIT_EXAMPLES}, so give text of at least"
            f" {needed * (length + 1)} tokens"
        ),
        tokenized=True,
    )


def tokenizer(name_or_path: str) -> tuple[Callable[[str], Sequence[int]], int]:
    """``--tokenizer``: (the text's token ids, the vocabulary size) of a tokenizer on disk, never downloaded.

    A ``tokenizer.json`` file (the ``tokenizers`` library's), or what ``transformers.AutoTokenizer`` loads with
    ``local_files_only=True``: a tokenizer's directory, or a name already in the local Hugging Face cache. The ids
    are the text's alone (no special tokens added); the vocabulary counts added tokens too.
    """
    spec = f"--tokenizer {name_or_path}"
    path = Path(name_or_path)
    try:
        if path.is_file():
            import tokenizers

            loaded = tokenizers.Tokenizer.from_file(str(path))
            return (lambda text: loaded.encode(text, add_special_tokens=False).ids), loaded.get_vocab_size(True)
        import transformers

        # verbose=False: a corpus longer than the model's context is the point here, not a warning
        auto = transformers.AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
        return (lambda text: auto(text, add_special_tokens=False, verbose=False)["input_ids"]), len(auto)
    except ImportError as error:
        raise UsageError(f"{spec} needs {error.name}: pip install transformers") from None
    except Exception as error:  # the libraries' errors for a file or directory they cannot read are of many types
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        where = (
            f"cannot be read as a tokenizer ({reason[:200]})"
            if path.exists()
            else "is no file or directory here nor a tokenizer in the local Hugging Face cache, and nothing is"
            " downloaded"
        )
        raise UsageError(
            f"{spec} {where}: give the local path of a tokenizer.json file or of a directory a tokenizer was saved to"
            " (tokenizer.save_pretrained)"
        ) from None


def from_token_npz(path: str, length: int | None = None) -> TextDataset:
    """``tokens:PATH``: an .npz of token ids, windows split by the fixed rule (docs/models.md §6).

    ``x`` (n, T) integer token ids, with ``y`` (n, T) their next tokens: the windows as they are (``length`` must
    be None). Without ``y``: x's rows in order are one stream of ids, cut into windows of ``length`` + 1 (None:
    :data:`SEQUENCE_LENGTH`) as text is, so rows of 65 ids are the windows of the default. The vocabulary: the
    ``vocab_size`` the file holds (a whole number), else the largest id + 1.
    """
    spec = f"tokens:{path}"
    arrays = data._npz_arrays(Path(path), spec)
    if "x" not in arrays:
        raise UsageError(
            f"{path} holds arrays {', '.join(sorted(arrays)) or 'none'} but no x: write it with numpy.savez(path,"
            " x=token_ids) (and y=next_tokens, vocab_size=V if you have them)"
        )
    given = [key for key in ("x", "y") if key in arrays]
    for key in given:
        array = arrays[key]
        if not np.issubdtype(array.dtype, np.integer):
            raise UsageError(f"{path}: {key} holds {array.dtype} values; token ids are integers: save them as int64")
        if array.ndim != 2 or not array.shape[1]:
            raise UsageError(f"{path}: {key} has shape {array.shape}; token windows are (n, T), T >= 1: reshape them")
        if array.size and array.min() < 0:
            at = tuple(int(i) for i in np.argwhere(array < 0)[0])
            raise UsageError(f"{path}: {key}{list(at)} is {array[at]}; token ids are whole numbers >= 0")
    x = arrays["x"].astype(np.int64)
    largest = max(int(arrays[key].max(initial=0)) for key in given)
    vocabulary = _vocabulary(path, arrays.get("vocab_size"), largest)
    if "y" in arrays:
        y = arrays["y"].astype(np.int64)
        if y.shape != x.shape:
            raise UsageError(
                f"{path}: y has shape {y.shape} but x {x.shape}; y holds the next token of each of x's ids, so give"
                " it x's shape (or leave y out: x's ids are then cut into windows)"
            )
        if length is not None:
            raise UsageError(
                f"--window cuts x's ids into windows, and {path} gives its windows as x and y: drop --window (the"
                f" windows are {x.shape[1]} tokens), or y"
            )
        return from_windows(
            spec,
            x,
            y,
            vocabulary,
            lambda needed: (
                f"{len(x)} windows: every part of the fixed 40/40/20 split needs"
                f" {data.MIN_SPLIT_EXAMPLES}, so give at least {needed}"
            ),
            tokenized=True,
        )
    length = SEQUENCE_LENGTH if length is None else length
    windows_x, windows_y = sequences(x.ravel(), length)
    return from_windows(
        spec,
        windows_x,
        windows_y,
        vocabulary,
        lambda needed: (
            f"{x.size} token ids, {len(windows_x)} windows of {length + 1}: every part of the fixed"
            f" 40/40/20 split needs {data.MIN_SPLIT_EXAMPLES}, so give at least {needed * (length + 1)} ids (or a"
            " shorter --window)"
        ),
        tokenized=True,
    )


def _vocabulary(path: str, given: np.ndarray | None, largest: int) -> int:
    """The vocabulary of ``tokens:PATH``: its ``vocab_size`` (a whole number above every id) or the largest id + 1."""
    if given is None:
        return largest + 1
    if given.size != 1 or not np.issubdtype(given.dtype, np.integer) or given.item() <= largest:
        raise UsageError(
            f"{path}: vocab_size is {given.tolist()!r}; it must be one whole number above every token id (the largest"
            f" is {largest})"
        )
    return int(given.item())


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
    prefix: Sequence[int] = SECRET_PREFIX,
    alphabet: Sequence[int] = SECRET_ALPHABET,
    secret_length: int = SECRET_DIGITS,
) -> np.ndarray:
    """(count, len(prefix) + secret_length) int64 secrets: ``prefix``, then random tokens of ``alphabet``.

    Tokens are bytes (``prefix`` and ``alphabet`` given as bytes) or any ids. The ``secret_length`` tokens are
    drawn uniformly (Carlini et al. 2019 Sec. 3: the format and its randomness space R,
    |R| = |alphabet|^secret_length).
    """
    check.count("count", count)
    check.count("secret length", secret_length)
    symbols = np.array(list(alphabet), dtype=np.int64)
    secrets = symbols[rng.integers(len(symbols), size=(count, secret_length))]
    return np.concatenate([np.tile(np.array(list(prefix), dtype=np.int64), (count, 1)), secrets], 1)


def secret_windows(
    count: int, rng: np.random.Generator, length: int = SEQUENCE_LENGTH, secret_format: SecretFormat = BYTE_SECRETS
) -> np.ndarray:
    """(count, length + 1) int64 training windows, each a secret of ``secret_format`` then its filler.

    The secret opens the window, so its likelihood depends on nothing before it; the filler (newlines, for bytes)
    fills the rest. The whole window is the canary (its membership score is the window's log-likelihood) and the
    format of its exposure: candidates differ from it in the 9 random symbols only.
    """
    secret_format.check_fits(length)
    secrets = secret_sequences(count, rng, secret_format.prefix, secret_format.alphabet, secret_format.length)
    return np.concatenate([secrets, np.full((count, length + 1 - secrets.shape[1]), secret_format.filler)], 1)


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


def candidates(prefix: Sequence[int], alphabet: Sequence[int], secret_length: int) -> np.ndarray:
    """Every sequence of the format: the whole space R, for exact exposure on small spaces.

    (|alphabet|^secret_length, len(prefix) + secret_length) int64, in the alphabet's lexicographic order; tokens
    as in :func:`secret_sequences`.
    """
    symbols = np.array(list(alphabet), dtype=np.int64)
    secrets = np.array(list(itertools.product(symbols, repeat=secret_length)), dtype=np.int64)
    return np.concatenate([np.tile(np.array(list(prefix), dtype=np.int64), (len(secrets), 1)), secrets], 1)


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

"""Per-example signals from model outputs, and the on-disk format of a run's outputs.

Shapes: logits are (models, examples, classes) and labels (examples,); every signal is
(models, examples). Any number of leading axes before (examples, classes) is accepted, so a
single model's (examples, classes) logits give an (examples,) signal.

- Logit-scaled confidence of LiRA (Carlini et al. 2022)
  φ = log p_y - log Σ_{y'≠y} p_{y'}. The softmax normaliser cancels, so
  φ = z_y - logsumexp_{y'≠y} z_{y'}: no probability is ever formed, and φ stays finite and exact
  for p_y = 1 - 1e-12 (φ ≈ 27.6) and for logits of any magnitude, where log(p/(1-p)) gives inf.
- Cross-entropy loss ℓ = -log softmax(z)_y = softplus(-φ), as p_y = sigmoid(φ): the stable
  log-softmax with full relative precision even for ℓ ≈ 1e-12. The membership score of the loss
  attack is -ℓ (docs/theory.md §3.2: lower loss = member).

Run file (`save_run_outputs` / `load_run_outputs`): one `.npz` holding `format_version`,
`outputs` (models × examples, or models × examples × classes) and `membership` (models ×
examples, bool, True = the example was in that model's training set).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import zipfile

import numpy as np
import scipy.special

from accountants import validation as check
from accountants.validation import InvalidArgument

RUN_OUTPUTS_FORMAT_VERSION = 1
_RUN_OUTPUTS_KEYS = frozenset({"format_version", "outputs", "membership"})


def _logits_and_labels(logits, labels) -> tuple[np.ndarray, np.ndarray]:
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim < 2:
        raise InvalidArgument(f"logits must have shape (..., examples, classes); got shape {logits.shape}.")
    logits = check.finite_array("logits", logits, ndim=logits.ndim)
    n_examples, n_classes = logits.shape[-2:]
    if n_classes < 2:
        raise InvalidArgument(f"logits need at least 2 classes on the last axis; got {n_classes}.")
    labels = np.asarray(labels)
    if labels.shape != (n_examples,) or not np.issubdtype(labels.dtype, np.integer):
        raise InvalidArgument(
            f"labels must be integer class indices of shape ({n_examples},), one per example; "
            f"got dtype {labels.dtype}, shape {labels.shape}."
        )
    if np.any(labels < 0) or np.any(labels >= n_classes):
        raise InvalidArgument(f"labels must lie in [0, {n_classes}); got {labels.min()}..{labels.max()}.")
    return logits, labels


def _label_logit(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    index = np.broadcast_to(labels[:, np.newaxis], logits.shape[:-1] + (1,))
    return np.take_along_axis(logits, index, axis=-1)[..., 0]


def logit_scaled_confidence(logits, labels) -> np.ndarray:
    """LiRA's φ = log p_y - log Σ_{y'≠y} p_{y'} = z_y - logsumexp_{y'≠y} z_{y'}.

    Args:
      logits: (..., examples, classes), finite, at least 2 classes.
      labels: (examples,) integer class of each example.

    Returns:
      φ of shape logits.shape[:-1]; higher = more confident in the label, so φ itself is a
      membership score.
    """
    logits, labels = _logits_and_labels(logits, labels)
    is_label = np.arange(logits.shape[-1]) == labels[:, np.newaxis]  # (examples, classes)
    other_logits = np.where(is_label, -np.inf, logits)
    return _label_logit(logits, labels) - scipy.special.logsumexp(other_logits, axis=-1)


def cross_entropy_loss(logits, labels) -> np.ndarray:
    """Per-example cross-entropy -log softmax(logits)_label, shape logits.shape[:-1].

    Computed as softplus(-φ) = log(1 + e^{-φ}), since p_y = sigmoid(φ): unlike
    logsumexp(z) - z_y, this keeps full relative precision for tiny losses (p_y → 1).

    Args:
      logits: (..., examples, classes), finite, at least 2 classes.
      labels: (examples,) integer class of each example (the canary's y_q for [W] App. F.1).
    """
    return np.logaddexp(0.0, -logit_scaled_confidence(logits, labels))


def true_label_log_probability(logits, labels) -> np.ndarray:
    """Log p(label | x; θ) = -cross-entropy, the per-model signal RMIA uses."""
    return -cross_entropy_loss(logits, labels)


@dataclasses.dataclass(frozen=True, eq=False)
class RunOutputs:
    """A run's outputs as stored on disk.

    Attributes:
      outputs: (models, examples) signals or (models, examples, classes) logits.
      membership: (models, examples) bool, True = the example was in that model's training set.
    """

    outputs: np.ndarray
    membership: np.ndarray


def _check_run_outputs(outputs, membership, source: str) -> RunOutputs:
    outputs = np.asarray(outputs)
    if outputs.ndim not in (2, 3) or not np.issubdtype(outputs.dtype, np.floating):
        raise InvalidArgument(
            f"{source}: outputs must be a float array of shape (models, examples) or (models, "
            f"examples, classes); got dtype {outputs.dtype}, shape {outputs.shape}."
        )
    membership = check.membership(f"{source}: membership", membership, shape=outputs.shape[:2])
    return RunOutputs(outputs=outputs, membership=membership)


def save_run_outputs(path, outputs, membership) -> None:
    """Writes outputs and membership to one `.npz` (atomically: a crash leaves no partial file).

    Args:
      path: destination file; must end in ".npz".
      outputs: float array (models, examples) or (models, examples, classes).
      membership: (models, examples) bool (or 0/1 integers).
    """
    path = pathlib.Path(path)
    if path.suffix != ".npz":
        raise InvalidArgument(f"path must end in .npz; got {str(path)!r}.")
    run = _check_run_outputs(outputs, membership, "save_run_outputs")
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "wb") as handle:
            np.savez(
                handle,
                format_version=np.array(RUN_OUTPUTS_FORMAT_VERSION),
                outputs=run.outputs,
                membership=run.membership,
            )
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def load_run_outputs(path) -> RunOutputs:
    """Reads a file written by `save_run_outputs`.

    Raises:
      ValueError: the file is missing or not an .npz archive, has no or another format version,
        lacks a key, or its outputs and membership shapes disagree. The message names the file.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise InvalidArgument(f"run outputs file {str(path)!r} does not exist.")
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise InvalidArgument("it holds a single array")
        with archive:
            stored = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise InvalidArgument(f"{str(path)!r} is not a readable .npz archive ({error}).") from None
    if "format_version" not in stored:
        raise InvalidArgument(
            f"{str(path)!r} has no format_version: it was not written by save_run_outputs "
            f"(or predates format version {RUN_OUTPUTS_FORMAT_VERSION}); re-create it."
        )
    version = stored["format_version"]
    if (
        version.shape != ()
        or not np.issubdtype(version.dtype, np.integer)
        or int(version) != RUN_OUTPUTS_FORMAT_VERSION
    ):
        raise InvalidArgument(
            f"{str(path)!r} has format_version {version.tolist()}, this code reads version "
            f"{RUN_OUTPUTS_FORMAT_VERSION}; re-create the file with this version of dpaudit."
        )
    missing = _RUN_OUTPUTS_KEYS - stored.keys()
    if missing:
        raise InvalidArgument(f"{str(path)!r} lacks {sorted(missing)}; re-create it with save_run_outputs.")
    return _check_run_outputs(stored["outputs"], stored["membership"], str(path))

"""The run directory: the only state of a campaign (docs/architecture.md §4). Numpy + json only, no torch.

Layout::

    RUN_DIR/campaign.json            format version, config, its hash, the data's fingerprint
    RUN_DIR/plan.npz                 targets, design membership, canary, reference logits (everything analysis needs)
    RUN_DIR/base.pt                  the pretrained base model's weights (so resuming never re-pretrains)
    RUN_DIR/chunks/models-A-B.npz    outputs of shadow models A..B-1, with a checksum
    RUN_DIR/summary.json, scores.csv, roc*.png, report.md   written by the analysis

Every file is written to a temporary name and renamed, so a crash or ``kill -9`` leaves either the whole file
or none. A chunk whose checksum or shape does not match is treated as absent: it is recomputed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpaudit import __version__
from dpaudit.config import CampaignConfig
from dpaudit.errors import UsageError

FORMAT_VERSION = 1
_CHUNK_ARRAYS = ("indices", "target_logits", "population_logits")


@dataclass(frozen=True)
class Plan:
    """Everything about a campaign's targets that analysis needs, fixed before any shadow model trains.

    ``membership`` (models, targets) is the design's truth the attack is judged against (in a null campaign
    the canary's design group, though no model saw it). ``reference_logits`` (targets, classes) are the
    pretrained base's outputs: the reference model θ_ref of [S] Eq. 16, trained on auxiliary (public) data.
    """

    target_labels: np.ndarray  # (targets,)
    membership: np.ndarray  # (models, targets) bool
    reference_logits: np.ndarray  # (targets, classes)
    population_labels: np.ndarray  # (population,) the test split: in no model's training set (RMIA's z)
    max_members: np.ndarray  # () the largest member count N of any model: with the batch size it fixes q and T
    layer_shapes: np.ndarray  # (layers, 3) d_out, d_in, example rank of each adapted layer (dpaudit.bounds)


@dataclass(frozen=True)
class ChunkOutputs:
    """What a chunk of shadow models sends back: outputs only, never the models."""

    indices: np.ndarray  # (K,) model indices
    target_logits: np.ndarray  # (K, targets, classes) float32
    population_logits: np.ndarray  # (K, population, classes) float32


def _checksum(arrays: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def replace_atomically(path: Path, write) -> None:
    """``write(tmp)`` then rename tmp to ``path``: a crash leaves the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            np.savez(handle, checksum=np.array(_checksum(arrays)), **arrays)
            handle.flush()
            os.fsync(handle.fileno())

    replace_atomically(path, write)


def _load_npz(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays of an npz written by :func:`_save_npz`, or None if it is truncated or corrupt."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError):
        return None
    checksum = arrays.pop("checksum", None)
    if checksum is None or str(checksum) != _checksum(arrays):
        return None
    return arrays


def write_json(path: Path, value: dict) -> None:
    replace_atomically(path, lambda tmp: tmp.write_text(json.dumps(value, indent=2) + "\n"))


class RunStore:
    """A campaign's run directory (see module docstring)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.chunks = self.root / "chunks"

    # -- campaign metadata -------------------------------------------------------------------------------------

    def create_or_check(self, config: CampaignConfig, data_fingerprint: str) -> bool:
        """Record a new campaign, or check that the directory holds this very campaign; True if it existed."""
        existing = self.root / "campaign.json"
        if existing.exists():
            stored = self.config()
            differences = stored.differences(config)
            if differences:
                raise UsageError(
                    f"{self.root} holds a campaign with a different config ({'; '.join(differences)}):"
                    f" use another --out, or `dpaudit resume {self.root}` to continue it"
                )
            self.check_data(data_fingerprint)
            return True
        self.root.mkdir(parents=True, exist_ok=True)
        self.chunks.mkdir(exist_ok=True)
        write_json(
            existing,
            {
                "format_version": FORMAT_VERSION,
                "dpaudit_version": __version__,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "config": dataclasses.asdict(config),
                "config_hash": config.canonical_hash(),
                "data_fingerprint": data_fingerprint,
            },
        )
        return False

    def _metadata(self) -> dict:
        path = self.root / "campaign.json"
        if not path.is_file():
            raise UsageError(
                f"{self.root} is not a dpaudit run directory (no campaign.json); "
                "start one with `dpaudit audit --out DIR`"
            )
        try:
            metadata = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path} is corrupt ({exc}); the run cannot be resumed or analysed") from None
        if metadata.get("format_version") != FORMAT_VERSION:
            raise UsageError(
                f"{self.root} was written by dpaudit {metadata.get('dpaudit_version', '< 0.1')} "
                f"(run format {metadata.get('format_version')}); this dpaudit {__version__} reads "
                f"format {FORMAT_VERSION}: re-run the campaign"
            )
        return metadata

    def config(self) -> CampaignConfig:
        metadata = self._metadata()
        try:
            config = CampaignConfig(**metadata["config"])
        except (TypeError, KeyError) as exc:
            raise UsageError(f"{self.root}/campaign.json has an unreadable config ({exc})") from None
        if config.canonical_hash() != metadata.get("config_hash"):
            raise UsageError(
                f"{self.root}/campaign.json: the config does not match its recorded hash "
                "(edited by hand?); re-run the campaign"
            )
        return config

    def check_data(self, data_fingerprint: str) -> None:
        stored = self._metadata()["data_fingerprint"]
        if stored != data_fingerprint:
            raise UsageError(
                f"the dataset differs from the one {self.root} was started with (fingerprint "
                f"{stored[:12]}… now {data_fingerprint[:12]}…): refusing to mix shadow models"
            )

    # -- plan and base model ----------------------------------------------------------------------------------

    def save_plan(self, plan: Plan) -> None:
        _save_npz(self.root / "plan.npz", dataclasses.asdict(plan))

    def plan(self) -> Plan:
        path = self.root / "plan.npz"
        arrays = _load_npz(path) if path.is_file() else None
        if arrays is None or set(arrays) != {f.name for f in dataclasses.fields(Plan)}:
            raise UsageError(f"{path} is missing or corrupt: re-run the campaign")
        return Plan(**arrays)

    @property
    def base_path(self) -> Path:
        return self.root / "base.pt"

    # -- chunks -----------------------------------------------------------------------------------------------

    def write_chunk(self, outputs: ChunkOutputs) -> None:
        first, last = int(outputs.indices[0]), int(outputs.indices[-1])
        _save_npz(self.chunks / f"models-{first:07d}-{last + 1:07d}.npz", dataclasses.asdict(outputs))

    def _valid_chunks(self, n_models: int) -> list[dict[str, np.ndarray]]:
        """Chunks whose checksum, keys and indices are sound; others are ignored (and so recomputed)."""
        valid = []
        for path in sorted(self.chunks.glob("models-*.npz")):
            arrays = _load_npz(path)
            if arrays is None or set(arrays) != set(_CHUNK_ARRAYS):
                continue
            indices = arrays["indices"]
            if (
                indices.ndim != 1
                or not len(indices)
                or indices.min() < 0
                or indices.max() >= n_models
                or len(arrays["target_logits"]) != len(indices)
                or len(arrays["population_logits"]) != len(indices)
            ):
                continue
            valid.append(arrays)
        return valid

    def finished(self, n_models: int) -> np.ndarray:
        """(n_models,) bool: the models whose outputs are safely on disk."""
        done = np.zeros(n_models, dtype=bool)
        for arrays in self._valid_chunks(n_models):
            done[arrays["indices"]] = True
        return done

    def outputs(self, n_models: int) -> ChunkOutputs:
        """All models' outputs in model order; an error if any model is missing."""
        chunks = self._valid_chunks(n_models)
        indices = np.concatenate([c["indices"] for c in chunks]) if chunks else np.zeros(0, dtype=np.int64)
        unique, first = np.unique(indices, return_index=True)
        if len(unique) != n_models:
            raise UsageError(
                f"{self.root} has outputs for {len(unique)} of {n_models} models: "
                f"`dpaudit resume {self.root}` trains the rest"
            )
        gathered = {name: np.concatenate([c[name] for c in chunks])[first] for name in _CHUNK_ARRAYS}
        return ChunkOutputs(**gathered)

    # -- timing ------------------------------------------------------------------------------------------------

    def record_seconds(self, seconds: float) -> None:
        """Add a session's wall time (setup + training) to the campaign's total, across resumes."""
        write_json(self.root / "timing.json", {"seconds": self.seconds() + seconds})

    def seconds(self) -> float:
        path = self.root / "timing.json"
        return float(json.loads(path.read_text())["seconds"]) if path.is_file() else 0.0

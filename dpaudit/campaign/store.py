"""The run directory, a campaign's only state (docs/architecture.md §4, docs/run-directory.md). Numpy + json, no torch.

Layout::

    RUN_DIR/campaign.json            format and dpaudit version, config, its hash, data/model/mechanism fingerprints
    RUN_DIR/base.pt                  the pretrained base model's weights (so resuming never re-pretrains)
    RUN_DIR/plan.npz                 targets, design membership, canary, reference outputs (everything analysis needs)
    RUN_DIR/chunks/models-A-B.npz    outputs of shadow models A..B-1
    RUN_DIR/timing.json              the campaign's wall time, summed over sessions, and how they trained
    RUN_DIR/measured.json            LoRA-FA campaigns: [S] Lemma 7.2's λ̄, C, β measured on a few of its models
    RUN_DIR/privacy.json             the privacy event the mechanism claims at this run's facts, saved when planned
                                     (plan.npz keeps a copy of both: the files the verdict is judged against)
    RUN_DIR/.lock                    held (flock) by the process that trains
    RUN_DIR/summary.json, scores.csv, roc*.png, report.*   written by the analysis

Every file is written to a temporary file created exclusively in its directory (``O_EXCL | O_NOFOLLOW``), synced
and renamed over its name, so a crash, ``kill -9`` or a full disk leaves the whole old file or the whole new one,
and a link planted at any name is replaced, never followed. A run directory that contains a link is refused.

``plan.npz`` and every chunk carry a checksum of their arrays and a copy of ``campaign.json`` as it was when they
were made: a file whose checksum fails (a crash artifact) is recomputed; a ``campaign.json`` that no longer
matches what was made under it (edited by hand) is refused, naming the field. This protects against mistakes and
casual edits, not against a forger who rewrites every file consistently. ``privacy.json`` and ``measured.json`` are
bound the same way one level down: ``plan.npz`` records a copy of each (checksummed with the plan's arrays), and a
file that differs from its copy is refused, naming the field.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import io
import json
import math
import os
import re
import secrets
import stat
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from accountants.jsondata import json_safe
from dpaudit import config as config_lib
from dpaudit.config import CampaignConfig
from dpaudit.errors import UsageError
from dpaudit.files import file_kind, open_regular
from dpaudit.formatting import json_text
from dpaudit.training.sampling import BatchLayout
from dpaudit.version import __version__

# 4: every campaign's claimed privacy event in privacy.json, read by the analysis; 5: plan.npz records copies of
# privacy.json and measured.json, which must match them
FORMAT_VERSION = 5
_CHUNK_ARRAYS = ("indices", "target_outputs", "population_outputs")
_OBSERVATIONS = "canary_observations"  # chunks of white-box campaigns (config observe = weights | steps) only
_CANDIDATES = "candidate_log_likelihoods"  # chunks of next-token campaigns with secret canaries only
_METADATA_FIELDS = {
    "format_version": int,
    "dpaudit_version": str,
    "created": str,
    "config": dict,
    "config_hash": str,
    "data_fingerprint": str,
}
_REMAKE_PLAN = "delete it; `dpaudit resume` remakes it"
_ONLY_REGULAR = "a run directory holds only regular files and its chunks/ directory; remove it, or restore the file"
_TEMPORARY = re.compile(r"^\..+\.(\d+)(-[0-9a-f]{8})?\.tmp$")  # .NAME.PID-RANDOM.tmp (older: .NAME.PID.tmp)


@dataclass(frozen=True)
class Plan:
    """Everything about a campaign's targets that analysis needs, fixed before any shadow model trains.

    ``membership`` (models, targets) is the design's truth the attack is judged against (in a null campaign
    the canary's design group, though no model saw it). ``reference_outputs`` are the pretrained base's outputs
    on the targets: the reference model θ_ref of [S] Eq. 16, trained on auxiliary (public) data.

    A model's *outputs* on an example depend on the ``task`` (:mod:`dpaudit.models`): a classifier's are its
    logits (F = classes); a next-token model's, the sequence's log-likelihood and top-1 accuracy over its T bytes
    (F = 2, :func:`dpaudit.data.text.sequence_summaries`), since all T × V logits of every sequence would be 8000
    times larger. Labels are (n,) classes or (n, T) next bytes.
    """

    task: np.ndarray  # () str: classification | next-token
    target_labels: np.ndarray  # (targets,) or (targets, T)
    membership: np.ndarray  # (models, targets) bool
    reference_outputs: np.ndarray  # (targets, F)
    population_labels: np.ndarray  # (population,) or (population, T): the test split, in no training set (RMIA's z)
    max_members: np.ndarray  # () the largest member count N of any model: with the batch size it fixes q and T
    layer_shapes: np.ndarray  # (layers, 3) d_out, d_in, example rank of each adapted layer (dpaudit.mechanisms.bounds)
    base_checksum: np.ndarray  # () str: checksum of base.pt's tensors, so a re-pretrained base is checked
    # () str: the claimed privacy event (privacy.to_record) as JSON: privacy.json must hold it, the mechanism claim it
    claimed_privacy: np.ndarray
    # () str: measured.json's values as JSON once [S] Lemma 7.2's inputs are measured after training; "" before
    sketch_inputs: np.ndarray


@dataclass(frozen=True)
class ChunkOutputs:
    """What a chunk of shadow models sends back: outputs only, never the models."""

    indices: np.ndarray  # (K,) model indices
    target_outputs: np.ndarray  # (K, targets, F) float32, F as in Plan
    population_outputs: np.ndarray  # (K, population, F) float32
    # (K, S, canaries) float64, white-box campaigns only (training.canaries): S = 1 (observe weights) or T (steps)
    canary_observations: np.ndarray | None = None
    # (K, m) float64, next-token campaigns with secrets: log-likelihoods of m candidates drawn from the secrets'
    # format (attacks.exposure.sampled_exposure)
    candidate_log_likelihoods: np.ndarray | None = None


# -- files: atomic, exclusive, never through a link --------------------------------------------------------------


def checksum(arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 of named arrays: names, dtypes, shapes and contents."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def json_checksum(value) -> str:
    """SHA-256 of a JSON value's canonical text: keys sorted, non-finite numbers as strings (as files hold them)."""
    return hashlib.sha256(json.dumps(json_safe(value), sort_keys=True).encode()).hexdigest()


def _open_directory(root: Path, parts: tuple[str, ...]) -> int:
    """A descriptor of ``root/parts…``: ``root`` itself may be a link (the user's choice), nothing below it."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for part in parts:
        try:
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        finally:
            os.close(fd)
        fd = child
    return fd


def write_file(root: Path, relative: str, data: bytes) -> None:
    """Write ``root/relative`` atomically: a crash leaves the old file or the new one; a link there is replaced.

    The temporary file is created exclusively (``O_EXCL | O_NOFOLLOW``, a random name) in the target's
    directory, which is opened without following links below ``root``.
    """
    *parents, name = Path(relative).parts
    path = Path(root, relative)
    try:
        directory = _open_directory(Path(root), tuple(parents))
        try:
            for _ in range(100):
                tmp = f".{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
                with suppress(FileExistsError):
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=directory)
                    break
            else:
                raise FileExistsError(f"no free temporary name beside {path}")
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
                os.fsync(directory)
            except BaseException:
                with suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=directory)
                raise
        finally:
            os.close(directory)
    except OSError as exc:
        raise _unusable(path, "write", exc, "; the old file, if any, is intact") from None


def read_file(root: Path, relative: str) -> bytes | None:
    """The contents of ``root/relative``, or None if it does not exist; a link or no regular file there is an error."""
    *parents, name = Path(relative).parts
    try:
        directory = _open_directory(Path(root), tuple(parents))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _unusable(Path(root, *parents), "read", exc) from None
    try:
        opened = open_regular(name, _ONLY_REGULAR, dir_fd=directory, follow_links=False, shown=Path(root, relative))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _unusable(Path(root, relative), "read", exc) from None
    finally:
        os.close(directory)
    with _usage_error_on_os_error(Path(root, relative), "read"), opened as handle:
        return handle.read()


def _unusable(path: Path, action: str, exc: OSError, note: str = "") -> UsageError:
    """An OSError on a run directory the user named, as a usage error: the path, the system's reason, the fix."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW met a link, or a file stands where a directory belongs
        fix = "a run directory must hold no links, and each part of its path must be a directory; fix the path"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "give this user read and write access to the run directory (chmod, chown, a writable mount), or copy it"
    elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free disk space and run the command again"
    else:
        fix = "repair the run directory (or its file system) and run the command again"
    return UsageError(f"cannot {action} {path} ({exc.strerror or exc}){note}: {fix}")


def make_directory(path: Path) -> None:
    """Create ``path`` and its parents if missing; an OSError (a file in the way, no permission) is a usage error."""
    with _usage_error_on_os_error(Path(path), "create"):
        Path(path).mkdir(parents=True, exist_ok=True)


@contextmanager
def _usage_error_on_os_error(path: Path, action: str) -> Iterator[None]:
    """Around file-system calls on the run directory only (never around other code): OSError -> :func:`_unusable`."""
    try:
        yield
    except OSError as exc:
        raise _unusable(path, action, exc) from None


def _reject_constant(token: str):
    raise ValueError(f"{token} is not JSON")


@contextmanager
def directory_lock(root: Path) -> Iterator[None]:
    """Held while a process writes the run directory ``root`` (flock on root/.lock, released even by kill -9).

    A second process is refused with a usage error naming the holder's pid; so is a ``.lock`` that is not a regular
    file with this one name, which writing the pid would change outside the run directory.
    """
    path = root / ".lock"
    with _usage_error_on_os_error(path, "open"):
        directory = _open_directory(root, ())
        try:
            fd = os.open(".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644, dir_fd=directory)
        finally:
            os.close(directory)
    try:
        # O_NOFOLLOW stops a symbolic link, not a hard link (a second name of a file elsewhere) or a FIFO.
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode) or found.st_nlink != 1:
            what = f"one of {found.st_nlink} names of a file" if stat.S_ISREG(found.st_mode) else "not a regular file"
            raise UsageError(
                f"cannot lock {path}: it is {what}, which writing the lock's pid would change; delete it and run the"
                " command again"
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise UsageError(
                f"{root} is being trained by another dpaudit process (pid {holder}): wait for it to"
                " finish (then `dpaudit resume` or `analyse`), or stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


ABSENT = object()  # what read_json returns for a file that does not exist (a JSON file may hold null)


def read_json(root: Path, name: str, fix: str):
    """A JSON file of the run directory (strictly parsed), or ABSENT; an error naming it and ``fix``."""
    data = read_file(root, name)
    if data is None:
        return ABSENT
    try:
        return json.loads(data, parse_constant=_reject_constant)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UsageError(f"{Path(root, name)} is corrupt ({exc}): {fix}") from None


def add_seconds(root: Path, seconds: float, engine: str | None = None) -> None:
    """Add a session's wall time to the total of the run directory ``root`` (timing.json), across resumes.

    ``engine``: how the session's shadow models were computed, in words, added to timing.json's list of them where
    it is not there yet (a campaign's sessions; None: the session trained none).
    """
    engines = read_engines(root)
    record: dict = {"seconds": read_seconds(root) + seconds}
    if engine is not None and engine not in engines:
        engines.append(engine)
    if engines:
        record["engine"] = engines
    write_file(root, "timing.json", json_text(record).encode())


_TIMING_FIX = "delete it (only the run's recorded duration and engine are lost)"


def _timing(root: Path) -> dict | None:
    timing = read_json(root, "timing.json", _TIMING_FIX)
    if timing is ABSENT:
        return None
    if not isinstance(timing, dict):
        raise UsageError(f'{Path(root, "timing.json")} is not {{"seconds": a number >= 0, …}}: {_TIMING_FIX}')
    return timing


def read_seconds(root: Path) -> float:
    """The wall time of the run directory ``root``, summed over its sessions (timing.json); 0 before one ended."""
    timing = _timing(root)
    if timing is None:
        return 0.0
    seconds = timing.get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < math.inf:
        raise UsageError(f'{Path(root, "timing.json")} is not {{"seconds": a number >= 0, …}}: {_TIMING_FIX}')
    return float(seconds)


def read_engines(root: Path) -> list[str]:
    """How the sessions of the run directory ``root`` computed its shadow models (timing.json), each once."""
    timing = _timing(root)
    engines = [] if timing is None else timing.get("engine", [])
    if not isinstance(engines, list) or not all(isinstance(words, str) for words in engines):
        raise UsageError(f'{Path(root, "timing.json")} has an "engine" that is not a list of texts: {_TIMING_FIX}')
    return engines


def _save_npz(root: Path, relative: str, arrays: dict[str, np.ndarray], record: str) -> None:
    """An npz with its checksum and the campaign record (campaign.json as it was) it was made under."""
    buffer = io.BytesIO()
    named = {"checksum": np.array(checksum(arrays)), "campaign": np.array(record), **arrays}
    np.savez(buffer, **named)  # type: ignore[arg-type]  # numpy's stub takes any keyword for allow_pickle
    write_file(root, relative, buffer.getvalue())


def _load_npz(root: Path, relative: str) -> tuple[dict[str, np.ndarray], str] | None:
    """(arrays, campaign record) of an npz written by :func:`_save_npz`; None if absent, truncated or corrupt."""
    data = read_file(root, relative)
    if data is None:
        return None
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    # What damage makes zipfile raise besides BadZipFile: NotImplementedError for a flipped version or compression
    # method, RuntimeError for a flipped encryption flag.
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError, NotImplementedError, RuntimeError):
        return None
    stored, record = arrays.pop("checksum", None), arrays.pop("campaign", None)
    if stored is None or record is None or stored.shape or str(stored) != checksum(arrays):
        return None
    return arrays, str(record)


def differences(made: dict, now: dict, prefix: str = "") -> list[str]:
    """``field: A when made, B now`` for each (nested) field of two records (JSON objects) that differs."""
    found = []
    for key in sorted(set(made) | set(now), key=str):
        before, after = made.get(key, "(absent)"), now.get(key, "(absent)")
        if isinstance(before, dict) and isinstance(after, dict):
            found += differences(before, after, f"{prefix}{key}.")
        elif before != after or type(before) is not type(after):
            found.append(f"{prefix}{key}: {before!r} when made, {after!r} now")
    return found


def _json_object_text(text: np.ndarray, empty: bool = False) -> bool:
    """Whether ``text`` is a () string array holding a JSON object (or, if ``empty``, nothing)."""
    if text.shape or text.dtype.kind != "U":
        return False
    if empty and not str(text):
        return True
    try:
        return isinstance(json.loads(str(text)), dict)
    except ValueError:
        return False


def _config_from_json(raw: dict, path: Path) -> CampaignConfig:
    """The config stored in campaign.json: keys and types checked, "inf"/"-inf"/"nan" read back as floats."""
    fields = {field.name: field.type for field in dataclasses.fields(CampaignConfig)}
    unknown = sorted(set(raw) - set(fields), key=str)
    if unknown:
        raise UsageError(
            f"{path}: unknown config field(s) {', '.join(map(str, unknown))}; restore it, or re-run the campaign"
        )
    values = {
        name: float(value) if "float" in fields[name] and value in ("inf", "-inf", "nan") else value
        for name, value in raw.items()
    }
    try:
        config_lib.from_mapping(values)  # names a mistyped key or an invalid value
        return CampaignConfig(**values)  # type: ignore[arg-type]  # the stored values as they are (from_mapping turns ints into floats)
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}; restore it, or re-run the campaign into a new directory") from None


# -- the run directory -------------------------------------------------------------------------------------------


class RunStore:
    """A campaign's run directory (see module docstring)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.chunks = self.root / "chunks"

    def _damaged(self, name: str, problem: str, fix: str) -> UsageError:
        return UsageError(f"{self.root / name} {problem}: {fix}")

    def check_layout(self) -> None:
        """Refuse a run directory that holds a link (every write must stay inside it) or a chunks/ that is no directory.

        A FIFO, socket or file named chunks would otherwise read as a directory of no chunks.
        """
        for directory in (self.root, self.chunks):  # chunks/ is scanned only once the root showed it is no link
            with _usage_error_on_os_error(directory, "read"):
                if not directory.is_dir():
                    return
                entries = list(os.scandir(directory))
            for entry in entries:
                if entry.is_symlink():
                    raise UsageError(f"{entry.path} is a link: a run directory must hold no links; remove it")
                if directory == self.root and entry.name == "chunks" and not entry.is_dir():
                    raise UsageError(
                        f"{entry.path} is {file_kind(entry.stat().st_mode)}, not a directory: remove it;"
                        " `dpaudit resume` makes it again"
                    )

    # -- campaign metadata -------------------------------------------------------------------------------------

    def create_or_check(
        self, config: CampaignConfig, data_fingerprint: str, fingerprints: dict[str, str] | None = None
    ) -> bool:
        """Record a new campaign, or check that the directory holds this very campaign; True if it existed.

        ``fingerprints``: ``model_fingerprint`` and ``mechanism_fingerprint``, recorded beside the config; they and
        the dpaudit version must match on resume (runs recorded before fingerprints: the config alone).
        A directory whose campaign has no finished model yet (killed during setup, or diverged in its first
        chunk) is restarted with the new config: nothing made under the old one would be mixed in.
        """
        fingerprints = fingerprints or {}
        self._make_root()
        if read_file(self.root, "campaign.json") is not None:
            settings = self.config().differences(config)
            changed = settings + self._fingerprint_differences(fingerprints)
            if not changed:
                self.check_data(data_fingerprint)
                return True
            if any(self.chunks.glob("models-*.npz")):
                # `dpaudit resume` continues with the stored settings: where only the code changed, it would refuse too.
                again = (
                    f", or `dpaudit resume {self.root}` to continue it as it was"
                    if settings
                    else ", or restore the model code (or dpaudit version) the run was made with and resume it"
                )
                raise UsageError(
                    f"{self.root} holds a different campaign ({'; '.join(changed)}): its models cannot be mixed"
                    f" with these; use another --out{again}"
                )
            for name in ("plan.npz", "base.pt", "timing.json", "privacy.json", "measured.json"):
                with _usage_error_on_os_error(self.root / name, "remove"):
                    (self.root / name).unlink(missing_ok=True)
        metadata = {
            "format_version": FORMAT_VERSION,
            "dpaudit_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "config": dataclasses.asdict(config),
            "config_hash": config.canonical_hash(),
            "data_fingerprint": data_fingerprint,
            **fingerprints,
        }
        write_file(self.root, "campaign.json", json_text(metadata).encode())
        self.make_chunks_directory()
        return False

    def _fingerprint_differences(self, fingerprints: dict[str, str]) -> list[str]:
        """``name: recorded → now`` for the dpaudit version and each recorded fingerprint that differs."""
        metadata = self._metadata()
        now = {"dpaudit_version": __version__, **fingerprints}
        return [
            f"{name}: {str(metadata[name])[:16]!r} → {value[:16]!r}"
            for name, value in now.items()
            if name in metadata and metadata[name] != value
        ]

    def _make_root(self) -> None:
        make_directory(self.root)
        self.check_layout()

    def make_chunks_directory(self) -> None:
        with _usage_error_on_os_error(self.chunks, "create"), suppress(FileExistsError):
            self.chunks.mkdir()
        self.check_layout()

    def _metadata(self) -> dict:
        """campaign.json, its fields present and of the right types."""
        self.check_layout()
        path = self.root / "campaign.json"
        fix = "restore it from a backup, or re-run the campaign into a new directory"
        metadata = read_json(self.root, "campaign.json", fix)
        if metadata is ABSENT:
            raise UsageError(
                f"{self.root} is not a dpaudit run directory (no campaign.json); "
                "start one with `dpaudit audit --out DIR`"
            )
        if not isinstance(metadata, dict):
            raise UsageError(f"{path} holds a {type(metadata).__name__}, not a campaign record: {fix}")
        if metadata.get("format_version") != FORMAT_VERSION:
            raise UsageError(
                f"{self.root} was written by dpaudit {metadata.get('dpaudit_version', '< 0.1')} "
                f"(run format {metadata.get('format_version')}); this dpaudit {__version__} reads "
                f"format {FORMAT_VERSION}: re-run the campaign"
            )
        for name, kind in _METADATA_FIELDS.items():
            if not isinstance(metadata.get(name), kind):
                raise UsageError(f"{path}: field {name!r} is missing or not a {kind.__name__}: {fix}")
        return metadata

    def _record(self) -> str:
        """campaign.json in canonical form: stored in plan.npz and every chunk, which it binds to the config."""
        return json.dumps(self._metadata(), sort_keys=True)

    def _check_record(self, name: str, record: str) -> None:
        """Refuse a campaign.json that differs from the one ``name`` was made under, naming the fields."""
        now = self._metadata()
        try:
            made = json.loads(record)
        except ValueError:
            made = None
        if not isinstance(made, dict):
            raise self._damaged(name, "has an unreadable campaign record", "delete it; `dpaudit resume` remakes it")
        edited = differences(made, now)
        if edited:
            raise UsageError(
                f"{self.root / 'campaign.json'} does not match the one {name} was made under "
                f"({'; '.join(edited)}): campaign.json was edited; restore it, or re-run the campaign"
                " into a new directory"
            )

    def config(self) -> CampaignConfig:
        """The campaign's config, checked against its hash and against what was made under it."""
        metadata = self._metadata()
        path = self.root / "campaign.json"
        # What was made under it names an edited field (even one whose hash was recomputed).
        if self.saved_plan() is None:
            for chunk in sorted(self.chunks.glob("models-*.npz")):
                loaded = _load_npz(self.root, f"chunks/{chunk.name}")
                if loaded is not None:
                    self._check_record(f"chunks/{chunk.name}", loaded[1])
                    break
        config = _config_from_json(metadata["config"], path)
        if config.canonical_hash() != metadata["config_hash"]:
            raise UsageError(
                f"{path}: the config does not match its recorded config_hash (edited by hand?): restore it,"
                " or re-run the campaign into a new directory"
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
        """Written last in a campaign's setup: its presence marks a complete setup."""
        _save_npz(self.root, "plan.npz", dataclasses.asdict(plan), self._record())

    def saved_plan(self) -> Plan | None:
        """The plan, None if absent or damaged by a crash (it is then remade); an error if it was tampered with."""
        loaded = _load_npz(self.root, "plan.npz")
        if loaded is None:
            return None
        arrays, record = loaded
        self._check_record("plan.npz", record)
        names = {f.name for f in dataclasses.fields(Plan)}
        if set(arrays) != names:
            raise self._damaged("plan.npz", f"holds arrays {sorted(arrays)}, not {sorted(names)}", _REMAKE_PLAN)
        plan = Plan(**arrays)
        models = self._metadata()["config"].get("models")
        labels, membership, reference = plan.target_labels, plan.membership, plan.reference_outputs
        # Gradient canaries are targets without an input: no labels, no logits.
        inputs = membership.shape[-1] if self._metadata()["config"].get("canary") != "gradient" else 0
        problem = None
        label_dimensions = 1 if str(plan.task) == "classification" else 2
        if str(plan.task) not in ("classification", "next-token"):
            problem = f"has task {plan.task}, not classification or next-token"
        elif (
            labels.ndim != label_dimensions
            or plan.population_labels.ndim != label_dimensions
            or labels.dtype.kind not in "iu"
            or plan.population_labels.dtype.kind not in "iu"
        ):
            problem = f"has target or population labels that are not {label_dimensions}-D integer arrays"
        elif membership.dtype != bool or membership.ndim != 2 or membership.shape[0] != models or len(labels) != inputs:
            problem = (
                f"has a membership of shape {membership.shape} ({membership.dtype}) for {len(labels)} target labels,"
                f" not ({models}, targets) bool"
            )
        elif reference.ndim != 2 or len(reference) != len(labels):
            problem = f"has reference outputs of shape {reference.shape}, not (targets, F)"
        elif plan.layer_shapes.ndim != 2 or plan.layer_shapes.shape[1:] != (3,) or plan.max_members.shape:
            problem = "has malformed layer shapes or member count"
        elif not (_json_object_text(plan.claimed_privacy) and _json_object_text(plan.sketch_inputs, empty=True)):
            problem = "has copies of privacy.json or measured.json that are not JSON objects"
        if problem is not None:
            raise self._damaged("plan.npz", problem, _REMAKE_PLAN)
        return plan

    def plan(self) -> Plan:
        plan = self.saved_plan()
        if plan is None:
            raise self._damaged(
                "plan.npz", "is missing or damaged", f"`dpaudit resume {self.root}` remakes it, then analyse"
            )
        return plan

    def analysed_attack(self) -> str | None:
        """The attack summary.json was last written with (by ``audit``, ``resume`` or ``analyse``); None before."""
        summary = read_json(self.root, "summary.json", "delete it (analysing the run writes it again)")
        attack = summary.get("attack") if isinstance(summary, dict) else None
        return attack if isinstance(attack, str) else None

    def read_base(self) -> bytes | None:
        """base.pt's bytes (torch's format, read by dpaudit.campaign.runner), None if absent."""
        return read_file(self.root, "base.pt")

    def write_base(self, data: bytes) -> None:
        write_file(self.root, "base.pt", data)

    # -- chunks -----------------------------------------------------------------------------------------------

    def write_chunk(self, outputs: ChunkOutputs) -> None:
        first, last = int(outputs.indices[0]), int(outputs.indices[-1])
        name = f"chunks/models-{first:07d}-{last + 1:07d}.npz"
        arrays = {key: value for key, value in dataclasses.asdict(outputs).items() if value is not None}
        _save_npz(self.root, name, arrays, self._record())

    def _chunk_arrays(self, plan: Plan) -> tuple[str, ...]:
        """The arrays every chunk of this campaign holds: outputs, white-box observations, secrets' candidates."""
        config = self._metadata()["config"]
        observed = (_OBSERVATIONS,) if config.get("observe", "outputs") != "outputs" else ()
        gradient = config.get("canary") == "gradient"
        secrets = str(plan.task) == "next-token" and config.get("design") != "all-examples" and not gradient
        return (*_CHUNK_ARRAYS, *observed, *((_CANDIDATES,) if secrets else ()))

    def _valid_chunks(self, plan: Plan) -> tuple[list[dict[str, np.ndarray]], list[str]]:
        """The sound chunks, and the names of those whose checksum fails (damaged: ignored, and so recomputed).

        A chunk whose checksum holds but whose arrays do not fit the plan (tampered with) is refused.
        """
        n_models, targets = plan.membership.shape
        classes = plan.reference_outputs.shape[1]
        fix = "delete it; `dpaudit resume` trains its models again"
        expected = self._chunk_arrays(plan)
        valid, damaged = [], []
        for path in sorted(self.chunks.glob("models-*.npz")):
            name = f"chunks/{path.name}"
            loaded = _load_npz(self.root, name)
            if loaded is None:
                damaged.append(name)
                continue
            arrays, record = loaded
            self._check_record(name, record)
            if set(arrays) != set(expected):
                raise self._damaged(name, f"holds arrays {sorted(arrays)}, not {sorted(expected)}", fix)
            indices, target, population = (arrays[key] for key in _CHUNK_ARRAYS)
            k = len(indices) if indices.ndim == 1 else -1
            if k < 1 or indices.dtype.kind not in "iu" or indices.min() < 0 or indices.max() >= n_models:
                raise self._damaged(name, f"has model indices that are not integers in [0, {n_models})", fix)
            inputs = len(plan.target_labels)
            if target.shape != (k, inputs, classes) or population.shape != (k, len(plan.population_labels), classes):
                raise self._damaged(name, f"has outputs of shapes {target.shape}, {population.shape}", fix)
            observations = arrays.get(_OBSERVATIONS, np.zeros((k, 1, targets)))
            if observations.ndim != 3 or observations.shape[::2] != (k, targets) or observations.dtype.kind != "f":
                raise self._damaged(name, f"has canary observations of shape {observations.shape}", fix)
            candidates = arrays.get(_CANDIDATES, np.zeros((k, 1)))
            if candidates.ndim != 2 or len(candidates) != k or candidates.dtype.kind != "f":
                raise self._damaged(name, f"has candidate log-likelihoods of shape {candidates.shape}", fix)
            finite = (target, population, observations, candidates)
            if not all(np.isfinite(array).all() for array in finite):
                raise self._damaged(name, "holds non-finite outputs (models that diverged)", fix)
            valid.append(arrays)
        return valid, damaged

    def finished(self) -> np.ndarray:
        """(models,) bool: the models whose outputs are safely on disk."""
        plan = self.plan()
        done = np.zeros(len(plan.membership), dtype=bool)
        for arrays in self._valid_chunks(plan)[0]:
            done[arrays["indices"]] = True
        return done

    def outputs(self) -> ChunkOutputs:
        """All models' outputs in model order; an error if any model is missing."""
        plan = self.plan()
        n_models = len(plan.membership)
        chunks, damaged = self._valid_chunks(plan)
        indices = np.concatenate([c["indices"] for c in chunks]) if chunks else np.zeros(0, dtype=np.int64)
        unique, first = np.unique(indices, return_index=True)
        if len(unique) != n_models:
            unreadable = f" ({', '.join(damaged)} damaged: the checksum fails)" if damaged else ""
            raise UsageError(
                f"{self.root} has outputs for {len(unique)} of {n_models} models{unreadable}: "
                f"`dpaudit resume {self.root}` trains the rest"
            )
        gathered = {name: np.concatenate([c[name] for c in chunks])[first] for name in self._chunk_arrays(plan)}
        return ChunkOutputs(**gathered)

    # -- one trainer at a time --------------------------------------------------------------------------------

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Held while a process trains this campaign (:func:`directory_lock`); stale temporaries are removed."""
        self._make_root()
        with directory_lock(self.root):
            self._remove_stale_temporaries()
            yield

    def _remove_stale_temporaries(self) -> None:
        """Temporary files left by a writer that died (kill -9, full disk) before renaming them."""
        for directory in (self.root, self.chunks):
            with _usage_error_on_os_error(directory, "read"):
                if not directory.is_dir():
                    continue
                entries = list(os.scandir(directory))
            for entry in entries:
                match = _TEMPORARY.match(entry.name)
                if match is None or int(match.group(1)) == os.getpid():
                    continue
                try:
                    os.kill(int(match.group(1)), 0)
                except ProcessLookupError:
                    Path(entry.path).unlink(missing_ok=True)
                except (PermissionError, OverflowError):
                    continue

    # -- the files the verdict is judged against: bound to campaign.json and to their copies in plan.npz -----------

    def check_claimed_privacy(self, values: dict) -> None:
        """Refuse a plan whose recorded claim is not ``values``, the event the campaign's mechanism claims now."""
        changed = differences(json.loads(str(self.plan().claimed_privacy)), json.loads(json_text(values)))
        if changed:
            raise UsageError(
                f"{self.root / 'plan.npz'} records a claimed privacy event that the campaign's mechanism does not"
                f" make ({'; '.join(changed)}): delete plan.npz and privacy.json; `dpaudit resume {self.root}`"
                " remakes them"
            )

    def write_privacy_event(self) -> None:
        """privacy.json: the claimed privacy event plan.npz records (:func:`.privacy.to_record`), for the analysis."""
        self._write_bound("privacy.json", json.loads(str(self.plan().claimed_privacy)))

    def privacy_event(self) -> dict | None:
        """privacy.json's record, None if absent (continuing the run writes it again); refused if it was edited."""
        fix = (
            f"restore it, or delete it and continue the run (`dpaudit resume {self.root}`, or dpaudit.audit with the"
            " same objects), which writes it again"
        )
        values = self._read_bound("privacy.json", fix)
        if values is not None:
            self._check_copy("privacy.json", values, str(self.plan().claimed_privacy), fix)
        return values

    def write_measurements(self, values: dict) -> None:
        """measured.json: numbers measured on the campaign's models after training, their copy in plan.npz.

        The copy is recorded first: a kill between the two leaves measured.json absent, and it is measured again.
        """
        self.save_plan(dataclasses.replace(self.plan(), sketch_inputs=np.array(json_text(values))))
        self._write_bound("measured.json", values)

    def needs_measurements(self) -> bool:
        """True if measured.json is absent (not measured yet, or deleted) or plan.npz, made again, has no copy of it."""
        return read_file(self.root, "measured.json") is None or not str(self.plan().sketch_inputs)

    def measurements(self) -> dict | None:
        """measured.json's values, None if none were measured; refused if they differ from plan.npz's copy or config."""
        recorded = str(self.plan().sketch_inputs)
        again = f"`dpaudit resume {self.root}` measures again"
        values = self._read_bound("measured.json", f"delete it; {again}")
        if values is None:
            if recorded:
                raise self._damaged("measured.json", "is missing", again)
            return None
        if not recorded:
            raise self._damaged("measured.json", "has no copy in plan.npz (the plan was made again)", again)
        self._check_copy("measured.json", values, recorded, f"restore it, or delete it; {again}")
        contradicted = [
            f"{name} is {values.get(name)!r} but the config gives {value!r}"
            for name, value in self._measured_config_facts().items()
            if values.get(name) != value
        ]
        if contradicted:
            raise self._damaged("measured.json", f"contradicts campaign.json ({'; '.join(contradicted)})", again)
        return values

    def _measured_config_facts(self) -> dict:
        """measured.json's values that the config determines: the SGD the inputs were measured under."""
        config = self.config()
        members = int(self.plan().max_members)
        layout = BatchLayout.for_members(members, config.batch_size)
        return {
            "lr": config.lr,
            "momentum": config.momentum,
            "schedule": config.schedule,
            "batch_size": min(config.batch_size, members),
            "steps": config.epochs * layout.steps,
        }

    def _check_copy(self, name: str, values: dict, recorded: str, fix: str) -> None:
        """Refuse ``name`` if its values differ from the copy plan.npz recorded, naming each field that differs."""
        changed = differences(json.loads(recorded), values)
        if changed:
            raise UsageError(
                f"{self.root / name} differs from the copy plan.npz recorded ({'; '.join(changed)}): {fix}"
            )

    def _write_bound(self, name: str, values: dict) -> None:
        """A JSON file of values bound to campaign.json as it is now (refused once campaign.json changes)."""
        record = {"campaign": self._record(), "values": values}
        write_file(self.root, name, json_text(record).encode())

    def _read_bound(self, name: str, fix: str) -> dict | None:
        record = read_json(self.root, name, fix)
        if record is ABSENT:
            return None
        if not (isinstance(record, dict) and isinstance(record.get("campaign"), str)):
            raise self._damaged(name, 'is not {"campaign": ..., "values": {...}}', fix)
        if record["campaign"] != self._record() and self.saved_plan() is not None:
            # plan.npz, checksummed, was made under campaign.json as it is (saved_plan checks): the copy in this
            # file, which no checksum covers, is what changed.
            try:
                made = json.loads(record["campaign"])
            except ValueError:
                made = None
            changed = differences(made, self._metadata()) if isinstance(made, dict) else ["unreadable"]
            if changed:
                raise self._damaged(
                    name,
                    f"holds a copy of campaign.json that differs from it ({'; '.join(changed)}; plan.npz confirms it)",
                    fix,
                )
        self._check_record(name, record["campaign"])
        values = record.get("values")
        if not isinstance(values, dict):
            raise self._damaged(name, 'is not {"campaign": ..., "values": {...}}', fix)
        return values

    # -- timing ------------------------------------------------------------------------------------------------

    def record_seconds(self, seconds: float, engine: str | None = None) -> None:
        """Add a session's wall time (setup + training) to the total, and how it trained (:func:`add_seconds`)."""
        add_seconds(self.root, seconds, engine)

    def seconds(self) -> float:
        return read_seconds(self.root)

    def engines(self) -> tuple[str, ...]:
        """How the campaign's sessions computed its shadow models, in words (runs before dpaudit recorded it: none)."""
        return tuple(read_engines(self.root))

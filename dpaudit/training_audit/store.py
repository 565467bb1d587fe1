"""The run directory of a training-code audit: what was audited, the canary, one file per finished trial.

::

    RUN_DIR/audit.json          format, dpaudit version, what was audited (trainer, model, data, claim, design,
                                neighbouring relation, statistics, seed) with their fingerprints, and its checksum
    RUN_DIR/privacy.json        the claim as a privacy event (dpaudit.mechanisms.privacy.to_record), audit.json's
                                claim in a file of its own
    RUN_DIR/canaries.npz        the canaries (x_c, y_c) and, for replace-one neighbours, the rows they replace
    RUN_DIR/start.pt            with --pretrain: the pretrained starting model's state (torch's format), made once
    RUN_DIR/trials/NNNNNNN.json one finished trial: which canaries it trained on, its seed, its observations
    RUN_DIR/timing.json         the audit's wall time, summed over sessions
    RUN_DIR/summary.json        the analysis (dpaudit.analysis.training)

Every file is written atomically (:func:`dpaudit.campaign.store.write_file`), so a kill loses at most the trials
still training; resuming with anything else audited (another trainer, model, data, claim or setting) is refused,
naming what differs, while no trial has finished a different audit may start over in the directory. What the
analysis reads is bound: audit.json must match its checksum and privacy.json the claim audit.json records, or the
run is refused naming the file (and the field of privacy.json); like a campaign's, against mistakes and casual
edits, not a forger who rewrites both consistently.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from dpaudit.campaign.store import (
    ABSENT,
    add_seconds,
    differences,
    directory_lock,
    json_checksum,
    make_directory,
    read_file,
    read_json,
    read_seconds,
    write_file,
)
from dpaudit.errors import UsageError
from dpaudit.formatting import json_text
from dpaudit.version import __version__

FORMAT_VERSION = 2  # 2: audit.json records its description's checksum; privacy.json must be the claim it records
_AGAIN = "delete the directory and run the audit again"


class TrainingAuditStore:
    """The run directory ``root`` of one training-code audit."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.trials_dir = self.root / "trials"

    def create_or_check(self, description: dict) -> bool:
        """Record a new audit, or check that the directory holds this very one; True if it did already.

        A directory with another audit and no finished trial is started over with this one.
        """
        make_directory(self.trials_dir)
        old = self._recorded_description()
        if old is not None:
            changed = [
                f"{key}: {old.get(key)!r} → {description.get(key)!r}"
                for key in sorted(set(old) | set(description))
                if old.get(key) != description.get(key)
            ]
            if not changed:
                return True
            if self.finished():
                raise UsageError(
                    f"{self.root} holds another training audit ({'; '.join(changed)}): its trials cannot be mixed"
                    " with these; use another --out"
                )
            for name in ("privacy.json", "canaries.npz", "start.pt", "timing.json", "summary.json"):
                (self.root / name).unlink(missing_ok=True)
        record = {
            "format_version": FORMAT_VERSION,
            "dpaudit_version": __version__,
            "description": description,
            "description_checksum": json_checksum(description),
        }
        write_file(self.root, "audit.json", json_text(record).encode())
        return False

    def _recorded_description(self) -> dict | None:
        """audit.json's description of what was audited, None if absent; refused if damaged, older or edited."""
        recorded = read_json(self.root, "audit.json", _AGAIN)
        if recorded is ABSENT:
            return None
        if not (isinstance(recorded, dict) and isinstance(recorded.get("description"), dict)):
            raise UsageError(f"{self.root / 'audit.json'} is damaged: {_AGAIN}")
        if recorded.get("format_version") != FORMAT_VERSION:
            raise UsageError(
                f"{self.root} was written by dpaudit {recorded.get('dpaudit_version')} (training-audit format"
                f" {recorded.get('format_version')}); this dpaudit reads format {FORMAT_VERSION}: run it again"
            )
        if recorded.get("description_checksum") != json_checksum(recorded["description"]):
            raise UsageError(
                f"{self.root / 'audit.json'}: what was audited does not match its recorded description_checksum"
                " (edited by hand?): restore it, or run the audit again into a new directory"
            )
        return recorded["description"]

    def description(self) -> dict:
        description = self._recorded_description()
        if description is None:
            raise UsageError(f"{self.root} holds no training audit (no audit.json): run `dpaudit audit-training`")
        return description

    def write_claim(self, record: dict) -> None:
        write_file(self.root, "privacy.json", json_text(record).encode())

    def claim(self) -> dict:
        """privacy.json's claim; refused if it differs from the claim audit.json records (edited), naming the field."""
        fix = (
            "restore it, or delete it and run the audit again with the same arguments and --out (it resumes and"
            " writes it again)"
        )
        record = read_json(self.root, "privacy.json", fix)
        if record is ABSENT:
            raise UsageError(f"{self.root / 'privacy.json'} is missing: resume the audit, which writes it again")
        # Compared as one field each, so that whatever the two hold, the difference is named.
        changed = differences({"claim": self.description().get("claim")}, {"claim": record})
        if changed:
            raise UsageError(
                f"{self.root / 'privacy.json'} differs from the claim audit.json records ({'; '.join(changed)}): {fix}"
            )
        return record

    def write_canaries(self, x_c: np.ndarray, y_c: np.ndarray, replaced: np.ndarray) -> None:
        """The canaries (M, ...) and their labels (M,), and the rows replace-one puts them in (-1: added)."""
        buffer = io.BytesIO()
        np.savez(buffer, x=x_c, y=y_c.astype(np.int64), replaced=replaced.astype(np.int64))
        write_file(self.root, "canaries.npz", buffer.getvalue())

    def read_start(self) -> bytes | None:
        """start.pt's bytes (read by dpaudit.training_audit.runner), None if absent."""
        return read_file(self.root, "start.pt")

    def write_start(self, data: bytes) -> None:
        write_file(self.root, "start.pt", data)

    def write_trial(self, trial: int, record: dict) -> None:
        write_file(self.root, f"trials/{trial:07d}.json", json_text(record).encode())

    def finished(self) -> dict[int, dict]:
        """Trial index → its record, for every finished trial."""
        if not self.trials_dir.is_dir():
            return {}
        found = {}
        for path in sorted(self.trials_dir.glob("[0-9]*.json")):
            record = read_json(self.trials_dir, path.name, "delete it; resuming trains that trial again")
            if not (isinstance(record, dict) and isinstance(record.get("observations"), dict)):
                raise UsageError(f"{path} is damaged: delete it; resuming trains that trial again")
            found[int(path.stem)] = record
        return found

    def record_seconds(self, seconds: float) -> None:
        """Add a session's wall time (setup + trials) to the audit's total, across resumes."""
        add_seconds(self.root, seconds)

    def seconds(self) -> float:
        return read_seconds(self.root)

    @contextmanager
    def lock(self) -> Iterator[None]:
        make_directory(self.root)
        with directory_lock(self.root):
            yield
